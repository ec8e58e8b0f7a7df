"""The old way to run a grid (`python -m experiments.run`): the runner now lives in the package,
as `transformer-experiment` (transformer/sweeps/run.py)."""

from transformer.cli import deprecated
from transformer.sweeps.run import run

if __name__ == "__main__":
  deprecated("python -m experiments.run", "transformer-experiment")
  run()
