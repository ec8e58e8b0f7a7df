"""Parallel text files read as the training pipeline needs them: aligned lines of two files (a .gz
decompressed into memory, a plain file mapped from disk), several such pairs as one corpus, or a
whole pair in memory. Problems (a missing file, unequal line counts, invalid UTF-8) raise
`DataError` naming the file and line."""

from __future__ import annotations

import dataclasses
import gzip
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from transformer.errors import UserError


class DataError(UserError, ValueError):
  """Input data that cannot be used; the message says which file and what to do."""


@dataclasses.dataclass(frozen=True)
class ParallelText:
  source: list[str]
  target: list[str]
  name: str

  def __len__(self) -> int:
    return len(self.source)

  def read(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
    return [self.source[i] for i in indices], [self.target[i] for i in indices]


def read_lines(path: str | os.PathLike) -> list[str]:
  """Lines of a UTF-8 text file (gzip if it ends in .gz), without line endings."""
  path = Path(path)
  if not path.is_file():
    raise DataError(f"data file not found: {path}")
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rb") as f:
    raw = f.read()
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise DataError(f"{path}:{number}: invalid UTF-8 ({e.reason} at byte {e.start}); "
                      "re-encode the file as UTF-8") from None
  return out


class TextFilePairs:
  """Random access to aligned text files without holding them as Python strings: the files' bytes
  (mapped from disk; a .gz decompressed into memory) and the offsets of their line ends. A 40M-line
  corpus costs its size on disk in page cache plus 8 bytes a line, instead of a list of str objects
  several times its size."""

  def __init__(self, src_path: str | os.PathLike, tgt_path: str | os.PathLike):
    self.paths = (Path(src_path), Path(tgt_path))
    self._data = [_file_bytes(p) for p in self.paths]
    self._ends = [_line_ends(d) for d in self._data]
    if len(self._ends[0]) != len(self._ends[1]):
      raise DataError(f"{src_path} has {len(self._ends[0]):,} lines but {tgt_path} has "
                      f"{len(self._ends[1]):,}; parallel files must have one sentence per line, "
                      "aligned")
    self.name = f"{src_path} -> {tgt_path}"

  def __len__(self) -> int:
    return len(self._ends[0])

  def read(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
    return self._lines(0, indices), self._lines(1, indices)

  def _lines(self, side: int, indices: Sequence[int]) -> list[str]:
    data, ends, out = self._data[side], self._ends[side], []
    for i in indices:
      start = int(ends[i - 1]) + 1 if i else 0
      line = bytes(data[start:int(ends[i])]).rstrip(b"\r")
      try:
        out.append(line.decode("utf-8"))
      except UnicodeDecodeError as e:
        raise DataError(f"{self.paths[side]}:{int(i) + 1}: invalid UTF-8 ({e.reason} at byte "
                        f"{e.start}); re-encode the file as UTF-8") from None
    return out


class ConcatenatedPairs:
  """Several aligned file pairs read as one corpus, one after the other (data.train_src='a,b')."""

  def __init__(self, parts: Sequence[TextFilePairs]):
    self.parts = list(parts)
    self._starts = np.cumsum([0] + [len(part) for part in self.parts])
    self.name = " + ".join(part.name for part in self.parts)

  def __len__(self) -> int:
    return int(self._starts[-1])

  def read(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
    indices = np.asarray(indices, np.int64)
    which = np.searchsorted(self._starts, indices, side="right") - 1
    source, target = [""] * len(indices), [""] * len(indices)
    for k, part in enumerate(self.parts):
      at = np.flatnonzero(which == k)
      if len(at):
        src, tgt = part.read(indices[at] - self._starts[k])
        for position, s, t in zip(at, src, tgt):
          source[position], target[position] = s, t
    return source, target


def _file_bytes(path: Path):
  """The bytes of `path`: a read-only map of the file, or the decompressed bytes of a .gz."""
  if not path.is_file():
    raise DataError(f"data file not found: {path}")
  if path.suffix == ".gz":
    with gzip.open(path, "rb") as f:
      return np.frombuffer(f.read(), np.uint8)
  if path.stat().st_size == 0:
    return np.zeros(0, np.uint8)
  return np.memmap(path, np.uint8, mode="r")


def _line_ends(data: np.ndarray, block: int = 1 << 26) -> np.ndarray:
  """Offsets of the line ends ('\\n', or the end of a last line without one), found a block at a
  time (a 20 GB file never needs a 20 GB mask)."""
  ends = [np.flatnonzero(data[start:start + block] == ord("\n")) + start
          for start in range(0, len(data), block)]
  ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
  if len(data) and data[-1] != ord("\n"):
    ends = np.append(ends, len(data))
  return ends


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> ParallelText:
  """Aligned sentence pairs from two text files with one sentence per line."""
  source, target = read_lines(src_path), read_lines(tgt_path)
  if len(source) != len(target):
    raise DataError(f"{src_path} has {len(source)} lines but {tgt_path} has {len(target)}; "
                    "parallel files must have one sentence per line, aligned")
  return ParallelText(source, target, name=f"{src_path} -> {tgt_path}")
