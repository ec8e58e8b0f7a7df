"""Table 3 at the default run's full length: rows (C) and (D), and the (A)/(B) variants whose sign
two seeds could not settle at a quarter of it.

    transformer-experiment experiments/recipes/table3_multi30k_full.py --base=configs/multi30k.py \
        --seeds=2 --root=runs/experiments/table3_multi30k_full \
        --record=experiments/results/table3_multi30k_full

The variants of experiments/recipes/table3_multi30k.py (the paper's changes relative to its base,
applied to configs/multi30k.py), trained for the default's 4,800 steps instead of 1,200: every run
is one whole default-length run (~22-60 minutes of the 2-core VM alone, by its speed that day;
d_model 512 and 4 layers cost ~2x and ~1.25x), 32 runs in all. (D) comes first, then (C), then the
unsettled (A)/(B) variants. The base is configs/multi30k.py itself: the README's two default runs
can be copied in as base/seed0 and base/seed1 (same config, same seeds). The grid resumes where it
stopped: run it across sessions, never beside a timing measurement. The quarter-length table stays
in experiments/results/table3_multi30k/ as the cheap version.
`python -m experiments.analyses.table3_lengths` compares the two (which conclusions changed, which
variants need a third seed: `--seeds=3 --only=NAMES`).
"""

import importlib.util
from pathlib import Path

from transformer.sweeps.grids import Grid, Variant

STEPS = 4800  # configs/multi30k.py's train.steps: the full default run
UNSETTLED = ("A-h2", "A-h8", "A-h16", "B-dk32")  # (A)/(B): Δ within the seeds' spread at 1,200 steps


def _quarter_grid() -> Grid:
  path = Path(__file__).with_name("table3_multi30k.py")
  spec = importlib.util.spec_from_file_location("table3_multi30k", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_grid()


def get_grid():
  variants = _quarter_grid().variants
  full = lambda v: Variant(v.name, {**v.overrides, "train.steps": STEPS}, v.row)
  # (D) first: its dropout-free variant led by 1.7 BLEU at a quarter length, so it also answers
  # which regularisation the default recipe wants; the runner goes seed by seed in this order.
  rows_d_c = [v for row in ("(D)", "(C)") for v in variants if v.row == row]
  unsettled_a_b = [v for v in variants if v.row in ("(A)", "(B)") and v.name in UNSETTLED]
  return Grid("table3_multi30k_full", [full(v) for v in [variants[0], *rows_d_c, *unsettled_a_b]])
