"""Where sentence pairs come from: the bundled Multi30k, any parallel text files, or TFDS.

`open_split` gives random access to a split's pairs (`len(source)`, `source.read(indices)`), which is
all the training pipeline needs: a ParallelText held in memory for text files, or a `TfdsPairs` view
of a TFDS dataset prepared in the array_record format and read through `tfds.data_source` (no
TensorFlow, nothing loaded up front; WMT14 En-Fr has 40M pairs). `load_split` reads a whole split into
memory, for evaluation. Problems with the data (missing files or dataset, unequal line counts, invalid
UTF-8) raise `DataError` naming the file and line, or the command that prepares the dataset.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import ml_collections
from etils import epath

from transformer.data import pretokenize
from transformer.data.text_files import (
  ConcatenatedPairs,
  DataError,
  ParallelText,
  TextFilePairs,
  read_parallel,
)
from transformer.errors import ConfigError
from transformer.keys import Key

BUNDLED_DIR = Path(__file__).parent / "multi30k"
MULTI30K_SPLITS = {"train": "train", "validation": "val", "val": "val"}
MULTI30K_TEST_URLS = {  # not bundled; for users with a network.
    "test_2016_flickr": "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2016_flickr.{lang}.gz",
    "test_2017_flickr": "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2017_flickr.{lang}.gz",
    "test_2017_mscoco": "https://github.com/multi30k/dataset/raw/master/data/task1/raw/test_2017_mscoco.{lang}.gz",
}


# C0 and C1 control characters but the line end: tabs, carriage returns inside a line, NULs, escapes.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def normalise_controls(lines: Sequence[str]) -> tuple[list[str], int]:
  """`lines` with every control character (tab, carriage return, NUL, ...; C0 and C1) replaced by a
  space, and how many lines had one. SentencePiece's identity rule would otherwise keep them as
  pieces of their own ('\t' in a corpus's vocabulary); as spaces, they merge with their neighbours.
  Everything that encodes text applies it: the vocabulary's sample, the token cache, BPE-dropout,
  translation and scoring."""
  out, changed = [], 0
  for line in lines:
    if _CONTROL.search(line):
      line, changed = _CONTROL.sub(" ", line), changed + 1
    out.append(line)
  return out, changed


class TfdsPairs:
  """Random access to one split of a prepared TFDS translation dataset, in a chosen direction.

  TFDS translation datasets are dicts keyed by language code; their `supervised_keys` (e.g. de -> en
  for wmt14_translate/de-en) are ignored: the direction is `src_lang` -> `tgt_lang`.
  """

  def __init__(self, name: str, split: str, data_dir: str | None, src_lang: str, tgt_lang: str):
    builder = prepared_builder(name, data_dir)
    languages = tuple(builder.info.features.keys())
    for lang in (src_lang, tgt_lang):
      if lang not in languages:
        raise DataError(f"{name} has languages {', '.join(languages)}, not {lang!r}; check "
                        "config.data.src_lang and config.data.tgt_lang")
    if split not in builder.info.splits:
      raise DataError(f"{name} has splits {', '.join(builder.info.splits)}, not {split!r}")
    self._data = builder.as_data_source(split=split)
    self.src_lang, self.tgt_lang = src_lang, tgt_lang
    self.name = f"{name}[{split}] {src_lang}->{tgt_lang}"

  def __len__(self) -> int:
    return len(self._data)

  def read(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
    records = self._data.__getitems__([int(i) for i in indices])
    text = lambda value: value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return ([text(r[self.src_lang]) for r in records], [text(r[self.tgt_lang]) for r in records])


def split_tfds_name(data: ml_collections.ConfigDict, split: str) -> str:
  """The TFDS dataset a split is read from (evaluation may use another: data.eval_tfds_name)."""
  return data.tfds_name if split == data.train_split else (data.eval_tfds_name or data.tfds_name)


def data_dir_key(data_dir: str) -> str:
  """The TFDS data directory as caches name it: absolute where local, gs:// as it is."""
  where = tfds_data_dir(data_dir)
  return where if "://" in where else os.path.abspath(where)


def tfds_data_dir(data_dir: str) -> str:
  """The TFDS data directory (local or gs://): the config's, else $TFDS_DATA_DIR, else
  ~/tensorflow_datasets."""
  return os.path.expanduser(data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")


def prepare_command(name: str, data_dir: str) -> str:
  return f"python -m transformer.training.prepare {name} --data_dir={data_dir}"


def import_tfds(name: str):
  """tensorflow_datasets, imported on first use (text-file runs do not pay for it); a DataError
  naming `name` where it does not import (a partial environment such as an accelerator image, not a
  pip install of this package)."""
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise DataError(f"TFDS dataset {name!r} needs tensorflow-datasets, which does not import here "
                    f"({e}): pip install 'tensorflow-datasets>=4.9.7' (a dependency of this package)"
                    ) from None
  return tfds


def prepared_builder(name: str, data_dir: str | os.PathLike | None):
  """The TFDS builder of `name` if it is prepared in the array_record format; else a DataError that
  says what to run. Checks files only, so it answers in well under a second without a network."""
  tfds = import_tfds(name)
  data_dir = tfds_data_dir(str(data_dir or ""))
  try:
    builder = tfds.builder(name, data_dir=str(data_dir))
  except Exception as e:  # noqa: BLE001  unknown dataset or config name
    raise DataError(f"unknown TFDS dataset {name!r} ({type(e).__name__}: {str(e).splitlines()[0]})"
                    ) from None
  info_file = epath.Path(builder.data_path) / "dataset_info.json"  # epath: gs:// works too
  if not info_file.exists():
    raise DataError(f"{name} is not prepared in {data_dir} (no {info_file}); prepare it once with "
                    f"`{prepare_command(name, data_dir)}` on a machine with network access, or point "
                    "config.data.tfds_data_dir (or $TFDS_DATA_DIR) at a directory that has it")
  if builder.info.file_format.value != "array_record":
    raise DataError(f"{name} in {data_dir} is prepared as {builder.info.file_format.value}, which has "
                    f"no random access; prepare it again with `{prepare_command(name, data_dir)}`")
  return builder

# ------------------------------------------------------------------------- the kinds of source

class Source:
  """A kind of corpus `config.data.source` names. Everything that depends on the kind asks it: its
  own config keys (`keys`: data.<name>, with defaults; `fixed` ones a resumed run must keep), the
  config's checks, random access to a split, the names of the vocabulary's and token caches'
  entries, and what `prepare` downloads. A new kind is a subclass here and its line in SOURCES."""
  name: ClassVar[str]
  keys: ClassVar[tuple[Key, ...]] = ()

  def check(self, data: ml_collections.ConfigDict) -> None:
    """Raises ConfigError where the config's data section cannot work with this kind."""

  def check_files(self, data: ml_collections.ConfigDict, split: str) -> None:
    """Raises DataError where the split's data is missing or unreadable, in well under a second
    (metadata and a byte or two; `open` then finds whether the files pair up)."""

  def open(self, data: ml_collections.ConfigDict, split: str
           ) -> TfdsPairs | TextFilePairs | ConcatenatedPairs:
    raise NotImplementedError

  def load(self, data: ml_collections.ConfigDict, split: str) -> ParallelText:
    pairs = self.open(data, split)
    source, target = pairs.read(range(len(pairs)))
    return ParallelText(source, target, name=pairs.name)

  def identity(self, data: ml_collections.ConfigDict, split: str) -> tuple[str, str]:
    """(a short name for a cache directory, the full identity a cache's fingerprint holds)."""
    raise NotImplementedError

  def vocabulary_key(self, data: ml_collections.ConfigDict) -> str:
    """Names the training data in the vocabulary cache's file names."""
    raise NotImplementedError

  def downloads(self, data: ml_collections.ConfigDict) -> list[str]:
    """The TFDS datasets `python -m transformer.training.prepare --config` downloads."""
    return []


class TextSource(Source):
  """Parallel text files, one sentence per line (optionally gzipped)."""

  def files(self, data: ml_collections.ConfigDict, split: str) -> list[tuple[Path, Path]]:
    """The split's (source, target) file pairs, read one after the other."""
    raise NotImplementedError

  def check_files(self, data, split):
    for path in (path for pair in self.files(data, split) for path in pair):
      if not path.is_file():
        raise DataError(f"data file not found: {path} (the {split} split)")
      try:
        with open(path, "rb") as f:
          f.read(1)
      except OSError as e:
        raise DataError(f"cannot read {path} (the {split} split): {e.strerror}") from None

  def open(self, data, split):
    parts = [TextFilePairs(*pair) for pair in self.files(data, split)]
    return parts[0] if len(parts) == 1 else ConcatenatedPairs(parts)

  def load(self, data, split):
    parts = [read_parallel(*pair) for pair in self.files(data, split)]
    return ParallelText([s for part in parts for s in part.source],
                        [t for part in parts for t in part.target],
                        name=" + ".join(part.name for part in parts))


class Multi30kSource(TextSource):
  """The bundled Multi30k (English, German, French): train and validation."""
  name = "multi30k"

  def files(self, data, split):
    if split not in MULTI30K_SPLITS:
      known = ", ".join(sorted(MULTI30K_SPLITS))
      raise DataError(f"the bundled Multi30k has splits {known}, not {split!r}; for the test sets "
                      f"({', '.join(MULTI30K_TEST_URLS)}) download them and use data.source='files'")
    stem = MULTI30K_SPLITS[split]
    for lang in (data.src_lang, data.tgt_lang):
      if not (BUNDLED_DIR / f"{stem}.{lang}.gz").is_file():
        raise DataError(f"the bundled Multi30k has languages en, de, fr; not {lang!r} "
                        "(use data.source='files' for other pairs)")
    return [(BUNDLED_DIR / f"{stem}.{data.src_lang}.gz",
             BUNDLED_DIR / f"{stem}.{data.tgt_lang}.gz")]

  def identity(self, data, split):
    pair = f"{split}.{data.src_lang}-{data.tgt_lang}"
    return f"multi30k.{pair}", f"multi30k {pair}"

  def vocabulary_key(self, data):
    return "multi30k"


class FilesSource(TextSource):
  """The user's own files: data.train_src/train_tgt and data.eval_src/eval_tgt, each one file or
  several joined by commas (the n-th source file aligned with the n-th target file), read in order
  as one corpus: a corpus and its synthetic copy, say, without writing their concatenation."""
  name = "files"
  keys = (Key("train_src", "", "for source='files': parallel text, one sentence per line "
              "(several files: comma-separated, aligned with train_tgt's)", fixed=True),
          Key("train_tgt", "", "", fixed=True),
          Key("eval_src", "", ""),
          Key("eval_tgt", "", ""))

  def check(self, data):
    for key in ("train_src", "train_tgt", "eval_src", "eval_tgt"):
      if not data[key]:
        raise ConfigError(f"config.data.{key} must name a text file when config.data.source='files'")
    for side in ("train", "eval"):
      src, tgt = (_listed(data[f"{side}_{end}"]) for end in ("src", "tgt"))
      if len(src) != len(tgt):
        raise ConfigError(f"config.data.{side}_src names {len(src)} file(s) but "
                          f"config.data.{side}_tgt names {len(tgt)}; name one target file for "
                          "each source file, in the same order, joined by commas")

  def files(self, data, split):
    side = "train" if split == data.train_split else "eval"
    return list(zip(_listed(data[f"{side}_src"]), _listed(data[f"{side}_tgt"])))

  def identity(self, data, split):
    pair = f"{split}.{data.src_lang}-{data.tgt_lang}"
    files = [str(f.absolute()) for both in self.files(data, split) for f in both]
    stats = [(f, Path(f).stat().st_size, Path(f).stat().st_mtime_ns) if Path(f).is_file() else (f,)
             for f in files]
    return (f"files-{hashlib.sha256(repr(files).encode()).hexdigest()[:12]}.{pair}",
            f"files {stats} {pair}")

  def vocabulary_key(self, data):
    stats = [(str(f.absolute()), f.stat().st_size, f.stat().st_mtime_ns)
             for f in _listed(data.train_src) + _listed(data.train_tgt) if f.is_file()]
    return "files-" + hashlib.sha256(repr(stats).encode()).hexdigest()[:12]


def _listed(files: str) -> list[Path]:
  """The files a data.*_src / *_tgt value names: one path, or several joined by commas."""
  return [Path(f.strip()) for f in files.split(",") if f.strip()]


class TfdsSource(Source):
  """A TFDS dataset prepared as array_record, read through `tfds.data_source` (no TensorFlow)."""
  name = "tfds"
  keys = (Key("tfds_name", "", "for source='tfds', e.g. 'wmt14_translate/de-en'", fixed=True),
          Key("eval_tfds_name", "", "evaluate on another TFDS dataset ('' = tfds_name)"),
          Key("tfds_data_dir", "", "'' = $TFDS_DATA_DIR or ~/tensorflow_datasets"))

  def check(self, data):
    if not data.tfds_name:
      raise ConfigError("config.data.tfds_name must be set when config.data.source='tfds'")

  def check_files(self, data, split):
    name = split_tfds_name(data, split)
    splits = prepared_builder(name, data.tfds_data_dir).info.splits
    if split not in splits:
      raise DataError(f"{name} has splits {', '.join(splits)}, not {split!r}")

  def open(self, data, split):
    return TfdsPairs(split_tfds_name(data, split), split, data.tfds_data_dir, data.src_lang,
                     data.tgt_lang)

  def identity(self, data, split):
    pair = f"{split}.{data.src_lang}-{data.tgt_lang}"
    name, data_dir = split_tfds_name(data, split), data_dir_key(data.tfds_data_dir)
    where = hashlib.sha256(data_dir.encode()).hexdigest()[:8]
    return f"{name}-{where}.{pair}".replace("/", "_"), f"tfds {name} {data_dir} {pair}"

  def vocabulary_key(self, data):
    data_dir = data_dir_key(data.tfds_data_dir)
    return f"{data.tfds_name}-{hashlib.sha256(data_dir.encode()).hexdigest()[:8]}"

  def downloads(self, data):
    return [data.tfds_name] + ([data.eval_tfds_name] if data.eval_tfds_name else [])


SOURCES: dict[str, Source] = {s.name: s for s in (Multi30kSource(), FilesSource(), TfdsSource())}


def all_keys() -> tuple[Key, ...]:
  """Every kind's own data keys, in SOURCES' order (config.base_config adds them all)."""
  return tuple(key for source in SOURCES.values() for key in source.keys)


def source_of(data: ml_collections.ConfigDict) -> Source:
  """The kind of source the config's data section names; an unknown one is a ConfigError."""
  if data.source not in SOURCES:
    raise ConfigError(f"config.data.source must be one of {', '.join(map(repr, SOURCES))}; "
                      f"got {data.source!r}")
  return SOURCES[data.source]


def open_split(data: ml_collections.ConfigDict, split: str
               ) -> TfdsPairs | TextFilePairs | ConcatenatedPairs | pretokenize.PretokenizedPairs:
  """Random access to the pairs of `split` for the config's source, in the run's text form
  (data.pretokenize): what training reads. Nothing is read up front (text files are mapped, their
  line ends indexed)."""
  pairs = source_of(data).open(data, split)
  form = pretokenize.text_form(data)
  return pairs if form.kind == "none" else pretokenize.PretokenizedPairs(pairs, form)


def text_identity(data: ml_collections.ConfigDict) -> str:
  """What the text form adds to the names and fingerprints of caches made from the text."""
  kind = pretokenize.text_form(data).kind
  return "" if kind == "none" else f".pretokenize-{kind}"


def load_split(data: ml_collections.ConfigDict, split: str) -> ParallelText:
  """All sentence pairs of `split` ('train', the config's eval split, ...) in memory, as given (the
  evaluation's sources and references; the translator puts them in the run's text form)."""
  return source_of(data).load(data, split)
