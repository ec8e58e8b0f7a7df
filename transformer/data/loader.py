"""The training loader: batches planned over the token cache's length arrays, gathered by Grain.

An epoch is planned as array work, once, from the cache's [pairs, 2] lengths: a permutation of the
pairs (a pure function of seed and epoch), then either length buckets (a stable sort by bucket; each
bucket cut into batches of its row count, its leftovers carried into the next longer bucket; the
batches shuffled) or packed rows (the rows' slots are fixed by the corpus's length histogram,
`batching.pack_templates`; each epoch deals its shuffled pairs into them and shuffles the rows).
The number of batches an epoch is the same every epoch, and one batch an epoch is part-empty.

Batch g of the run is batch g % B of epoch g // B: a pure function of g. So the loader is a Grain
`MapDataset` over g, mapped through `MakeBatch` (a few gathers from the memory-mapped ids), read
ahead by Grain's threads or, with `data.loader_workers`, its worker processes; and resuming is
starting the range at the saved g. Every process plans the same global batches and gathers only its
own rows of each (process p of P: rows p/P to (p+1)/P): no collective, and the processes agree by
construction.

BPE-dropout (`data.subword_dropout`) segments the text afresh for every batch, which is per-sentence
work: `MakeBatch` re-reads the batch's pairs from the corpus (the cache keeps their positions) and
samples with SentencePiece, seeded by (seed, process, batch, side), so a resumed run sees the same
pieces. Sampled segmentations are longer (~40% at 0.1), so such runs plan with lengths scaled by
`DROPOUT_HEADROOM`; a sampled side longer than its planned place keeps its deterministic ids. That
work is what worker processes are for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import ml_collections
import numpy as np
from absl import flags

from transformer.data import batching, marian_vocab, workers
from transformer.data.sources import DataError
from transformer.data.token_cache import TokenCache
from transformer.host_memory import release_freed_memory

DROPOUT_HEADROOM = 1.5  # planned length / deterministic length under BPE-dropout
_SAMPLER = threading.Lock()


@dataclasses.dataclass(frozen=True)
class PipelineState:
  """Where the loader is: the next batch is batch `batch` of epoch `epoch`."""
  epoch: int = 0
  batch: int = 0

  def to_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """How pairs become batches. `row_multiple` divides every global batch's rows (the number of
  data-parallel devices times gradient-accumulation micro-batches)."""
  mode: str = "bucket"
  tokens_per_batch: int = 4096
  max_len: int = 256
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
               max_len=cfg.data.max_len, pack_length=cfg.data.pack_length,
               row_multiple=num_devices * cfg.train.grad_accum_steps)


@dataclasses.dataclass
class EpochPlan:
  """An epoch's batches. Batch b holds rows batch_rows[b]:batch_rows[b + 1] of `row_order` (padded
  with empty rows to its global row count), row r holds pairs members[row_start[r]:row_start[r+1]]."""
  members: np.ndarray      # pair indices, row after row
  row_start: np.ndarray | None  # [rows + 1]; None: one pair a row (buckets)
  row_order: np.ndarray | None  # the rows in the order batches take them; None: in order
  batch_rows: np.ndarray   # [batches + 1] into row_order
  batch_length: np.ndarray  # [batches] padded length
  batch_order: np.ndarray  # the batches in the order the epoch yields them


def bucket_batches(counts: np.ndarray, spec: BatchSpec) -> tuple[np.ndarray, np.ndarray]:
  """Where each batch starts in the pairs sorted by bucket, and its padded length.

  A bucket's pairs fill its batches of `global_rows(length)` rows; the few left over (fewer than a
  batch) go on into the next longer bucket's first batch, padded to its length, instead of making
  a part-empty batch: an epoch has one part-empty batch, its last bucket's, not one a bucket (with
  a small corpus and WMT's 25k tokens, those were a third of the positions)."""
  starts, lengths, pos, carry = [], [], 0, 0
  last = int(np.flatnonzero(counts)[-1]) if counts.any() else 0
  for b, count in enumerate(counts):
    length = spec.shapes[b]
    rows = spec.global_rows(length)
    available = carry + int(count)
    full = available // rows if b < last else -(-available // rows)
    starts.append(pos + np.arange(full, dtype=np.int64) * rows)
    lengths.append(np.full(full, length, np.int64))
    pos += min(full * rows, available)
    carry = available - min(full * rows, available)
  return np.append(np.concatenate(starts), pos), np.concatenate(lengths)


class Planner:
  """Plans epochs over pair lengths; the parts that do not change between epochs are made once."""

  def __init__(self, lengths: np.ndarray, spec: BatchSpec, seed: int, shuffle: bool,
               headroom: float = 1.0):
    if spec.mode not in batching.BATCHING_MODES:
      raise DataError(f"unknown batching mode {spec.mode!r}; use one of "
                      f"{', '.join(batching.BATCHING_MODES)}")
    lengths = np.asarray(lengths)
    costs = np.maximum(lengths[:, 0], lengths[:, 1])  # uint16: 2 bytes a pair, nothing wider
    if headroom != 1.0:
      costs = np.minimum(np.ceil(costs * headroom), spec.max_len).astype(np.uint16)
    if len(costs) and costs.max() > spec.shapes[-1]:
      raise DataError(f"the token cache holds a pair of {costs.max()} tokens, longer than the "
                      f"longest batch row ({spec.shapes[-1]}): it was built with a larger "
                      "data.max_len; rebuild it for this config")
    self.spec, self.seed, self.shuffle, self.n = spec, seed, shuffle, len(costs)
    if spec.mode == "pack":  # held: 2 + 4 bytes a pair, and 16 a row (~2 a pair)
      self.costs = costs
      slot_cost, self.row_start = batching.pack_templates(self.costs, spec.pack_length)
      self.slots_by_cost = batching.stable_partition(
          np.arange(len(slot_cost), dtype=np.uint32), slot_cost.astype(np.uint16),
          spec.pack_length + 1)
      del slot_cost
      self.rows = spec.global_rows(spec.pack_length)
      num_rows = len(self.row_start) - 1
      self.num_batches = -(-num_rows // self.rows)
    else:  # held: 1 byte a pair
      bucket_of_cost = np.searchsorted(spec.shapes, np.arange(spec.shapes[-1] + 1)).astype(np.uint8)
      self.bucket_of = bucket_of_cost[costs]
      shapes = np.asarray(spec.shapes)
      self.batch_starts, self.batch_lengths = bucket_batches(
          np.bincount(self.bucket_of, minlength=len(shapes)), spec)
      self.num_batches = len(self.batch_lengths)
    del costs
    release_freed_memory()

  def _order(self, epoch: int) -> np.ndarray:
    order = np.arange(self.n, dtype=np.uint32)
    if self.shuffle:
      np.random.default_rng([self.seed, epoch]).shuffle(order)
    return order

  def plan(self, epoch: int) -> EpochPlan:
    """Epoch `epoch`'s batches: 4 bytes a pair kept (who goes where), and while planning 4 more
    (the shuffled order) and a block's temporaries, which go back to the system afterwards."""
    try:
      return self._plan(epoch)
    finally:
      release_freed_memory()

  def _plan(self, epoch: int) -> EpochPlan:
    order = self._order(epoch)
    batch_rng = np.random.default_rng([self.seed, epoch, 1])
    if self.spec.mode == "pack":
      by_cost = batching.stable_partition(order, self.costs, self.spec.pack_length + 1)
      del order
      members = np.empty(self.n, np.uint32)
      members[self.slots_by_cost] = by_cost
      del by_cost
      num_rows = len(self.row_start) - 1
      row_order = (batch_rng.permutation(num_rows) if self.shuffle else np.arange(num_rows))
      batch_rows = np.minimum(np.arange(self.num_batches + 1, dtype=np.int64) * self.rows, num_rows)
      return EpochPlan(members, self.row_start, row_order, batch_rows,
                       np.full(self.num_batches, self.spec.pack_length, np.int64),
                       self._batch_order(batch_rng))
    members = batching.stable_partition(order, self.bucket_of, len(self.spec.shapes))  # by bucket,
    del order                                                                      # shuffled within
    return EpochPlan(members, None, None, self.batch_starts, self.batch_lengths,
                     self._batch_order(batch_rng))

  def _batch_order(self, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(self.num_batches) if self.shuffle else np.arange(self.num_batches)

  def real_share(self, lengths: np.ndarray) -> tuple[float, float]:
    """Of the positions an epoch's batches hold, the share that are real tokens (source, target)."""
    plan_len = ([self.spec.pack_length] * self.num_batches if self.spec.mode == "pack" else
                self.batch_lengths)
    plan_rows = ([self.rows] * self.num_batches if self.spec.mode == "pack" else
                 [self.spec.global_rows(int(length)) for length in plan_len])
    positions = float(np.dot(np.asarray(plan_rows, np.float64), np.asarray(plan_len, np.float64)))
    real = np.asarray(lengths).sum(axis=0, dtype=np.int64) / max(positions, 1.0)
    return float(real[0]), float(real[1])


@dataclasses.dataclass(frozen=True)
class Sharding:
  """Which rows of each global batch this process makes."""
  index: int = 0
  count: int = 1


class MakeBatch:
  """Batch g of the run as numpy arrays: this process's rows of batch g % B of epoch g // B.

  Picklable (Grain's worker processes get a copy): it holds where the cache is, not the cache; each
  process opens the cache and plans the epoch it is asked for, keeping the last plan.
  """

  def __init__(self, cache_dir: str, spec: BatchSpec, seed: int, shuffle: bool, sharding: Sharding,
               subword: dict[str, Any] | None = None, cache: TokenCache | None = None,
               fingerprint: str | None = None):
    self.cache_dir, self.spec, self.seed, self.shuffle = cache_dir, spec, seed, shuffle
    self.fingerprint = fingerprint or (cache.fingerprint if cache is not None else None)
    self.sharding, self.subword = sharding, subword
    self._cache = cache  # already open in this process (a worker opens its own)
    self._planner = self._text = None
    self._current: tuple[int, EpochPlan] | None = None  # (epoch, its plan)
    self._lock = threading.RLock()  # Grain's read-ahead threads share this object

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

  def __setstate__(self, state):
    self.__init__(**state)

  @property
  def cache(self) -> TokenCache:
    with self._lock:
      if self._cache is None:
        self._cache = TokenCache(self.cache_dir, expect=self.fingerprint)  # (the parent's)
      return self._cache

  @property
  def planner(self) -> Planner:
    with self._lock:
      if self._planner is None:
        headroom = DROPOUT_HEADROOM if self.subword else 1.0
        self._planner = Planner(self.cache.lengths, self.spec, self.seed, self.shuffle, headroom)
      return self._planner

  def epoch_plan(self, epoch: int) -> EpochPlan:
    """The plan of `epoch`, made once however many threads ask for it (the last epoch's kept)."""
    with self._lock:
      if self._current is None or self._current[0] != epoch:
        self._current = None  # the last epoch's plan goes before the next one is made
        self._current = (epoch, self.planner.plan(epoch))
      return self._current[1]

  def __call__(self, g: int) -> dict[str, np.ndarray]:
    epoch, b = divmod(int(g), self.planner.num_batches)
    plan = self.epoch_plan(epoch)
    k = int(plan.batch_order[b])
    length = int(plan.batch_length[k])
    global_rows = (self.planner.rows if self.spec.mode == "pack" else
                   self.spec.global_rows(length))
    local = global_rows // self.sharding.count
    lo = plan.batch_rows[k] + self.sharding.index * local
    hi = min(lo + local, plan.batch_rows[k + 1])
    if plan.row_start is None:  # one pair a row
      members = plan.members[lo:max(lo, hi)].astype(np.int64)
      row_of = np.arange(len(members))
    else:
      rows = plan.row_order[lo:max(lo, hi)]
      sizes = plan.row_start[rows + 1] - plan.row_start[rows]
      members = plan.members[batching.ragged_arange(sizes) + np.repeat(plan.row_start[rows], sizes)]
      members = members.astype(np.int64)
      row_of = np.repeat(np.arange(len(rows)), sizes)
    sides = self._sampled(g, members, row_of, length) if self.subword else self._cached(members)
    return batching.assemble(sides, row_of, local, length, packed=self.spec.mode == "pack")

  def _cached(self, members: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    cache = self.cache
    return [(cache.tokens[side], cache.offsets[members, side], cache.lengths[members, side])
            for side in (0, 1)]

  def _sampled(self, g: int, members: np.ndarray, row_of: np.ndarray, length: int
               ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Both sides segmented afresh (BPE-dropout); a side that outgrows its planned place keeps
    its cached ids, so every batch keeps its planned shape."""
    import sentencepiece as spm

    from transformer.data import sources
    from transformer.data.vocab import load_vocab
    with self._lock:
      if self._text is None:  # (text, vocabulary), opened together
        self._text = (sources.open_split(ml_collections.ConfigDict(self.subword["data"]),
                                         self.subword["split"]), load_vocab(self.subword["vocab"]))
    text, vocab = self._text
    cache, planner = self.cache, self.planner
    texts = [sources.normalise_controls(side)[0] for side in text.read(cache.index[members])]
    room = (planner.costs[members].astype(np.int64) if self.spec.mode == "pack"
            else np.full(len(members), length, np.int64))
    sides = []
    for side in (0, 1):
      with _SAMPLER:  # SentencePiece's seed is global: one sampling call at a time per process
        spm.set_random_generator_seed(int(np.random.default_rng(
            [self.seed, self.sharding.index, int(g), side]).integers(2**31)))
        sampled = marian_vocab.side(vocab, ("source", "target")[side]).encode(
            texts[side], enable_sampling=True, alpha=self.subword["alpha"], nbest_size=-1,
            num_threads=1)
      chosen = []
      for i, ids in enumerate(sampled):
        if ids and len(ids) + 1 <= room[i]:
          chosen.append(np.asarray(ids + [1], np.int64))
        else:
          chosen.append(np.asarray(cache.pair(int(members[i]))[side], np.int64))
      lengths = np.array([len(c) for c in chosen], np.int64)
      tokens = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
      sides.append((tokens, np.cumsum(lengths) - lengths, lengths))
    return sides


class Loader:
  """Training batches (shuffled, endless) or one ordered pass (validation) over a token cache."""

  def __init__(self, cache: TokenCache, spec: BatchSpec, *, seed: int = 0, shuffle: bool = True,
               repeat: bool = True, sharding: Sharding = Sharding(), workers: int = 0,
               threads: int = 2, subword: dict[str, Any] | None = None, name: str = ""):
    if len(cache) == 0:
      drops = ", ".join(f"{n:,} {r}" for r, n in cache.meta["dropped"].items())
      raise DataError(f"no sentence pair of {name or cache.meta['corpus']} is left after filtering "
                      f"({cache.meta['read']:,} read; dropped {drops}); check the data or raise "
                      "config.data.max_len")
    if spec.row_multiple % sharding.count:
      raise DataError(f"{sharding.count} processes cannot share batches whose row count is a "
                      f"multiple of {spec.row_multiple}")
    self.cache, self.spec, self.seed, self.shuffle, self.repeat = cache, spec, seed, shuffle, repeat
    self.sharding, self.workers, self.threads = sharding, workers, threads
    self.make = MakeBatch(str(cache.directory), spec, seed, shuffle, sharding, subword, cache)
    self.planner = self.make.planner
    self.num_batches = self.planner.num_batches
    self.name = name or cache.meta["corpus"]

  @property
  def signature(self) -> str:
    """What a saved position means: the same position in another plan is other batches."""
    what = {"cache": self.cache.fingerprint, "spec": dataclasses.asdict(self.spec),
            "seed": self.seed, "processes": self.sharding.count,
            "subword": bool(self.make.subword), "batches": self.num_batches}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

  def position(self, state: PipelineState) -> dict[str, Any]:
    """The position as saved in a checkpoint."""
    return {**state.to_dict(), "plan": self.signature, "batches": self.num_batches}

  def resume_state(self, saved: dict[str, Any], allow_change: bool = False) -> PipelineState:
    """The position to continue from, read from a checkpoint's `saved` dict.

    A position saved under other batch settings, another process count or another cache would
    name other batches: that is an error, or with `allow_change` a documented reshuffle: the same
    epoch, from the same fraction of it, in the new plan (some pairs of that epoch are then seen
    twice or not at all)."""
    epoch, batch = int(saved["epoch"]), int(saved["batch"])
    if saved.get("plan") == self.signature:
      return PipelineState(epoch, batch)
    was = (f"batch {batch} of epoch {epoch}, saved under other batch settings, devices, process "
           "count or data" if "plan" in saved else
           f"epoch {epoch}, saved by the earlier windowed input pipeline")
    if not allow_change:
      raise DataError(f"the checkpoint's input position ({was}) does not name the same batches in "
                      "this run's plan; resume with the run's data.batching, data.tokens_per_batch, "
                      "data.pack_length, data.max_len, devices and processes, or pass "
                      "--allow_config_change to continue from the same fraction of that epoch")
    batches = int(saved.get("batches", 0)) or self.num_batches
    fraction = batch / batches if "plan" in saved else 0.0
    return PipelineState(epoch, min(self.num_batches - 1, math.floor(fraction * self.num_batches)))

  def batches(self, start: PipelineState = PipelineState()
              ) -> Iterator[tuple[dict[str, np.ndarray], PipelineState]]:
    """(batch, state after it) from `start` on; endless if `repeat`, else to the epoch's end."""
    import grain  # here, not at the top: programs that never train start without it (0.4 s)
    first = start.epoch * self.num_batches + start.batch
    stop = first + 2**40 if self.repeat else self.num_batches
    dataset = grain.MapDataset.range(first, stop).map(self.make)
    it_ds = dataset.to_iter_dataset(grain.ReadOptions(num_threads=self.threads,
                                                      prefetch_buffer_size=max(2, 2 * self.threads)))
    if self.workers:
      if not flags.FLAGS.is_parsed():  # Grain reads its absl flags (defaults) when it starts workers
        flags.FLAGS.mark_as_parsed()
      it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.workers,
                                                             per_worker_buffer_size=2),
                                worker_init_fn=workers.leave_stops_to_parent)
    # With workers, each batch is copied out of the shared memory it came in, which Grain then
    # frees (in a thread of its own): no block is held beyond its copy.
    copied = (lambda batch: {k: np.array(v) for k, v in batch.items()}) if self.workers else None
    # Grain starts its processes with the first batch: with the stop signals held, so that a
    # Ctrl-C to the process group is the trainer's alone to answer (workers.py)
    with workers.stop_signals_held() if self.workers else contextlib.nullcontext():
      iterator = iter(it_ds)
      head = [copied(b) if copied else b for b in itertools.islice(iterator, 1)]
    try:
      rest = map(copied, iterator) if copied else iterator
      for g, batch in enumerate(itertools.chain(head, rest), start=first + 1):
        yield batch, PipelineState(*divmod(g, self.num_batches))
    finally:
      close = getattr(iterator, "close", None)
      if close is not None:
        close()
      if self.workers:
        workers.finish_shared_memory_frees()

  def batch_shapes(self) -> list[tuple[int, int]]:
    """The (global rows, padded length) of every batch shape an epoch fills (every epoch fills
    the same): what the train step is compiled for before the first step."""
    if self.spec.mode == "pack":
      return [(self.planner.rows, self.spec.pack_length)]
    lengths = sorted(set(self.planner.batch_lengths.tolist()))
    return [(self.spec.global_rows(length), length) for length in lengths]

  def epoch_fraction(self, state: PipelineState) -> float:
    return state.epoch + state.batch / self.num_batches

  def describe(self) -> str:
    src, tgt = self.planner.real_share(self.cache.lengths)
    return (f"{self.num_batches:,} batches an epoch ({self.spec.mode}), {src:.1%} / {tgt:.1%} of "
            "source / target positions real")
