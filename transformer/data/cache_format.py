"""The token cache's format on disk, how a cache is opened and checked, and where a run's caches
live: what the readers (the loader, its worker processes, the benchmark) need, and no writing.

A cache directory holds:

    src.bin, tgt.bin   every kept pair's ids, EOS appended, one after another (uint16 when the
                       vocabulary has at most 65,536 pieces, else uint32)
    offsets.npy        [pairs + 1, 2] int64: where pair i starts in src.bin / tgt.bin
    lengths.npy        [pairs, 2] uint16: its lengths in tokens (EOS included)
    index.npy          [pairs] int64: its position in the corpus (subword dropout re-reads the text)
    meta.json          the fingerprint, sizes, filters and drop counts; written last

The fingerprint hashes what the ids depend on: the corpus (name, size, and the files' sizes and
times or the TFDS directory), the vocabulary's bytes, and the filters (max_len, max_length_ratio).
Opening a cache checks every file's size against meta.json, so a truncated file is an error that
names the command to rebuild. Writing is token_cache.py's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import mmap
import os
import tempfile
from pathlib import Path

import numpy as np

from transformer.data import sources
from transformer.data.sources import DataError
from transformer.files import user_cache_dir
from transformer.tokens import EOS_ID

log = logging.getLogger("transformer")

FORMAT = 2  # 2: control characters become spaces before encoding
META_FILE = "meta.json"
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
    how = f"; rebuild it with {rebuild}" if rebuild else "; delete it and build it again"
    meta_path = self.directory / META_FILE
    if not meta_path.is_file():
      raise DataError(f"no token cache in {self.directory} (no {META_FILE}){how}")
    if not os.access(self.directory, os.R_OK | os.X_OK):
      raise DataError(f"cannot read the token cache in {self.directory} (permission denied); "
                      "make it readable or point config.data.token_cache_dir elsewhere")
    try:
      self.meta = json.loads(meta_path.read_text())
      n, dtype = int(self.meta["pairs"]), np.dtype(self.meta["dtype"])
      tokens = [int(t) for t in self.meta["tokens"]]
      if len(tokens) != 2 or dtype not in (np.uint16, np.uint32) or n < 0 or min(tokens) < 0:
        raise ValueError(f"pairs {n}, tokens {tokens}, dtype {dtype}")
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
    arrays = {}
    for name, (dtype_, shape) in {"lengths": (np.uint16, (n, 2)), "offsets": (np.int64, (n + 1, 2)),
                                  "index": (np.int64, (n,))}.items():
      path = self.directory / f"{name}.npy"
      try:
        arrays[name] = np.load(path, mmap_mode="r")
      except FileNotFoundError:
        raise DataError(f"{path} is missing: the cache is incomplete{how}") from None
      except Exception as e:  # noqa: BLE001  numpy's EOFError, ValueError, UnpicklingError, ...
        raise DataError(f"cannot read {path} ({type(e).__name__}: {e}): the cache is corrupt"
                        f"{how}") from None
      if arrays[name].dtype != dtype_ or arrays[name].shape != shape:
        raise DataError(f"{path} holds {arrays[name].dtype} {list(arrays[name].shape)}, expected "
                        f"{np.dtype(dtype_)} {list(shape)} ({n:,} pairs in its {META_FILE}): the "
                        f"cache is corrupt{how}")
    self.lengths, self.offsets, self.index = arrays["lengths"], arrays["offsets"], arrays["index"]
    if n and list(self.offsets[-1]) != tokens:
      raise DataError(f"the offsets of the token cache in {self.directory} end at "
                      f"{list(self.offsets[-1])} tokens, its {META_FILE} says {tokens}: it is "
                      f"corrupt{how}")
    self.tokens = [np.memmap(self.directory / name, dtype, mode="r") if size else
                   np.zeros(0, dtype) for name, size in zip(expected_sizes, tokens)]
    for array in (self.offsets, self.index, *self.tokens):  # (lengths: read whole, to plan)
      _random_access(array)
    if n and not self._spot_check(int(self.meta.get("read", n))):
      raise DataError(f"the arrays of the token cache in {self.directory} disagree with each other "
                      f"(lengths, offsets, positions or end-of-sentence ids): it is corrupt{how}")

  def _spot_check(self, read: int, samples: int = 1024) -> bool:
    """Whether the first, the last and `samples` pairs spread over the cache agree: offsets that
    step by the lengths, ids that end in EOS, positions in the corpus that rise and stay below
    `read`. A few thousand reads, not the whole arrays (40M pairs are 1.3 GB of offsets)."""
    n = len(self.lengths)
    i = np.unique(np.linspace(0, n - 1, min(n, samples)).astype(np.int64))
    starts, ends = self.offsets[i], self.offsets[i + 1]
    if self.offsets[0].any() or not (ends - starts == self.lengths[i]).all():
      return False
    for side in (0, 1):
      if not (self.tokens[side][ends[:, side] - 1] == EOS_ID).all():
        return False
    positions = self.index[i]
    return bool((np.diff(positions) > 0).all() and positions[0] >= 0 and positions[-1] < read)

  def __len__(self) -> int:
    return len(self.lengths)

  @property
  def fingerprint(self) -> str:
    return self.meta["fingerprint"]

  def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.asarray(self.tokens[side][self.offsets[i, side]:self.offsets[i + 1, side]])
                 for side in (0, 1))


def _random_access(array: np.ndarray) -> None:
  """Tells the kernel a mapped file is read at random (batches gather rows from all over it): each
  page fault then reads its page, not the read-ahead window around it (8 MB on some disks), which
  on a cold page cache would read gigabytes to check a thousand pairs or make one batch."""
  mapping = getattr(array, "_mmap", None)  # numpy's memmap keeps its mmap object here
  if mapping is not None and hasattr(mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
    mapping.madvise(mmap.MADV_RANDOM)


# ------------------------------------------------------------------------------ a run's caches

def corpus_identity(data, split: str) -> tuple[str, str]:
  """(a short name for the cache directory, the full identity for the fingerprint) of a split."""
  short, full = sources.source_of(data).identity(data, split)
  return short + sources.text_identity(data), full + sources.text_identity(data)


def cache_root(data) -> Path:
  return Path(data.token_cache_dir).expanduser() if data.token_cache_dir else user_cache_dir("tokens")


def cache_dir(data, split: str, vocab_bytes: bytes, filters: Filters) -> Path:
  """Where a split's cache for this vocabulary and these filters lives (the corpus's contents are
  in the fingerprint, not the name: a changed corpus replaces its stale cache)."""
  short, _ = corpus_identity(data, split)
  ratio = f"{filters.max_ratio:g}" if filters.max_ratio else "any"
  return cache_root(data) / (f"{short}.vocab{hashlib.sha256(vocab_bytes).hexdigest()[:10]}"
                             f".len{filters.max_len}.ratio{ratio}")


def _size_record(data, split: str) -> tuple[Path, str]:
  short, full = corpus_identity(data, split)
  return (cache_root(data) / ".sizes" / f"{short}.{hashlib.sha256(full.encode()).hexdigest()[:12]}"
          ".json", full)


def recorded_pairs(data, split: str) -> int | None:
  """The number of pairs of `split` as last counted for this corpus (its identity: files' sizes and
  times, TFDS directory), so that a start with its caches built never reads the text to count them;
  None where unknown."""
  path, identity = _size_record(data, split)
  try:
    record = json.loads(path.read_text())
    return int(record["pairs"]) if record["identity"] == identity else None
  except (OSError, ValueError, KeyError, TypeError):
    return None


def record_pairs(data, split: str, pairs: int) -> None:
  """Records the split's size (best effort: it only saves a later start from counting lines). Each
  writer has its own temporary file, so runs that open the same corpus at once do not collide."""
  path, identity = _size_record(data, split)
  if recorded_pairs(data, split) == pairs:
    return
  tmp = None
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
      tmp = Path(f.name)
      f.write(json.dumps({"identity": identity, "pairs": pairs}) + "\n")
    os.replace(tmp, path)
  except OSError as e:
    if tmp is not None:
      tmp.unlink(missing_ok=True)
    log.warning("could not record the size of %s in %s (%s); later starts count its lines",
                split, path.parent, e)


def expected_fingerprint(data, split: str, vocab_bytes: bytes, filters: Filters) -> str:
  """The fingerprint the split's cache for this vocabulary and these filters must have."""
  return fingerprint(corpus_identity(data, split)[1], vocab_bytes, filters)


def rebuild_command(config: str = "CONFIG") -> str:
  return f"python -m transformer.training.prepare --config={config}"
