"""Non-finite losses and gradients: find the step, keep the evidence, then stop or skip.

The train step never applies an update whose loss or gradient is NaN or infinite (train.py), and in
'stop' mode (train.on_nonfinite, the default) it also turns every later step into a no-op, so the
host need not wait for the device after every step. `NonFiniteWatch` is the host side: it keeps the
steps since the last check (their batches only in 'stop' mode) and, whenever the trainer syncs
with the device anyway (progress lines, evaluation, checkpoints, a stop), reads their flags. In
'stop' mode the first bad step ends training: `stop_with_evidence` saves the state as it was
before that step as a checkpoint and writes the batch (`write_batch`); in 'skip' mode bad steps are counted
and logged, and training goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
import sentencepiece as spm

from transformer.errors import UserError
from transformer.model.transformer import EOS_ID, PAD_ID
from transformer.training import checkpoints

log = logging.getLogger("transformer")
BATCH_DIR = "nonfinite"


class NonFiniteError(UserError, RuntimeError):
  """Training stopped at a non-finite loss or gradient; the message says what was saved where."""


@dataclasses.dataclass(frozen=True)
class StepRecord:
  number: int                          # the step this update would complete (1-based, as logged)
  batch: dict[str, np.ndarray] | None  # kept in 'stop' mode only
  data_before: Any                     # the input pipeline's position before this batch
  sums: dict[str, jax.Array]           # the step's device outputs, read at the next check


class NonFiniteWatch:
  """The steps since the last check, and the count of skipped updates."""

  def __init__(self, skip: bool):
    self.skip = skip
    self.skipped = 0
    self._unchecked: list[StepRecord] = []

  def record(self, number: int, batch: dict[str, np.ndarray], data_before: Any,
             sums: dict[str, jax.Array]) -> None:
    self._unchecked.append(StepRecord(number, None if self.skip else batch, data_before, sums))

  def check(self) -> StepRecord | None:
    """Waits for the unchecked steps; returns the first non-finite one in 'stop' mode (the trainer
    then stops), else None (in 'skip' mode after counting and logging the skipped ones)."""
    records, self._unchecked = self._unchecked, []
    finite = jax.device_get([r.sums["finite"] for r in records])
    bad = [r for r, ok in zip(records, finite) if not ok]
    if not bad:
      return None
    if not self.skip:
      return bad[0]
    self.skipped += len(bad)
    log.warning("skipped %d update(s) with a non-finite loss or gradient at step(s) %s (%d so far "
                "in this run)", len(bad), ", ".join(str(r.number) for r in bad[:10]), self.skipped)
    return None


def write_batch(workdir: str | Path, record: StepRecord, vocab: spm.SentencePieceProcessor) -> Path:
  """Writes a bad step's batch to WORKDIR/nonfinite/step<N>.npz (the arrays, exactly as fed) and
  step<N>.jsonl (each row's sentences, detokenized); returns the .npz path."""
  directory = Path(workdir) / BATCH_DIR
  directory.mkdir(exist_ok=True)
  path = directory / f"step{record.number}.npz"
  batch = jax.device_get(record.batch)
  np.savez(path, **batch)
  lines = []
  for row, (src, tgt) in enumerate(zip(batch["src"], batch["tgt"])):
    if not (src != PAD_ID).any():
      continue  # a padding row
    lines.append(json.dumps({"row": row, "source": _sentences(src, vocab),
                             "target": _sentences(tgt, vocab)}, ensure_ascii=False))
  path.with_suffix(".jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def _sentences(ids: np.ndarray, vocab: spm.SentencePieceProcessor) -> list[str]:
  """The sentences of one row (several if it is packed), split at EOS."""
  out, current = [], []
  for token in ids.tolist():
    if token == EOS_ID:
      out.append(vocab.decode(current))
      current = []
    elif token != PAD_ID:
      current.append(token)
  if current:
    out.append(vocab.decode(current))
  return out


def stop_with_evidence(run: Any, mngr: Any, state: Any, bad: StepRecord, writer: Any) -> None:
  """Saves the state from before the bad step (unless that checkpoint exists) and its batch, then
  raises NonFiniteError; `run` is the trainer's (train.Run), `mngr` its checkpoint manager."""
  last_good = bad.number - 1
  assert int(state.step) == last_good, (int(state.step), last_good)  # later steps were no-ops
  loss, grad_norm = (float(x) for x in jax.device_get((bad.sums["loss"] / bad.sums["tokens"],
                                                       bad.sums["grad_norm"])))
  checkpoints.finish_saves(mngr)
  if last_good not in mngr.all_steps():
    checkpoints.save(mngr, last_good, state, run.train_pipeline.position(bad.data_before))
    checkpoints.finish_saves(mngr)
  batch_file = (write_batch(run.workdir, bad, run.vocab) if jax.process_index() == 0
                else run.workdir / BATCH_DIR)
  writer.write("nonfinite", bad.number, loss=loss, grad_norm=grad_norm)
  raise NonFiniteError(
      f"non-finite loss or gradient at step {bad.number} (loss {loss:.4g}, gradient norm "
      f"{grad_norm:.4g}); the last good state is the checkpoint at step {last_good} in "
      f"{mngr.directory} and the batch is in {batch_file}. Lower train.learning_rate or raise "
      "train.warmup_steps, or set train.on_nonfinite=skip to skip such updates")
