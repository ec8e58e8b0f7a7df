"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and to TensorBoard event files.

Only process 0 writes, so a multi-host job keeps one record. Every record has `event` ('train',
'eval', 'bleu', ...), `step` and a wall-clock `time`; readers (plots, experiment tables) filter on these.
The same numbers go to TensorBoard through tensorboardX, which writes event files without TensorFlow:
training's in WORKDIR itself, the evaluation program's in WORKDIR/eval, so `tensorboard --logdir runs`
shows one run per workdir (and its '/eval' beside it).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_EVENTS = ("train", "eval", "checkpoint")  # and 'bleu', named by test set


class MetricWriter:
  """Appends records to metrics.jsonl and their numbers to TensorBoard (`close()` when done).

  `tensorboard_dir` is relative to the workdir. `purge_step` (a resumed run's first new step) tells
  TensorBoard to hide what an earlier process logged from that step on, so a resumed run's curves
  do not double back.
  """

  def __init__(self, workdir: str | os.PathLike, tensorboard_dir: str = ".",
               purge_step: int | None = None):
    self.path = Path(workdir) / METRICS_FILE
    self.tensorboard_dir = Path(workdir) / tensorboard_dir
    self.purge_step = purge_step
    self.enabled = jax.process_index() == 0
    self._tensorboard = None  # opened at the first record: a run that fails to start writes nothing

  def write(self, event: str, step: int, **values: Any) -> None:
    if not self.enabled:
      return
    record = {"event": event, "step": int(step), "time": round(time.time(), 3)}
    record.update({k: _plain(v) for k, v in values.items()})
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tensorboard is None:  # at the first record (a training run's is before its loop):
      # importing tensorboardX (and what it imports) takes seconds, which a loop should not pay.
      import_tensorboardx()
      from tensorboardX import SummaryWriter
      # tensorboardX names the file by the second; the suffix keeps two writers of the same
      # second (a quick restart) apart, in the order TensorBoard reads them.
      self._tensorboard = SummaryWriter(str(self.tensorboard_dir), purge_step=self.purge_step,
                                        filename_suffix=f".{time.time_ns() % 10**9:09d}")
    scalars = tensorboard_scalars(record)
    if scalars:
      for tag, value in scalars.items():
        self._tensorboard.add_scalar(tag, value, record["step"], walltime=record["time"])
      self._tensorboard.flush()  # a few records a minute: flushing each keeps TensorBoard live

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()
      self._tensorboard = None

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def import_tensorboardx() -> None:
  """Imports tensorboardX without torch. Where torch is installed, tensorboardX imports it only to
  accept torch tensors (this project hands it numbers), and that import alone takes 1.5 s of a
  2-core machine's start of every run; hidden while tensorboardX loads, it stays importable."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    return
  sys.modules["torch"] = None  # an import of it raises ImportError, which tensorboardX handles
  try:
    import tensorboardX  # noqa: F401
  finally:
    del sys.modules["torch"]


def evaluation_suffix(averaged: int = 1, ensemble: int = 1, ema: bool = False,
                      min_len: int = 0, search: str = "") -> str:
  """What names an evaluation beside its test set and step, in report files and TensorBoard:
  _avg<K> (K checkpoints averaged), _ens<M> (an ensemble of M runs), the search where it is not
  the run config's (translator.SearchSettings.tag: _greedy, _beam8, ...), _min<L> (a minimum
  output length), _ema (the parameters' moving average); '' for one checkpoint's own parameters
  and the config's search."""
  return ((f"_avg{averaged}" if averaged > 1 else "") + (f"_ens{ensemble}" if ensemble > 1 else "")
          + search + (f"_min{min_len}" if min_len else "") + ("_ema" if ema else ""))


def tensorboard_scalars(record: dict[str, Any]) -> dict[str, float]:
  """The TensorBoard scalars of a metrics record: every number of a 'train', 'eval' or 'checkpoint'
  record as 'event/key' (train/loss, eval/perplexity, ...); BLEU as bleu/<test set>, chrf/<test
  set>, tokenized_bleu/<test set> and lc_tok_bleu/<test set> (with `evaluation_suffix`)."""
  event = record["event"]
  if event == "bleu":
    name = record["test_set"] + evaluation_suffix(
        record.get("averaged", 1), record.get("ensemble", 1), record.get("ema", False),
        record.get("min_len", 0), record.get("search_tag", ""))
    return {f"{kind}/{name}": record[kind] for kind in ("bleu", "chrf", "tokenized_bleu", "lc_tok_bleu")
            if kind in record}
  if event not in TENSORBOARD_EVENTS:
    return {}
  return {f"{event}/{key}": value for key, value in record.items()
          if key not in ("event", "step", "time") and isinstance(value, (int, float))
          and not isinstance(value, bool)}


def read_metrics(workdir: str | os.PathLike, event: str | None = None) -> list[dict[str, Any]]:
  path = Path(workdir) / METRICS_FILE
  if not path.is_file():
    return []
  records = []
  for line in path.read_text().splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue  # the half-written last line of a run that was killed
  return [r for r in records if event is None or r["event"] == event]


def whole_intervals(train_records: Sequence[dict[str, Any]], every: int) -> list[dict[str, Any]]:
  """'train' records as an uninterrupted run writes them, one per `every` steps (train.log_every):
  a step logged twice keeps its last record, and the part-intervals a stop and the resume after it
  write (each says how many `steps` and `loss_tokens` it averages) are merged into the interval
  they split, their losses and accuracy weighed by their target tokens (by their steps where a
  record predates `loss_tokens`). Loss curves and tables read these, so a curve does not jump at
  every requeue."""
  by_step = {r["step"]: r for r in train_records}
  merged, pending, last = [], [], max(by_step, default=0)
  for step in sorted(by_step):
    pending.append(by_step[step])
    if step % every == 0 or step == last:
      merged.append(_merged(pending))
      pending = []
  return merged


def _merged(records: list[dict[str, Any]]) -> dict[str, Any]:
  if len(records) == 1:
    return records[0]
  steps = [r.get("steps", 1) for r in records]
  weights = [r["loss_tokens"] if "loss_tokens" in r else n for r, n in zip(records, steps)]
  out = dict(records[-1], steps=sum(steps))
  if all("loss_tokens" in r for r in records):
    out["loss_tokens"] = sum(weights)
  for key in ("loss", "nll", "accuracy", "rdrop_kl"):
    if all(key in r for r in records) and sum(weights):
      out[key] = sum(w * r[key] for w, r in zip(weights, records)) / sum(weights)
  if all("grad_norm" in r for r in records):
    out["grad_norm"] = sum(n * r["grad_norm"] for n, r in zip(steps, records)) / sum(steps)
  return out


def training_clock(train_records: Sequence[dict[str, Any]]) -> list[float]:
  """The training wall time up to each 'train' record, summed over every process that trained the
  run: each process's `elapsed` restarts from 0 (downtime between them is not counted)."""
  total, last, clock = 0.0, 0.0, []
  for record in train_records:
    if record["elapsed"] < last:  # a new process took over
      total += last
    last = record["elapsed"]
    clock.append(total + last)
  return clock


# What JAX reports of getting a program ready to run: tracing, lowering to StableHLO, and XLA's
# compilation or the persistent compilation cache's read. Phases one after the other, never nested.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration",
                  "/transformer/compile_ahead_wall")  # several compiled at once: their wall time


class CompileClock:
  """Seconds this process spends tracing and compiling while the clock is open (a context
  manager), summed from the durations JAX reports through jax.monitoring, and how many programs
  it lowered to compile (each new program is lowered once, whether XLA or the persistent cache
  then gives its executable)."""

  def __init__(self):
    self.seconds = 0.0
    self.lowerings = 0

  def _record(self, event: str, duration: float, **_: Any) -> None:
    if threading.current_thread() is not threading.main_thread():
      return  # compilations run side by side (training/compiled.py): their wall time is reported
    if event in COMPILE_EVENTS:
      self.seconds += duration
    self.lowerings += event == COMPILE_EVENTS[1]

  def __enter__(self) -> CompileClock:
    jax.monitoring.register_event_duration_secs_listener(self._record)
    return self

  def __exit__(self, *exc_info) -> None:
    jax.monitoring.unregister_event_duration_listener(self._record)


def _plain(value: Any) -> Any:
  """A JSON-friendly Python number from a numpy/JAX scalar."""
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float):
    return round(value, 6)
  return value


def format_duration(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
