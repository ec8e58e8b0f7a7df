"""Tokenize once: a split's pairs as token ids on disk, which training reads instead of the text.

Re-tokenizing the corpus every epoch costs a WMT base run 16-60 SentencePiece passes and the cores
a host needs to feed its accelerators. As fairseq does, we tokenize once, with every core the job
may use (worker processes, each encoding its share), filter once, and write flat id arrays that the
loader maps from disk (numpy memmaps: nothing is loaded up front, the page cache shares them between
processes). A cache directory holds:

    src.bin, tgt.bin   every kept pair's ids, EOS appended, one after another (uint16 when the
                       vocabulary has at most 65,536 pieces, else uint32)
    offsets.npy        [pairs + 1, 2] int64: where pair i starts in src.bin / tgt.bin
    lengths.npy        [pairs, 2] uint16: its lengths in tokens (EOS included)
    index.npy          [pairs] int64: its position in the corpus (subword dropout re-reads the text)
    meta.json          the fingerprint, sizes, filters and drop counts; written last

The fingerprint hashes what the ids depend on: the corpus (name, size, and the files' sizes and
times or the TFDS directory), the vocabulary's bytes, and the filters (max_len, max_length_ratio).
A cache is written into a temporary directory and renamed into place only when whole, so a killed
or failed write (a full disk) never leaves a cache that looks complete; opening one checks every
file's size against meta.json, so a truncated file is an error that names the command to rebuild.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from transformer.data.sources import DataError
from transformer.files import user_cache_dir
from transformer.hardware import memory_mib, usable_cpus
from transformer.tokens import EOS_ID

log = logging.getLogger("transformer")

FORMAT = 1
META_FILE = "meta.json"
CHUNK = 20_000  # pairs a worker encodes at a time
DROP_REASONS = ("empty", "too_long", "length_ratio")


@dataclasses.dataclass(frozen=True)
class Filters:
  """Which pairs a cache keeps: both sides non-empty, at most `max_len` tokens a side (EOS
  included), and no side more than `max_ratio` times longer than the other (0: any ratio)."""
  max_len: int = 256
  max_ratio: float = 9.0

  def describe(self, kept: int, dropped: dict[str, int]) -> str:
    ratio = (f", {dropped['length_ratio']:,} with a length ratio over {self.max_ratio:g}"
             if self.max_ratio else "")
    return (f"kept {kept:,} pairs; dropped {dropped['empty']:,} with an empty side, "
            f"{dropped['too_long']:,} longer than {self.max_len} tokens{ratio}")


def keep_mask(src_len: np.ndarray, tgt_len: np.ndarray, filters: Filters
              ) -> tuple[np.ndarray, dict[str, int]]:
  """Which pairs pass the filters, from their lengths without EOS; and the drops by reason (each
  pair counted once, in the order empty, too long, length ratio)."""
  empty = (src_len == 0) | (tgt_len == 0)
  too_long = ~empty & ((src_len + 1 > filters.max_len) | (tgt_len + 1 > filters.max_len))
  ratio = np.zeros_like(empty)
  if filters.max_ratio:
    ratio = ~empty & ~too_long & (np.maximum(src_len, tgt_len)
                                  > filters.max_ratio * np.minimum(src_len, tgt_len))
  dropped = {"empty": int(empty.sum()), "too_long": int(too_long.sum()),
             "length_ratio": int(ratio.sum())}
  return ~(empty | too_long | ratio), dropped


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def fingerprint(corpus: str, vocab_bytes: bytes, filters: Filters) -> str:
  """What the cached ids are a function of: corpus identity, vocabulary, filters, format."""
  h = hashlib.sha256()
  for part in (str(FORMAT), corpus, hashlib.sha256(vocab_bytes).hexdigest(),
               json.dumps(dataclasses.asdict(filters), sort_keys=True)):
    h.update(part.encode() + b"\0")
  return h.hexdigest()[:16]


class TokenCache:
  """A written cache, opened read-only: `lengths` [n, 2], `offsets` [n + 1, 2] and the token files,
  all memory-mapped; `pair(i)` gives pair i's (source, target) ids."""

  def __init__(self, directory: str | os.PathLike, expect: str | None = None, rebuild: str = ""):
    self.directory = Path(directory)
    how = f"; rebuild it with `{rebuild}`" if rebuild else "; delete it and build it again"
    meta_path = self.directory / META_FILE
    if not meta_path.is_file():
      raise DataError(f"no token cache in {self.directory} (no {META_FILE}){how}")
    try:
      self.meta = json.loads(meta_path.read_text())
      n, dtype = int(self.meta["pairs"]), np.dtype(self.meta["dtype"])
      tokens = [int(t) for t in self.meta["tokens"]]
    except (ValueError, KeyError, TypeError) as e:
      raise DataError(f"{meta_path} is corrupt ({type(e).__name__}: {e}){how}") from None
    if self.meta.get("format") != FORMAT:
      raise DataError(f"{self.directory} is a token cache of format {self.meta.get('format')}, "
                      f"this version reads format {FORMAT}{how}")
    if expect is not None and self.meta.get("fingerprint") != expect:
      raise DataError(f"the token cache in {self.directory} was built from other data, another "
                      f"vocabulary or other filters (fingerprint {self.meta.get('fingerprint')}, "
                      f"expected {expect}){how}")
    expected_sizes = {"src.bin": tokens[0] * dtype.itemsize, "tgt.bin": tokens[1] * dtype.itemsize}
    for name, size in expected_sizes.items():
      path = self.directory / name
      actual = path.stat().st_size if path.is_file() else None
      if actual != size:
        raise DataError(f"{path} is {'missing' if actual is None else f'{actual:,} bytes'}, "
                        f"expected {size:,}: the cache is truncated or corrupt{how}")
    try:
      self.lengths = np.load(self.directory / "lengths.npy", mmap_mode="r")
      self.offsets = np.load(self.directory / "offsets.npy", mmap_mode="r")
      self.index = np.load(self.directory / "index.npy", mmap_mode="r")
    except (OSError, ValueError) as e:
      raise DataError(f"cannot read the token cache in {self.directory} ({e}){how}") from None
    if (self.lengths.shape != (n, 2) or self.offsets.shape != (n + 1, 2)
        or self.index.shape != (n,) or (n and list(self.offsets[-1]) != tokens)):
      raise DataError(f"the arrays of the token cache in {self.directory} do not match its "
                      f"{META_FILE} ({n:,} pairs, {tokens} tokens): it is corrupt{how}")
    self.tokens = [np.memmap(self.directory / name, dtype, mode="r") if size else
                   np.zeros(0, dtype) for name, size in zip(expected_sizes, tokens)]

  def __len__(self) -> int:
    return len(self.lengths)

  @property
  def fingerprint(self) -> str:
    return self.meta["fingerprint"]

  def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.asarray(self.tokens[side][self.offsets[i, side]:self.offsets[i + 1, side]])
                 for side in (0, 1))


# --------------------------------------------------------------------------------------- writing

_vocab = None  # each encoding worker's SentencePiece model


def _init_worker(vocab_path: str) -> None:
  global _vocab
  import sentencepiece as spm
  _vocab = spm.SentencePieceProcessor(model_file=vocab_path)


def encode_pairs(vocab, src_text: Sequence[str], tgt_text: Sequence[str], filters: Filters,
                 dtype: np.dtype) -> dict:
  """One chunk: the kept pairs' ids (EOS appended) as flat arrays, their lengths, which were kept,
  and the drops by reason."""
  out: dict = {}
  ids = [vocab.encode(list(src_text)), vocab.encode(list(tgt_text))]
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
  return encode_pairs(_vocab, src, tgt, filters, np.dtype(dtype))


class _InProcess:
  """The Pool interface, run in this process: for one worker, or a corpus smaller than a chunk."""

  def __init__(self, vocab_path: str | os.PathLike):
    _init_worker(str(vocab_path))

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    pass

  def apply_async(self, fn, args) -> _Ready:
    return _Ready(fn(*args))


@dataclasses.dataclass
class _Ready:
  """A result computed already, with the `get()` of Pool's AsyncResult."""
  value: dict

  def get(self) -> dict:
    return self.value


def _encoder(workers: int, vocab_path: str | os.PathLike):
  if workers == 1:
    return _InProcess(vocab_path)
  context = multiprocessing.get_context("spawn")  # never fork a process that may run JAX
  return context.Pool(workers, _init_worker, (str(vocab_path),))


def _chunks(source, filters: Filters, dtype: np.dtype) -> Iterator[tuple[int, tuple]]:
  for start in range(0, len(source), CHUNK):
    stop = min(start + CHUNK, len(source))
    src, tgt = source.read(range(start, stop))
    yield start, (src, tgt, filters, dtype.str)


class CacheWriter:
  """Writes a cache into a temporary directory beside `directory` and puts it in place whole
  (`finish`); on any error the temporary directory goes and nothing that looks like a cache is
  left. A failed write (a full disk) is a DataError saying so."""

  def __init__(self, directory: str | os.PathLike, dtype: np.dtype):
    self.directory, self.dtype = Path(directory), np.dtype(dtype)
    self.directory.parent.mkdir(parents=True, exist_ok=True)
    self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.directory.name}.partial-",
                                     dir=self.directory.parent))
    self.files = [open(self.tmp / "src.bin", "wb"), open(self.tmp / "tgt.bin", "wb")]
    self.lengths: list[np.ndarray] = []
    self.index: list[np.ndarray] = []
    self.tokens = [0, 0]
    self.dropped = dict.fromkeys(DROP_REASONS, 0)

  def __enter__(self) -> CacheWriter:
    return self

  def __exit__(self, kind, error, traceback) -> None:
    for f in self.files:
      f.close()
    if error is None:
      return
    shutil.rmtree(self.tmp, ignore_errors=True)
    if isinstance(error, OSError):
      full = " (the disk is full)" if error.errno == errno.ENOSPC else ""
      raise DataError(f"could not write the token cache {self.directory}{full}: {error}; nothing "
                      "was left behind. Free space or point config.data.token_cache_dir elsewhere"
                      ) from None

  def add(self, ids: Sequence[np.ndarray], lengths: Sequence[np.ndarray], index: np.ndarray,
          dropped: dict[str, int] | None = None) -> None:
    """Appends pairs: per side their ids one after another (EOS included) and their lengths; their
    positions in the corpus; and the pairs dropped meanwhile."""
    for side in (0, 1):
      self.files[side].write(np.asarray(ids[side], self.dtype).tobytes())
      self.tokens[side] += len(ids[side])
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
            "dtype": self.dtype.name, "dropped": self.dropped}
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
  `corpus` is the corpus's identity (it goes into the fingerprint)."""
  import sentencepiece as spm

  from transformer.progress import Progress
  vocab_bytes = Path(vocab_path).read_bytes()
  vocab_size = spm.SentencePieceProcessor(model_file=str(vocab_path)).get_piece_size()
  name = getattr(source, "name", corpus)
  workers = 1 if len(source) <= CHUNK else max(1, workers or usable_cpus())  # (processes would
  t0 = time.time()                                  # cost more than they save on a small corpus)
  with (CacheWriter(directory, token_dtype(vocab_size)) as writer,
        _encoder(workers, vocab_path) as pool,
        Progress(f"tokenizing {name}", len(source), "pairs", line_seconds=30) as bar):
    def write(start: int, chunk: dict) -> None:
      writer.add((chunk["src"], chunk["tgt"]), (chunk["src_len"], chunk["tgt_len"]),
                 chunk["keep"] + start, chunk["dropped"])
      bar.update(len(chunk["src_len"]) + sum(chunk["dropped"].values()))

    pending: collections.deque = collections.deque()  # in corpus order, at most 2 per worker
    for start, task in _chunks(source, filters, writer.dtype):
      pending.append((start, pool.apply_async(_encode_chunk, (task,))))
      if len(pending) >= 2 * workers:
        start, result = pending.popleft()
        write(start, result.get())
    while pending:
      start, result = pending.popleft()
      write(start, result.get())
    worker_peak = max((memory_mib(p.pid)["peak"] for p in getattr(pool, "_pool", [])),
                      default=0)
    cache = writer.finish(fingerprint=fingerprint(corpus, vocab_bytes, filters), corpus=name,
                          read=len(source), vocab_size=vocab_size,
                          filters=dataclasses.asdict(filters),
                          seconds=round(time.time() - t0, 1), workers=workers,
                          worker_peak_rss_mib=worker_peak)
  log.info("Token cache %s: %s (%s pairs kept; %s source + %s target tokens, %.0fs with %d "
           "workers)", directory, name, f"{len(cache):,}", f"{cache.meta['tokens'][0]:,}",
           f"{cache.meta['tokens'][1]:,}", cache.meta["seconds"], workers)
  return cache


def from_pairs(directory: str | os.PathLike, src: Sequence[Sequence[int]],
               tgt: Sequence[Sequence[int]], corpus: str = "pairs", vocab_size: int = 2**16,
               filters: Filters = Filters()) -> TokenCache:
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


# ------------------------------------------------------------------------------ a run's caches

def corpus_identity(data, split: str) -> tuple[str, str]:
  """(a short name for the cache directory, the full identity for the fingerprint) of a split."""
  from transformer.data import sources
  return sources.source_of(data).identity(data, split)


def cache_root(data) -> Path:
  return Path(data.token_cache_dir).expanduser() if data.token_cache_dir else user_cache_dir("tokens")


def cache_dir(data, split: str, vocab_bytes: bytes, filters: Filters) -> Path:
  """Where a split's cache for this vocabulary and these filters lives (the corpus's contents are
  in the fingerprint, not the name: a changed corpus replaces its stale cache)."""
  short, _ = corpus_identity(data, split)
  ratio = f"{filters.max_ratio:g}" if filters.max_ratio else "any"
  return cache_root(data) / (f"{short}.vocab{hashlib.sha256(vocab_bytes).hexdigest()[:10]}"
                             f".len{filters.max_len}.ratio{ratio}")


def rebuild_command(config: str = "CONFIG") -> str:
  return f"python -m transformer.training.prepare --config={config}"


def open_or_build(data, split: str, vocab_path: str | os.PathLike, filters: Filters,
                  open_source, build_missing: bool = True, workers: int | None = None
                  ) -> TokenCache:
  """The split's token cache for this vocabulary and these filters: opened if whole and current,
  else built from `open_source()` (a missing, stale, truncated or corrupt one) when
  `build_missing`, else a DataError naming the command that builds it."""
  vocab_bytes = Path(vocab_path).read_bytes()
  directory = cache_dir(data, split, vocab_bytes, filters)
  corpus = corpus_identity(data, split)[1]
  expect = fingerprint(corpus, vocab_bytes, filters)
  try:
    return TokenCache(directory, expect=expect, rebuild=rebuild_command())
  except DataError as e:
    if not build_missing:
      raise
    if (directory / META_FILE).exists():
      log.warning("Rebuilding the token cache: %s", e)
  return build(directory, open_source(), vocab_path, filters, corpus, workers)
