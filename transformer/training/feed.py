"""Training batches placed on the devices ahead of the step that needs them.

Between two dispatches of the train step, the loop's host thread would otherwise take the next
batch from the loader, count its tokens and FLOPs, and copy it onto the devices; on an accelerator
whose step takes a few milliseconds, that work, not the device, sets the loop's pace. A
`DeviceFeed` does it in a background thread, `depth` batches ahead, so the loop only dispatches.
The batches and their order are the loader's own (training is bit-identical at any depth), and each
carries the loader's position after it, so a checkpoint records the batch trained last, not the
ones read ahead: a resumed run replays those. `depth=0` does the work in the loop's thread, batch
by batch (the way to compare).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from transformer import partitioning
from transformer.model.size import training_flops_per_target_token
from transformer.model.transformer import PAD_ID, ModelConfig


@dataclasses.dataclass(frozen=True)
class Placed:
  """One batch: the host's copy, the devices' copy, what it holds, and the loader's position after
  it."""
  host: dict[str, np.ndarray]
  arrays: dict[str, jax.Array]
  data_state: Any
  real_tokens: float  # this process's target tokens that are not padding
  positions: int  # this process's target positions, padding included
  flops: float  # the step's FLOPs on this batch, all processes' (batch_flops)


_END = object()  # the loader ran out


def batch_flops(config: ModelConfig, batch: dict[str, np.ndarray]) -> float:
  """Analytic training FLOPs of this process's share of a batch (model/size.py's count, at the padded
  shape the device computes), times the processes: the global batch's."""
  rows, src_len = batch["src"].shape
  tgt_len = batch["tgt"].shape[1]
  return (training_flops_per_target_token(config, src_len, tgt_len) * rows * tgt_len
          * jax.process_count())


class DeviceFeed:
  """Iterates `Placed` batches from `batches` (the loader's (batch, position after it) pairs);
  use as a context manager (leaving stops the thread; batches read ahead are dropped)."""

  def __init__(self, batches: Iterator[tuple[dict[str, np.ndarray], Any]], mesh: jax.sharding.Mesh,
               model: ModelConfig, depth: int = 2):
    self._batches, self._mesh, self._model, self.depth = batches, mesh, model, depth
    self._ready: queue.Queue = queue.Queue(maxsize=max(depth, 1))
    self._stop = threading.Event()
    self._thread = None
    if depth > 0:
      self._thread = threading.Thread(target=self._fill, name="device-feed", daemon=True)
      self._thread.start()

  def _place(self, item: tuple[dict[str, np.ndarray], Any]) -> Placed:
    batch, data_state = item
    return Placed(batch, partitioning.shard_batch(batch, self._mesh), data_state,
                  real_tokens=float((batch["tgt"] != PAD_ID).sum()), positions=batch["tgt"].size,
                  flops=batch_flops(self._model, batch))

  def _fill(self) -> None:
    """The background thread: place batches until the loader ends, fails or the feed closes."""
    try:
      for item in self._batches:
        if not self._put(self._place(item)):
          return
      self._put(_END)
    except BaseException as error:  # handed to the loop's thread, which raises it
      self._put(error)

  def _put(self, item: Any) -> bool:
    while not self._stop.is_set():
      try:
        self._ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def __iter__(self) -> DeviceFeed:
    return self

  def __next__(self) -> Placed:
    if self._thread is None:
      return self._place(next(self._batches))
    item = self._ready.get()
    if item is _END:
      self._ready.put(_END)
      raise StopIteration
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()

  def __enter__(self) -> DeviceFeed:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()
