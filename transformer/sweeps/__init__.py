"""The reusable experiment library: grids of config variants (grids.py), the runner that trains and
evaluates them (run.py, `transformer-experiment`), their tables and figures (results.py), paired
bootstrap significance (significance.py), extra test sets (test_sets.py) and the record folders the
runner writes into the repository (records.py). Recipes and one-off analyses that use it live in the
repository's experiments/ folder."""
