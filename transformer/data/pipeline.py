"""The input pipeline: each process reads its own shard, batches agree across processes, resumable.

Every epoch visits the pairs in a fresh random order (a permutation that is a pure function of seed and
epoch). The order is cut into windows of `data.shuffle_window` pairs. Of each window, process p of P
reads positions p, p + P, ... (its own shard only), tokenizes them, drops junk, and groups them into
batches: length buckets or packed rows (batching.py). The processes then agree on how many batches of
each shape the window has (the maximum over processes; a process short of pairs fills with padding
rows, which the loss ignores) and order them with the same seed, so at every step all processes
contribute rows of the same shape to one global batch. That agreement is a few integers per window.

Each batch comes with the pipeline's position after it, a `PipelineState` (epoch, window, batch); the
trainer saves it with every checkpoint, and a pipeline started from it rebuilds that window and goes on
with the next batch: a resumed run neither repeats nor skips a pair. Reading and tokenizing run ahead
in a background thread, so the accelerator does not wait on SentencePiece.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import jax
import ml_collections
import numpy as np
import sentencepiece as spm

from transformer.config import BATCHING_MODES
from transformer.data import batching, sources
from transformer.data import vocab as vocab_lib
from transformer.data.sources import DataError
from transformer.distributed import leader_first

log = logging.getLogger("transformer")

ENCODE_CHUNK = 8192  # sentences per SentencePiece call; the tokenizing thread checks for stop between


class PairSource(Protocol):
  name: str

  def __len__(self) -> int: ...

  def read(self, indices: Sequence[int]) -> tuple[list[str], list[str]]: ...


@dataclasses.dataclass(frozen=True)
class PipelineState:
  """Where the pipeline is: the next batch is batch `batch` of window `window` of epoch `epoch`."""
  epoch: int = 0
  window: int = 0
  batch: int = 0

  def to_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, int]) -> PipelineState:
    return cls(**{k: int(d[k]) for k in ("epoch", "window", "batch")})


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """How pairs become batches. `row_multiple` divides every global batch's rows (the number of
  data-parallel devices times gradient-accumulation micro-batches)."""
  mode: str = "bucket"
  tokens_per_batch: int = 4096
  max_len: int = 256
  max_ratio: float = 9.0
  pack_length: int = 256
  row_multiple: int = 1

  @property
  def shapes(self) -> list[int]:
    """The padded lengths batches can have."""
    return [self.pack_length] if self.mode == "pack" else batching.bucket_boundaries(self.max_len)

  def global_rows(self, length: int) -> int:
    return batching.rows_per_batch(self.tokens_per_batch, length, self.row_multiple)

  @classmethod
  def for_training(cls, cfg: ml_collections.ConfigDict, num_devices: int) -> BatchSpec:
    """How a run's training batches are made: rows divisible by the devices times the micro-batches."""
    return cls(mode=cfg.data.batching, tokens_per_batch=cfg.data.tokens_per_batch,
               max_len=cfg.data.max_len, max_ratio=cfg.data.max_length_ratio,
               pack_length=cfg.data.pack_length,
               row_multiple=num_devices * cfg.train.grad_accum_steps)


@dataclasses.dataclass
class LocalWindow:
  """One process's share of a window: its kept pairs and, per shape, its batches' members."""
  pairs: batching.EncodedPairs
  batches: dict[int, list[list]]  # length -> batches; a batch lists pair indices (pack: rows of them)
  read: int                       # pairs read (kept + dropped)


def max_over_processes(counts: np.ndarray) -> np.ndarray:
  """Element-wise maximum of `counts` over all processes (a collective; every process calls it)."""
  if jax.process_count() == 1:
    return counts
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(counts)).max(axis=0)


class InputPipeline:
  """Batches of `source` for training (shuffle, repeat) or one ordered pass for evaluation."""

  def __init__(self, source: PairSource, vocab: spm.SentencePieceProcessor, spec: BatchSpec, *,
               seed: int = 0, shuffle: bool = True, repeat: bool = True,
               window_size: int = 200_000, subword_dropout: float = 0.0,
               process_index: int | None = None, process_count: int | None = None,
               agree: Callable[[np.ndarray], np.ndarray] = max_over_processes,
               prefetch_windows: int = 2):
    if spec.mode not in BATCHING_MODES:
      raise DataError(f"unknown batching mode {spec.mode!r}; use one of {', '.join(BATCHING_MODES)}")
    if len(source) == 0:
      raise DataError(f"{source.name} has no sentence pairs")
    self.source, self.vocab, self.spec = source, vocab, spec
    self.seed, self.shuffle, self.repeat = seed, shuffle, repeat
    self.subword_dropout = subword_dropout
    self.process_index = jax.process_index() if process_index is None else process_index
    self.process_count = jax.process_count() if process_count is None else process_count
    if spec.row_multiple % self.process_count:
      raise DataError(f"{self.process_count} processes cannot share batches whose row count is a "
                      f"multiple of {spec.row_multiple}")
    self.window_size = max(1, min(window_size, len(source)))
    self.num_windows = -(-len(source) // self.window_size)
    self.agree, self.prefetch_windows = agree, prefetch_windows
    self._order_cache: tuple[int, np.ndarray] | None = None
    self._logged_drops = False

  # ---------------------------------------------------------------------------- one window's batches

  def _epoch_order(self, epoch: int) -> np.ndarray:
    if self._order_cache is None or self._order_cache[0] != epoch:
      n = len(self.source)
      order = (np.random.default_rng([self.seed, epoch]).permutation(n).astype(np.int64)
               if self.shuffle else np.arange(n))
      self._order_cache = (epoch, order)
    return self._order_cache[1]

  def local_window(self, epoch: int, window: int,
                   stop: threading.Event | None = None) -> LocalWindow | None:
    """Reads, tokenizes, filters and groups this process's share of a window (None if `stop` is set
    meanwhile: tokenizing goes in chunks, so a finished run does not wait for a whole window)."""
    start = window * self.window_size
    order = self._epoch_order(epoch)[start:start + self.window_size]
    indices = np.sort(order[self.process_index::self.process_count])  # sorted: sequential reads
    src_text, tgt_text = self.source.read(indices)
    if self.shuffle:  # undo the sort, so that batches mix the corpus's subsets
      mix = np.random.default_rng([self.seed, epoch, window, 1]).permutation(len(indices))
      src_text, tgt_text = [src_text[i] for i in mix], [tgt_text[i] for i in mix]
    src_ids, tgt_ids = [], []
    for i in range(0, len(src_text), ENCODE_CHUNK):
      if stop is not None and stop.is_set():
        return None
      src_ids += self._encode(src_text[i:i + ENCODE_CHUNK], [epoch, window, i, 0])
      tgt_ids += self._encode(tgt_text[i:i + ENCODE_CHUNK], [epoch, window, i, 1])
    pairs = batching.filter_pairs(src_ids, tgt_ids, self.spec.max_len, self.spec.max_ratio)
    local_rows = lambda length: self.spec.global_rows(length) // self.process_count
    if self.spec.mode == "pack":
      length = self.spec.pack_length
      rows = batching.pack_pairs(pairs, length)
      n = local_rows(length)
      batches = {length: [rows[i:i + n] for i in range(0, len(rows), n)]}
    else:
      batches = {}
      for length, members in zip(self.spec.shapes, batching.bucket_members(pairs, self.spec.shapes)):
        n = local_rows(length)
        batches[length] = [members[i:i + n].tolist() for i in range(0, len(members), n)]
    return LocalWindow(pairs, batches, read=len(indices))

  def _encode(self, texts: list[str], where: list[int]) -> list[list[int]]:
    """Token ids of `texts`; with subword dropout, a sampled segmentation fixed by seed and `where`.

    BPE-dropout (Provilkov et al., 2020) is SentencePiece's own sampling: each merge is skipped with
    probability `subword_dropout`, so one word reaches the model in several segmentations. SentencePiece
    restarts its sampler from the global seed at every batched call, so one thread and a seed per call
    (epoch, window, chunk, side) make the pieces a pure function of the position: a resumed run sees
    the same ones (tests/test_pipeline.py checks it with the real library).
    """
    if not self.subword_dropout:
      return self.vocab.encode(texts, num_threads=os.cpu_count() or 1)
    spm.set_random_generator_seed(int(np.random.default_rng(
        [self.seed, self.process_index, *where]).integers(2**31)))
    return self.vocab.encode(texts, enable_sampling=True, alpha=self.subword_dropout, nbest_size=-1,
                             num_threads=1)

  def window_plan(self, epoch: int, window: int, local: LocalWindow) -> list[tuple[int, int]]:
    """(length, k) of every batch of the window in the order used; the same on every process."""
    counts = np.array([len(local.batches.get(length, [])) for length in self.spec.shapes], np.int64)
    counts = self.agree(counts)
    plan = [(length, k) for length, count in zip(self.spec.shapes, counts) for k in range(count)]
    if self.shuffle:
      rng = np.random.default_rng([self.seed, epoch, window, 2])
      plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan

  def make_batch(self, local: LocalWindow, length: int, k: int) -> dict[str, np.ndarray]:
    members = local.batches.get(length, [])
    members = members[k] if k < len(members) else []  # past this process's share: all padding
    rows = self.spec.global_rows(length) // self.process_count
    if self.spec.mode == "pack":
      return batching.packed_batch(local.pairs, members, length, rows)
    return batching.padded_batch(local.pairs, members, length, rows)

  # -------------------------------------------------------------------------------------- iteration

  def _windows(self, start: PipelineState) -> Iterator[tuple[int, int]]:
    epoch, window = start.epoch, start.window
    while True:
      yield epoch, window
      window += 1
      if window == self.num_windows:
        if not self.repeat:
          return
        epoch, window = epoch + 1, 0

  def _produce(self, start: PipelineState, out: queue.Queue, stop: threading.Event) -> None:
    try:
      for epoch, window in self._windows(start):
        local = self.local_window(epoch, window, stop)
        if local is None:
          return
        item = (epoch, window, local)
        while not stop.is_set():
          try:
            out.put(item, timeout=0.1)
            break
          except queue.Full:
            pass
        if stop.is_set():
          return
      out.put(None)
    except BaseException as e:  # noqa: BLE001  handed to the consumer, which raises it
      out.put(e)

  def batches(self, start: PipelineState = PipelineState()
              ) -> Iterator[tuple[dict[str, np.ndarray], PipelineState]]:
    """Yields (batch, state after it) from `start` on; endless if `repeat`, else to the epoch's end.

    Close the generator when done (`contextlib.closing`): that stops the tokenizing thread, which
    must not be left inside SentencePiece when the interpreter exits.
    """
    windows: queue.Queue = queue.Queue(maxsize=self.prefetch_windows)
    stop = threading.Event()
    producer = threading.Thread(target=self._produce, args=(start, windows, stop), daemon=True,
                                name="input-pipeline")
    producer.start()
    epoch_batches, epoch_drops, epoch_kept = 0, dict.fromkeys(batching.DROP_REASONS, 0), 0
    try:
      while True:
        item = windows.get()
        if item is None:
          return
        if isinstance(item, BaseException):
          raise item
        epoch, window, local = item
        self._log_drops_once(local, window)
        plan = self.window_plan(epoch, window, local)
        first = start.batch if (epoch, window) == (start.epoch, start.window) else 0
        for b in range(first, len(plan)):
          if b + 1 < len(plan):
            after = PipelineState(epoch, window, b + 1)
          elif window + 1 < self.num_windows:
            after = PipelineState(epoch, window + 1, 0)
          else:
            after = PipelineState(epoch + 1, 0, 0)
          yield self.make_batch(local, *plan[b]), after
        epoch_batches += len(plan)
        epoch_kept += len(local.pairs)
        for reason, n in local.pairs.dropped.items():
          epoch_drops[reason] += n
        if window + 1 == self.num_windows:
          if epoch_batches == 0:
            drops = batching.describe_drops(epoch_kept, epoch_drops, self.spec.max_len,
                                            self.spec.max_ratio)
            raise DataError(f"no sentence pair of {self.source.name} is left after filtering "
                            f"({drops}); check the data or raise config.data.max_len")
          epoch_batches, epoch_kept = 0, 0
          epoch_drops = dict.fromkeys(batching.DROP_REASONS, 0)
    finally:
      stop.set()
      producer.join()

  def _log_drops_once(self, local: LocalWindow, window: int) -> None:
    if self._logged_drops or not any(local.pairs.dropped.values()):
      return
    self._logged_drops = True
    scope = "" if self.num_windows == 1 else f" (first window: {local.read:,} pairs read)"
    log.info("%s: %s%s", self.source.name, batching.describe_drops(
        len(local.pairs), local.pairs.dropped, self.spec.max_len, self.spec.max_ratio), scope)

  def epoch_fraction(self, state: PipelineState) -> float:
    return state.epoch + state.window / self.num_windows


def training_inputs(cfg: ml_collections.ConfigDict, workdir: Path, num_devices: int
                    ) -> tuple[spm.SentencePieceProcessor, InputPipeline, list[dict[str, np.ndarray]]]:
  """Opens the data, builds or reuses the vocabulary; returns (vocab, train pipeline, eval batches).

  Validation pairs are batched once (length buckets, no junk filter) and kept in memory.
  """
  train_source = sources.open_split(cfg.data, cfg.data.train_split)
  eval_source = sources.open_split(cfg.data, cfg.data.eval_split)
  # Process 0 trains (or copies) the vocabulary first; the others then find it in the workdir.
  vocab = leader_first("vocabulary", lambda: vocab_lib.vocab_for_run(workdir, cfg.data,
                                                                     train_source, cfg.seed))
  spec = BatchSpec.for_training(cfg, num_devices)
  train_pipeline = InputPipeline(train_source, vocab, spec, seed=cfg.seed,
                                 window_size=cfg.data.shuffle_window,
                                 subword_dropout=cfg.data.subword_dropout)
  eval_spec = dataclasses.replace(spec, mode="bucket", max_ratio=0, row_multiple=num_devices)
  eval_pipeline = InputPipeline(eval_source, vocab, eval_spec, shuffle=False, repeat=False,
                                window_size=len(eval_source))
  eval_batches = [batch for batch, _ in eval_pipeline.batches()]
  log.info("Data: %s training pairs (%s), %s validation pairs in %d batches; vocabulary %d; "
           "%s batches of ~%d tokens per side%s%s", f"{len(train_source):,}", train_source.name,
           f"{len(eval_source):,}", len(eval_batches), vocab.get_piece_size(), cfg.data.batching,
           cfg.data.tokens_per_batch,
           f" in {cfg.train.grad_accum_steps} micro-batches" if cfg.train.grad_accum_steps > 1 else "",
           f"; BPE-dropout {cfg.data.subword_dropout:g}" if cfg.data.subword_dropout else "")
  return vocab, train_pipeline, eval_batches
