"""Where sentence pairs come from: the bundled Multi30k, any parallel text files, or TFDS.

Every source yields a `ParallelText` (aligned source and target sentences). Problems with the files
(missing, unequal line counts, invalid UTF-8) raise `DataError` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from pathlib import Path

import ml_collections

BUNDLED_DIR = Path(__file__).parent / "multi30k"
MULTI30K_SPLITS = {"train": "train", "validation": "val", "val": "val"}
MULTI30K_TEST_URLS = {  # not bundled; for users with a network.
    "test_2016_flickr": "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2016_flickr.{lang}.gz",
    "test_2017_flickr": "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2017_flickr.{lang}.gz",
    "test_2017_mscoco": "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2017_mscoco.{lang}.gz",
}


class DataError(ValueError):
  """Input data that cannot be used; the message says which file and what to do."""


@dataclasses.dataclass(frozen=True)
class ParallelText:
  source: list[str]
  target: list[str]
  name: str

  def __len__(self) -> int:
    return len(self.source)


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


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> ParallelText:
  """Aligned sentence pairs from two text files with one sentence per line."""
  source, target = read_lines(src_path), read_lines(tgt_path)
  if len(source) != len(target):
    raise DataError(f"{src_path} has {len(source)} lines but {tgt_path} has {len(target)}; "
                    "parallel files must have one sentence per line, aligned")
  return ParallelText(source, target, name=f"{src_path} -> {tgt_path}")


def load_split(data: ml_collections.ConfigDict, split: str) -> ParallelText:
  """The sentence pairs of `split` ('train' or the config's eval split) for the config's source."""
  if data.source == "multi30k":
    if split not in MULTI30K_SPLITS:
      known = ", ".join(sorted(MULTI30K_SPLITS))
      raise DataError(f"the bundled Multi30k has splits {known}, not {split!r}; for the test sets "
                      f"({', '.join(MULTI30K_TEST_URLS)}) download them and use data.source='files'")
    stem = MULTI30K_SPLITS[split]
    for lang in (data.src_lang, data.tgt_lang):
      if not (BUNDLED_DIR / f"{stem}.{lang}.gz").is_file():
        raise DataError(f"the bundled Multi30k has languages en, de; not {lang!r} "
                        "(use data.source='files' for other pairs)")
    return read_parallel(BUNDLED_DIR / f"{stem}.{data.src_lang}.gz",
                         BUNDLED_DIR / f"{stem}.{data.tgt_lang}.gz")
  if data.source == "files":
    if split == "train":
      return read_parallel(data.train_src, data.train_tgt)
    return read_parallel(data.eval_src, data.eval_tgt)
  raise DataError(f"data.source={data.source!r} ({data.tfds_name}) is not readable yet: TFDS WMT "
                  "loading is not implemented in this version; use data.source='files' with "
                  "data.train_src/train_tgt/eval_src/eval_tgt pointing at prepared text files")
