"""Where fairseq's early stop (`--patience N`) would have ended runs, read off their validations.

    python -m experiments.analyses.early_stop RUN [RUN ...] [--patience=10] \
        [--record=experiments/results/early_stop]

fairseq validates every epoch and stops once its validation loss (the criterion's: label-smoothed)
has not improved on the best so far for `--patience` validations in a row. The literature's
Transformer-Tiny trains with `--max-update 8000 --patience 10`; configs/multi30k_tiny.py validates
every epoch too, so the same rule applied to a run's `metrics.jsonl` says whether their runs end
before 8,000 updates and where (`train.patience` stops a run by the same rule:
transformer/training/early_stop.py). Validation takes no randomness, so a run's validations are
those of the same training with early stopping up to the stop. Prints, for each run: how many
validations, the best and its step, and the stop's step (or that the rule never fires).
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import app, flags

from transformer.cli import run_program
from transformer.sweeps import records
from transformer.training.early_stop import Patience, validation_losses

FLAGS = flags.FLAGS


def one_run(workdir: Path, patience: int) -> dict[str, object]:
  """The run's validations (label-smoothed loss; the NLL where the run predates it) and the rule."""
  losses, key = validation_losses(workdir), "loss"
  if not losses:  # a run from before validation recorded the label-smoothed loss
    losses, key = validation_losses(workdir, key="nll"), "nll"
  if not losses:
    raise app.UsageError(f"{workdir} has no validation records in its metrics.jsonl")
  rule = Patience(patience, losses)
  (best_step, best), stop = rule.best(), rule.stop_step
  gaps = {b - a for (a, _), (b, _) in zip(losses, losses[1:])}
  return {"run": str(workdir), "validations": len(losses),
          "every (steps)": "/".join(str(g) for g in sorted(gaps)), "loss": key,
          "best": f"{best:.4f} at step {best_step}",
          f"stop (patience {patience})": f"step {stop}" if stop else
          f"never (last validation: step {losses[-1][0]})"}


def markdown(rows: list[dict[str, object]]) -> str:
  keys = list(rows[0])
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  started = time.time()
  if len(argv) < 2:
    raise app.UsageError("pass one or more run folders (each with its metrics.jsonl)")
  table = markdown([one_run(Path(workdir), FLAGS.patience) for workdir in argv[1:]])
  print(table)
  if FLAGS.record:
    records.record_table(table, FLAGS.record, "Where fairseq's early stop would end the runs",
                         time.time() - started, "experiments.analyses.early_stop")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  flags.DEFINE_integer("patience", 10, "fairseq's --patience: validations without a new best.",
                       lower_bound=1)
  records.define_record_flag()
  run_program("early_stop", main, takes_arguments=True, compilation_cache=False)


if __name__ == "__main__":
  run()
