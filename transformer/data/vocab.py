"""The shared source/target SentencePiece vocabulary: trained once per dataset, cached, copied to runs.

SentencePiece (not a hand-written BPE) because it is what t2t and the Flax example use, it trains in
seconds on Multi30k, and it detokenizes back to the text it was given, so BLEU is computed on real
text. Vocabularies use identity normalisation by default (`data.vocab_normalization`; SentencePiece's
default, NFKC, rewrites text: 'ﬁ' becomes 'fi', full-width letters narrow); only runs of spaces
become one space. A case-folding rule ('nmt_nfkc_cf') lowercases both sides as they are encoded, so
the model reads and writes lowercased text, as the multimodal-MT literature trains.
Special ids are fixed so the model can rely on them: 0 pad, 1 EOS, 2 BOS, 3 unknown.

It is trained on a uniform random sample of `data.vocab_sample_sentences` training pairs (both sides),
not the head of the corpus, and stored in a cache keyed by dataset (TFDS data directory or files'
fingerprint included), training split, languages, size, model type, normalisation, and the sample:
its size and seed, or 'allpairs' where the corpus has no more pairs than the sample would take (then
every seed trains the same vocabulary: Multi30k's 29,000 pairs), in `data.vocab_cache_dir`, default
~/.cache/transformer/vocab. So every run on a dataset reuses the same file; each run keeps a copy as
WORKDIR/vocab.model, which evaluation reads.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_collections
import numpy as np
import sentencepiece as spm

from transformer.data import sources
from transformer.data.marian_vocab import MARIAN_VOCAB_FILE, MarianVocab
from transformer.data.sources import DataError
from transformer.files import (
  exclusive,
  partial_directory,
  remove_stale_partials,
  user_cache_dir,
  writable_directory,
  write_atomically,
)
from transformer.hardware import usable_cpus
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger("transformer")

VOCAB_FILE = "vocab.model"


def train_vocab(sentences: Sequence[str], path: str | os.PathLike, vocab_size: int,
                model_type: str = "bpe", normalization: str = "identity",
                setting: str = "config.data.vocab_cache_dir") -> spm.SentencePieceProcessor:
  """Trains a SentencePiece model on `sentences` with the `normalization` rule and saves it at
  `path` (atomically), without the record of how it was trained (`reproducible`): the same
  sentences and settings give the same bytes on any machine. `setting` names what moves `path`
  (in the error a read-only or full directory gives)."""
  path = Path(path)
  sample = [s for s in sentences if s.strip()]
  if not sample:
    raise DataError("cannot train a vocabulary: the training data has no non-empty lines")
  writable_directory(path.parent, setting)
  remove_stale_partials(path, "the vocabulary")
  tmp = partial_directory(path)  # a kill -9 leaves it to the next training's remove_stale_partials
  try:
    prefix = tmp / "spm"
    try:
      _in_a_thread(lambda: spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sample), model_prefix=str(prefix), vocab_size=vocab_size,
          model_type=model_type, character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
          bos_id=BOS_ID, unk_id=UNK_ID, num_threads=usable_cpus(), minloglevel=2,
          hard_vocab_limit=True, input_sentence_size=len(sample),
          normalization_rule_name=normalization))
    except RuntimeError as e:
      if "output->Write" in str(e) or shutil.disk_usage(path.parent).free < 2**20:
        raise DataError(f"could not write the vocabulary in {path.parent}: the disk is full; free "
                        f"space or point {setting} elsewhere") from None
      raise DataError(f"SentencePiece could not build a vocabulary of {vocab_size} pieces "
                      f"({str(e).strip()}); lower config.data.vocab_size") from None
    model = prefix.with_suffix(".model")
    model.write_bytes(reproducible(model.read_bytes()))
    os.replace(model, path)  # concurrent runs never see a partial file
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  log.info("Trained a %d-piece %s vocabulary on %d sentences: %s", vocab_size, model_type,
           len(sample), path)
  return load_vocab(path)


def _in_a_thread(train: Callable[[], None]) -> None:
  """Runs `train` (SentencePiece's, which releases the GIL) in a thread while the main thread
  waits in short steps, so a SIGTERM is handled at once (stops.py) rather than when SentencePiece
  returns, tens of seconds later on WMT's sample; the abandoned thread ends with the process."""
  failure: list[BaseException] = []

  def target() -> None:
    try:
      train()
    except BaseException as e:  # noqa: BLE001  (raised again in the main thread)
      failure.append(e)
  thread = threading.Thread(target=target, daemon=True, name="sentencepiece")
  thread.start()
  while thread.is_alive():
    thread.join(0.2)
  if failure:
    raise failure[0]


def reproducible(model: bytes) -> bytes:
  """A SentencePiece model's bytes without the training record (`_TRAINING_RECORD`: the temporary
  path, the thread count), serialised deterministically: a vocabulary trained twice on the same
  sentences and settings is then the same file, and the token caches named by its hash keep their
  names. The pieces, scores and every setting that decides the encoding are untouched. Unchanged
  (with a warning) where SentencePiece's protobuf module cannot be read."""
  proto_module = _model_proto()
  if proto_module is None:
    log.warning("cannot read SentencePiece models with this protobuf; the vocabulary file keeps "
                "its training record (two trainings give different bytes)")
    return model
  proto = proto_module.ModelProto.FromString(model)
  for field in _TRAINING_RECORD:
    proto.trainer_spec.ClearField(field)
  return proto.SerializeToString(deterministic=True)


def _model_proto():
  """SentencePiece's generated protobuf module, or None where this protobuf runtime refuses it."""
  try:
    from sentencepiece import sentencepiece_model_pb2
  except Exception:  # ImportError, or protobuf's VersionError for an older runtime  # noqa: BLE001
    return None
  return sentencepiece_model_pb2


def load_vocab(path: str | os.PathLike) -> spm.SentencePieceProcessor | MarianVocab:
  """A SentencePiece model, or an imported Marian model's two (a .marian bundle: marian_vocab.py)."""
  if not Path(path).is_file():
    raise DataError(f"vocabulary file not found: {path}")
  if Path(path).suffix == ".marian":
    return MarianVocab(Path(path).read_bytes(), str(path))
  try:
    return spm.SentencePieceProcessor(model_file=str(path))
  except (RuntimeError, OSError) as e:
    raise DataError(f"{path} is not a SentencePiece model ({str(e).strip().splitlines()[0]})"
                    ) from None


# Fields of a SentencePiece model that record how it was trained, not how it encodes: the temporary
# path it was written to, the input files and the trainer's thread count.
_TRAINING_RECORD = ("model_prefix", "input", "num_threads")


def same_vocabulary(a: spm.SentencePieceProcessor, b: spm.SentencePieceProcessor) -> bool:
  """Whether `a` and `b` encode and decode alike: the same model once the training record is left
  out (two runs' vocabularies trained on the same sentences differ only in it, e.g. in the temporary
  `model_prefix`, so comparing the files' bytes would call them different).

  Reading the model needs SentencePiece's generated protobuf module, which refuses a protobuf
  runtime older than the one it was generated for; with such a runtime the files' bytes are
  compared instead (stricter: never calls two different vocabularies the same)."""
  if isinstance(a, MarianVocab) or isinstance(b, MarianVocab):
    return a.serialized_model_proto() == b.serialized_model_proto()
  if _model_proto() is None:
    log.warning("cannot read SentencePiece models with this protobuf; comparing vocabularies "
                "byte for byte")
    return a.serialized_model_proto() == b.serialized_model_proto()
  return (reproducible(a.serialized_model_proto())
          == reproducible(b.serialized_model_proto()))


def run_vocab_path(workdir: str | os.PathLike) -> Path:
  """The run's vocabulary file: WORKDIR/vocab.model, or an imported Marian model's vocab.marian."""
  marian = Path(workdir) / MARIAN_VOCAB_FILE
  return marian if marian.is_file() else Path(workdir) / VOCAB_FILE


def load_run_vocab(workdir: str | os.PathLike, data: ml_collections.ConfigDict
                   ) -> spm.SentencePieceProcessor | MarianVocab:
  """The run's vocabulary (`run_vocab_path`), checked against its config.data.vocab_size (the
  number of embedding rows in its checkpoints)."""
  path = run_vocab_path(workdir)
  if not path.is_file():
    raise DataError(f"vocabulary file not found: {path}; a run's checkpoints need the vocabulary "
                    "they were trained with: copy that run's vocab.model back")
  vocab = load_vocab(path)
  if vocab.get_piece_size() != data.vocab_size:
    raise DataError(f"{path} has {vocab.get_piece_size()} pieces, but config.data.vocab_size is "
                    f"{data.vocab_size}: it is not this run's vocabulary; copy the run's own "
                    "vocab.model back, or use a new workdir")
  return vocab


def sample_sentences(source, num_pairs: int, seed: int) -> list[str]:
  """Both sides of `num_pairs` pairs drawn uniformly without replacement (all pairs if fewer), their
  control characters spaces (as the token cache encodes them)."""
  n = len(source)
  indices = (np.arange(n) if n <= num_pairs else
             np.sort(np.random.default_rng(seed).choice(n, num_pairs, replace=False)))
  src, tgt = source.read(indices)
  return sources.normalise_controls(src + tgt)[0]


def dataset_key(data: ml_collections.ConfigDict) -> str:
  """Names the training data (its source's `vocabulary_key`), the training split, the languages and
  the text form."""
  name = sources.source_of(data).vocabulary_key(data)
  return (f"{name}.{data.train_split}.{data.src_lang}-{data.tgt_lang}{sources.text_identity(data)}"
          .replace("/", "_"))


def cache_dir(data: ml_collections.ConfigDict) -> Path:
  return Path(data.vocab_cache_dir).expanduser() if data.vocab_cache_dir else user_cache_dir("vocab")


def cached_vocab_path(data: ml_collections.ConfigDict, seed: int, corpus_pairs: int) -> Path:
  """The cache entry of this dataset and setting; `corpus_pairs` (the training split's size) decides
  whether the seed draws a sample at all."""
  sample = (f"sample{data.vocab_sample_sentences}.seed{seed}"
            if corpus_pairs > data.vocab_sample_sentences else "allpairs")
  return cache_dir(data) / (f"{dataset_key(data)}.{data.vocab_model_type}{data.vocab_size}"
                            f".{data.vocab_normalization}.{sample}.model")


def vocab_for_run(workdir: str | os.PathLike, data: ml_collections.ConfigDict, source,
                  seed: int, corpus_pairs: int | None = None) -> spm.SentencePieceProcessor:
  """The run's vocabulary: WORKDIR's if present (resume, or a run started from another's
  parameters); else a copy of the one for this dataset and setting (`cached_vocab`)."""
  path = Path(workdir) / VOCAB_FILE
  if run_vocab_path(workdir).is_file():
    return load_run_vocab(workdir, data)
  write_atomically(path, cached_vocab(data, source, seed, corpus_pairs).read_bytes())
  return load_vocab(path)


def given_vocab(data: ml_collections.ConfigDict) -> Path:
  """`data.vocab_file` (a SentencePiece model, or a run folder's vocab.model), checked: runs given
  one file share their vocabulary whatever text they train on, so they can be ensembled."""
  path = Path(data.vocab_file)
  if path.is_dir():
    path = run_vocab_path(path)
  if path.suffix == ".marian":
    raise DataError(f"config.data.vocab_file={data.vocab_file} is an imported Marian model's "
                    "vocabulary; start from that run with config.train.init_from instead")
  if not path.is_file():
    raise DataError(f"config.data.vocab_file={data.vocab_file}: no such file (give a SentencePiece "
                    "model, or a run folder with its vocab.model)")
  size = load_vocab(path).get_piece_size()  # DataError where not SentencePiece's
  if size != data.vocab_size:
    raise DataError(f"config.data.vocab_file={data.vocab_file} has {size} pieces, but "
                    f"config.data.vocab_size is {data.vocab_size}: set "
                    f"--config.data.vocab_size={size}")
  log.info("Using the vocabulary %s (config.data.vocab_file)", path)
  return path


def cached_vocab(data: ml_collections.ConfigDict, source, seed: int,
                 corpus_pairs: int | None = None) -> Path:
  """The vocabulary for this dataset and setting: `data.vocab_file` where given, else the cached
  one, trained on a sample of `source` if absent. `source` is the training split or a function that
  opens it; with the split's size known (`corpus_pairs`) it is opened only when a vocabulary must
  be trained."""
  if data.vocab_file:
    return given_vocab(data)
  if corpus_pairs is None:
    source = source() if callable(source) else source
    corpus_pairs = len(source)
  cached = cached_vocab_path(data, seed, corpus_pairs)
  if cached.is_file():
    log.info("Reusing the cached vocabulary %s", cached)
    return cached
  setting = "config.data.vocab_cache_dir"
  writable_directory(cached.parent, setting)
  # Processes preparing the same corpus at once (a grid's runs, hosts on one shared disk): the
  # first trains it, the others wait and then reuse it.
  with exclusive(cached.with_name(f".{cached.name}.lock"), f"the vocabulary {cached.name}"):
    if cached.is_file():
      log.info("Reusing the vocabulary %s, which another process has just trained", cached)
      return cached
    source = source() if callable(source) else source
    sentences = sample_sentences(source, data.vocab_sample_sentences, seed)
    train_vocab(sentences, cached, data.vocab_size, data.vocab_model_type, data.vocab_normalization,
                setting)
  return cached
