"""Early stopping on the validation loss, as fairseq's `--patience`.

With `train.patience` = N > 0 a run ends at the first validation that is the N-th in a row whose
loss (label-smoothed, of the raw parameters: what fairseq validates on) is not below the best so
far; a checkpoint is saved at that step and an `early_stop` record in metrics.jsonl says where, so
the run's last checkpoints are those fairseq would average. The rule counts validations, not
epochs: with `train.eval_every` one epoch (configs/multi30k_tiny.py) it is fairseq's exactly.

Validation draws no randomness, so a resumed run replays its earlier validations from
metrics.jsonl (those up to the checkpoint it resumes from) and stops where an uninterrupted run
would; a run that stopped early has nothing left to train.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from transformer.metrics import read_metrics

STOP_EVENT = "early_stop"


def patience_stop(losses: Sequence[tuple[int, float]], patience: int) -> int | None:
  """The step of the validation at which the rule stops (`patience` validations in a row without a
  loss below the best so far; an equal loss is no improvement), or None; `losses`: (step, loss)."""
  best, since_best = None, 0
  for step, loss in losses:
    if best is None or loss < best:
      best, since_best = loss, 0
    else:
      since_best += 1
      if since_best >= patience:
        return step
  return None


def validation_losses(workdir: str | Path, up_to: int | None = None, key: str = "loss"
                      ) -> list[tuple[int, float]]:
  """(step, validation `key`: the label-smoothed loss by default) of the run's validations in step
  order, up to `up_to` (a step validated twice, by a process that stopped and the one that
  resumed: the last)."""
  evals = {r["step"]: r for r in read_metrics(workdir, "eval")
           if key in r and (up_to is None or r["step"] <= up_to)}
  return [(step, evals[step][key]) for step in sorted(evals)]


def stopped_at(workdir: str | Path) -> int | None:
  """The step at which the run in `workdir` stopped early, or None if it did not."""
  return max((r["step"] for r in read_metrics(workdir, STOP_EVENT)), default=None)


class Patience:
  """The rule's state through a run: `update` after each validation; `stop_step` once it fires."""

  def __init__(self, patience: int, history: Sequence[tuple[int, float]] = ()):
    self.patience, self.losses = patience, list(history)
    self.stop_step = patience_stop(self.losses, patience)

  def update(self, step: int, loss: float) -> bool:
    """Records a validation; True if the run stops here."""
    if self.stop_step is None:
      self.losses.append((step, loss))
      self.stop_step = patience_stop(self.losses, self.patience)
    return self.stop_step == step

  def best(self) -> tuple[int, float]:
    """(step, loss) of the best validation so far."""
    return min(self.losses, key=lambda pair: pair[1])
