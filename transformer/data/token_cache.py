"""Tokenize once: a split's pairs as token ids on disk, which training reads instead of the text.

Re-tokenizing the corpus every epoch costs a WMT base run 16-60 SentencePiece passes and the cores
a host needs to feed its accelerators. As fairseq does, we tokenize once, with every core the job
may use (worker processes, each encoding its share), filter once, and write flat id arrays that the
loader maps from disk (numpy memmaps: nothing is loaded up front, the page cache shares them between
processes), in the format of cache_format.py (which also opens and checks a cache).

A cache is written into a temporary directory and renamed into place only when whole, so a killed
or failed write (a full disk) never leaves a cache that looks complete. `open_or_build` is what a
run and `prepare` call: the split's cache opened if whole and current, else built, once, however
many processes ask at the same time.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from transformer.data import marian_vocab
from transformer.data.cache_format import (  # noqa: F401  (the format's names, re-exported)
  DROP_REASONS,
  FORMAT,
  META_FILE,
  Filters,
  TokenCache,
  cache_dir,
  cache_root,
  corpus_identity,
  expected_fingerprint,
  fingerprint,
  keep_mask,
  rebuild_command,
  record_pairs,
  recorded_pairs,
  token_dtype,
)
from transformer.data.sources import DataError, normalise_controls
from transformer.data.workers import BrokenWorkers, worker_processes
from transformer.errors import UserError
from transformer.files import (
  DISK_FULL,
  NOT_WRITABLE,
  exclusive,
  partial_directory,
  remove_stale_partials,
  writable_directory,
)
from transformer.hardware import memory_mib, usable_cpus
from transformer.tokens import EOS_ID

log = logging.getLogger("transformer")

CHUNK = 20_000  # pairs a worker encodes at a time

# --------------------------------------------------------------------------------------- writing

_vocab = None  # each encoding worker's vocabulary (a SentencePiece model, or Marian's two)


def _init_worker(vocab_path: str) -> None:
  global _vocab
  from transformer.data.vocab import load_vocab
  _vocab = load_vocab(vocab_path)


def encode_pairs(vocab, src_text: Sequence[str], tgt_text: Sequence[str], filters: Filters,
                 dtype: np.dtype) -> dict:
  """One chunk: the kept pairs' ids (EOS appended) as flat arrays, their lengths, which were kept,
  the drops by reason, and how many pairs had control characters replaced by spaces."""
  out: dict = {}
  (src_text, src_changed), (tgt_text, tgt_changed) = map(normalise_controls, (src_text, tgt_text))
  out["controls"] = [src_changed, tgt_changed]  # lines per side
  ids = [marian_vocab.side(vocab, "source").encode(src_text),
         marian_vocab.side(vocab, "target").encode(tgt_text)]
  lens = [np.fromiter(map(len, side), np.int64, len(side)) for side in ids]
  keep, out["dropped"] = keep_mask(lens[0], lens[1], filters)
  out["keep"] = np.flatnonzero(keep)
  for side, name in ((0, "src"), (1, "tgt")):
    kept = [ids[side][i] + [EOS_ID] for i in out["keep"]]
    out[name] = (np.fromiter((t for s in kept for t in s), dtype) if kept else np.zeros(0, dtype))
    out[f"{name}_len"] = lens[side][out["keep"]] + 1
  return out

def _encode_chunk(task: tuple[list[str], list[str], Filters, str]) -> dict:
  src, tgt, filters, dtype = task
  out = encode_pairs(_vocab, src, tgt, filters, np.dtype(dtype))
  out["peak_rss_mib"] = memory_mib()["peak"]
  return out


def _chunks(source, filters: Filters, dtype: np.dtype) -> Iterator[tuple[int, tuple]]:
  for start in range(0, len(source), CHUNK):
    stop = min(start + CHUNK, len(source))
    src, tgt = source.read(range(start, stop))
    yield start, (src, tgt, filters, dtype.str)


def _failure(directory: Path, error: BaseException) -> DataError:
  """The one-line error of a build that failed for want of disk, or because a worker died."""
  if isinstance(error, OSError) and error.errno in NOT_WRITABLE:
    return DataError(f"cannot write the token cache {directory} ({error.strerror}): point "
                     "config.data.token_cache_dir at a directory this job can write, or make "
                     f"{directory.parent} writable")
  if isinstance(error, OSError):
    full = " (the disk is full)" if error.errno in DISK_FULL else ""
    return DataError(f"could not write the token cache {directory}{full}: {error}; nothing was "
                     "left behind. Free space or point config.data.token_cache_dir elsewhere")
  return DataError(f"a tokenizing worker process died while building the token cache {directory} "
                   f"({error}); nothing was left behind. If memory ran out, build it with fewer "
                   "cores (taskset -c 0 python -m transformer.training.prepare ...)")


class CacheWriter:
  """Writes a cache into a temporary directory beside `directory` and puts it in place whole
  (`finish`); on any error the temporary directory goes and nothing that looks like a cache is
  left. A failed write (a full disk) is a DataError saying so. The temporary directory's name holds
  this host and process (`.NAME.partial-HOST-PID-*`), so a later build of the same cache can tell
  and remove those a killed build left (`remove_stale_partials`)."""

  def __init__(self, directory: str | os.PathLike, dtype: np.dtype):
    self.directory, self.dtype = Path(directory), np.dtype(dtype)
    self.tmp: Path | None = None
    try:
      self.directory.parent.mkdir(parents=True, exist_ok=True)
      remove_stale_partials(self.directory, "the token cache")
      self.tmp = partial_directory(self.directory)
      self.files = [open(self.tmp / "src.bin", "wb"), open(self.tmp / "tgt.bin", "wb")]
    except OSError as e:
      if self.tmp is not None:
        shutil.rmtree(self.tmp, ignore_errors=True)
      raise _failure(self.directory, e) from None
    self.lengths: list[np.ndarray] = []
    self.index: list[np.ndarray] = []
    self.tokens = [0, 0]
    self.dropped = dict.fromkeys(DROP_REASONS, 0)
    self.controls = [0, 0]

  def __enter__(self) -> CacheWriter:
    return self

  def __exit__(self, kind, error, traceback) -> None:
    for f in self.files:
      with contextlib.suppress(OSError):  # on a full disk the close's flush fails too
        f.close()
    if error is None:
      return
    shutil.rmtree(self.tmp, ignore_errors=True)
    if isinstance(error, (OSError, BrokenWorkers)):
      raise _failure(self.directory, error) from None

  def add(self, ids: Sequence[np.ndarray], lengths: Sequence[np.ndarray], index: np.ndarray,
          dropped: dict[str, int] | None = None, controls: Sequence[int] = (0, 0)) -> None:
    """Appends pairs: per side their ids one after another (EOS included) and their lengths; their
    positions in the corpus; the pairs dropped meanwhile, and the lines (per side) whose control
    characters became spaces."""
    for side in (0, 1):
      self.files[side].write(np.asarray(ids[side], self.dtype).tobytes())
      self.tokens[side] += len(ids[side])
      self.controls[side] += int(controls[side])
    self.lengths.append(np.stack(lengths, axis=1).astype(np.uint16))
    self.index.append(np.asarray(index, np.int64))
    for reason, n in (dropped or {}).items():
      self.dropped[reason] += n

  def finish(self, **meta) -> TokenCache:
    for f in self.files:
      f.close()
    lengths = np.concatenate(self.lengths) if self.lengths else np.zeros((0, 2), np.uint16)
    offsets = np.zeros((len(lengths) + 1, 2), np.int64)
    np.cumsum(lengths, axis=0, out=offsets[1:])
    np.save(self.tmp / "lengths.npy", lengths)
    np.save(self.tmp / "offsets.npy", offsets)
    np.save(self.tmp / "index.npy", np.concatenate(self.index) if self.index else
            np.zeros(0, np.int64))
    meta = {"format": FORMAT, **meta, "pairs": len(lengths), "tokens": self.tokens,
            "dtype": self.dtype.name, "dropped": self.dropped,
            "control_characters_replaced": {"source_lines": self.controls[0],
                                            "target_lines": self.controls[1]}}
    (self.tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return self._put_in_place(meta["fingerprint"])

  def _put_in_place(self, expect: str) -> TokenCache:
    """Renames the finished cache to `directory`. Where another process (a run started beside
    this one) put the same cache there meanwhile, that one is kept; a stale one goes."""
    for _ in range(5):
      if self.directory.exists():
        try:
          existing = TokenCache(self.directory, expect=expect)
          shutil.rmtree(self.tmp, ignore_errors=True)
          return existing
        except DataError:  # stale or damaged: set aside, removed once ours is in place
          old = self.directory.with_name(f".{self.directory.name}.old-{os.getpid()}")
          try:
            os.replace(self.directory, old)
          except FileNotFoundError:
            pass
      try:
        os.replace(self.tmp, self.directory)
      except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
          continue  # another process got there first: look again
        raise
      for old in self.directory.parent.glob(f".{self.directory.name}.old-*"):
        shutil.rmtree(old, ignore_errors=True)
      return TokenCache(self.directory)
    raise DataError(f"could not put the token cache in place at {self.directory}: other "
                    "processes keep replacing it; build it once with "
                    f"`{rebuild_command()}` before starting several runs")


def build(directory: str | os.PathLike, source, vocab_path: str | os.PathLike, filters: Filters,
          corpus: str, workers: int | None = None) -> TokenCache:
  """Tokenizes and filters every pair of `source` (anything with `len` and `read(indices)`) with
  the vocabulary at `vocab_path` in `workers` processes (default: the cores this job may use), and
  writes the cache into `directory`, replacing a stale one only once the new one is whole.
  `corpus` is the corpus's identity (it goes into the fingerprint). A failure (a full disk, a
  worker that dies) ends the build in seconds with a DataError and removes what it wrote."""
  from transformer.data.vocab import load_vocab
  from transformer.progress import Progress
  vocab_bytes = Path(vocab_path).read_bytes()
  vocab_size = load_vocab(vocab_path).get_piece_size()
  name = getattr(source, "name", corpus)
  workers = 1 if len(source) <= CHUNK else max(1, workers or usable_cpus())
  t0, worker_peak = time.time(), 0
  with (CacheWriter(directory, token_dtype(vocab_size)) as writer,
        worker_processes(workers, _init_worker, (str(vocab_path),)) as pool,
        Progress(f"tokenizing {name}", len(source), "pairs", line_seconds=30) as bar):
    def write(start: int, chunk: dict) -> None:
      nonlocal worker_peak
      writer.add((chunk["src"], chunk["tgt"]), (chunk["src_len"], chunk["tgt_len"]),
                 chunk["keep"] + start, chunk["dropped"], chunk["controls"])
      worker_peak = max(worker_peak, chunk["peak_rss_mib"] if workers > 1 else 0)
      bar.update(len(chunk["src_len"]) + sum(chunk["dropped"].values()))

    pending: collections.deque = collections.deque()  # in corpus order, at most 2 per worker
    for start, task in _chunks(source, filters, writer.dtype):
      pending.append((start, pool.submit(_encode_chunk, task)))
      if len(pending) >= 2 * workers:
        start, result = pending.popleft()
        write(start, result.result())
    while pending:
      start, result = pending.popleft()
      write(start, result.result())
    cache = writer.finish(fingerprint=fingerprint(corpus, vocab_bytes, filters), corpus=name,
                          read=len(source), vocab_size=vocab_size,
                          filters=dataclasses.asdict(filters),
                          seconds=round(time.time() - t0, 1), workers=workers,
                          worker_peak_rss_mib=worker_peak)
  log.info("Token cache %s: %s (%s pairs kept; %s source + %s target tokens, %.0fs with %d "
           "workers)", directory, name, f"{len(cache):,}", f"{cache.meta['tokens'][0]:,}",
           f"{cache.meta['tokens'][1]:,}", cache.meta["seconds"], workers)
  replaced = cache.meta["control_characters_replaced"]
  if any(replaced.values()):
    log.info("%s: control characters (tabs, carriage returns, ...) replaced by spaces in %s "
             "source and %s target lines", name, f"{replaced['source_lines']:,}",
             f"{replaced['target_lines']:,}")
  return cache


def from_pairs(directory: str | os.PathLike, src: Sequence[Sequence[int]],
               tgt: Sequence[Sequence[int]], corpus: str = "pairs", vocab_size: int = 2**16,
               filters: Filters = Filters()) -> TokenCache:  # noqa: B008  (frozen)
  """A cache of pairs already tokenized (EOS is appended here), filtered: for tests and tools."""
  src_len = np.array([len(s) for s in src], np.int64)
  tgt_len = np.array([len(t) for t in tgt], np.int64)
  keep, dropped = keep_mask(src_len, tgt_len, filters)
  kept = np.flatnonzero(keep)
  ids = [np.concatenate([np.append(np.asarray(side[i], np.int64), EOS_ID) for i in kept] or
                        [np.zeros(0, np.int64)]) for side in (src, tgt)]
  with CacheWriter(directory, token_dtype(vocab_size)) as writer:
    writer.add(ids, (src_len[kept] + 1, tgt_len[kept] + 1), kept, dropped)
    return writer.finish(fingerprint=f"{corpus}-{len(src)}", corpus=corpus, read=len(src),
                         vocab_size=vocab_size, filters=dataclasses.asdict(filters), seconds=0,
                         workers=1)


def write_synthetic(directory: str | os.PathLike, pairs: int, vocab_size: int = 37000,
                    seed: int = 0, mean_tokens: float = 31.0, max_len: int = 256) -> TokenCache:
  """A cache of `pairs` random pairs with WMT-shaped lengths (log-normal, mean ~`mean_tokens` a
  side), written in blocks: for measuring the loader at sizes whose text nobody needs (WMT14
  En-Fr's 40.8M pairs). No text, no vocabulary: the fingerprint says 'synthetic'."""
  rng, block, sigma = np.random.default_rng(seed), 1_000_000, 0.7
  mu = np.log(mean_tokens) - sigma**2 / 2
  with CacheWriter(directory, token_dtype(vocab_size)) as writer:
    for start in range(0, pairs, block):
      n = min(block, pairs - start)
      src = np.clip(rng.lognormal(mu, sigma, n), 2, max_len).astype(np.int64)
      tgt = np.clip(src * rng.lognormal(0.05, 0.15, n), 2, max_len).astype(np.int64)
      ids = []
      for side_len in (src, tgt):
        side = rng.integers(4, vocab_size, int(side_len.sum()), dtype=np.int64)
        side[np.cumsum(side_len) - 1] = EOS_ID  # EOS ends every sentence
        ids.append(side)
      writer.add(ids, (src, tgt), np.arange(start, start + n))
    return writer.finish(fingerprint=f"synthetic-{pairs}-{seed}", corpus="synthetic", read=pairs,
                         vocab_size=vocab_size, filters=dataclasses.asdict(Filters(max_len, 0)),
                         seconds=0, workers=1)


def open_or_build(data, split: str, vocab_path: str | os.PathLike, filters: Filters,
                  open_source, build_missing: bool = True, workers: int | None = None
                  ) -> TokenCache:
  """The split's token cache for this vocabulary and these filters: opened if whole and current,
  else built from `open_source()` (a missing, stale, truncated or corrupt one) when
  `build_missing`, else a DataError naming the command that builds it."""
  vocab_bytes = Path(vocab_path).read_bytes()
  directory = cache_dir(data, split, vocab_bytes, filters)
  expect = expected_fingerprint(data, split, vocab_bytes, filters)
  try:
    return TokenCache(directory, expect=expect, rebuild=f"`{rebuild_command()}`")
  except DataError as e:
    if not build_missing:
      raise
    damage = e if directory.exists() else None  # a stale, damaged or half-deleted cache
  try:
    writable_directory(directory.parent, "config.data.token_cache_dir")
  except UserError as e:
    raise DataError(f"cannot build the token cache {directory.name}: {e}") from None
  # Processes preparing the same corpus at once: the first builds it, the others wait and open it.
  with exclusive(directory.with_name(f".{directory.name}.lock"), f"the token cache {directory.name}"):
    try:
      cache = TokenCache(directory, expect=expect)
      log.info("Opened the token cache %s, which another process has just built", directory)
      return cache
    except DataError:
      pass
    if damage is not None:
      log.warning("Rebuilding the token cache: %s", damage)
    return build(directory, open_source(), vocab_path, filters,
                 corpus_identity(data, split)[1], workers)
