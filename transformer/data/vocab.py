"""The shared source/target SentencePiece vocabulary, trained once per run and kept in the workdir.

SentencePiece (not a hand-written BPE) because it is what t2t and the Flax example use, it trains in
seconds on Multi30k, and it detokenizes losslessly, so BLEU is computed on real text.
Special ids are fixed so the model can rely on them: 0 pad, 1 EOS, 2 BOS, 3 unknown.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Sequence

import sentencepiece as spm

from transformer.data.sources import DataError
from transformer.model import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger("transformer")

VOCAB_FILE = "vocab.model"


def train_vocab(sentences: Sequence[str], path: str | os.PathLike, vocab_size: int,
                model_type: str = "bpe", max_sentences: int = 2_000_000, seed: int = 0
                ) -> spm.SentencePieceProcessor:
  """Trains a SentencePiece model on a uniform random sample of `sentences`, saves it at `path`."""
  path = Path(path)
  sample = list(sentences)
  if len(sample) > max_sentences:
    sample = random.Random(seed).sample(sample, max_sentences)
  sample = [s for s in sample if s.strip()]
  if not sample:
    raise DataError("cannot train a vocabulary: the training data has no non-empty lines")
  prefix = path.with_suffix("")
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_prefix=str(prefix), vocab_size=vocab_size,
        model_type=model_type, character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
        bos_id=BOS_ID, unk_id=UNK_ID, num_threads=os.cpu_count() or 1, minloglevel=2,
        hard_vocab_limit=True)
  except RuntimeError as e:
    raise DataError(f"SentencePiece could not build a vocabulary of {vocab_size} pieces "
                    f"({str(e).strip()}); lower config.data.vocab_size") from None
  prefix.with_suffix(".vocab").unlink(missing_ok=True)  # the human-readable copy; not needed.
  log.info("Trained a %d-piece %s vocabulary on %d sentences: %s", vocab_size, model_type,
               len(sample), path)
  return load_vocab(path)


def load_vocab(path: str | os.PathLike) -> spm.SentencePieceProcessor:
  if not Path(path).is_file():
    raise DataError(f"vocabulary file not found: {path}")
  return spm.SentencePieceProcessor(model_file=str(path))


def vocab_for_run(workdir: str | os.PathLike, sentences: Sequence[str], vocab_size: int,
                  model_type: str, max_sentences: int, seed: int) -> spm.SentencePieceProcessor:
  """The run's vocabulary: reused from `workdir` if present (resume), else trained and saved there."""
  path = Path(workdir) / VOCAB_FILE
  if path.is_file():
    vocab = load_vocab(path)
    if vocab.get_piece_size() != vocab_size:
      raise DataError(f"{path} has {vocab.get_piece_size()} pieces but config.data.vocab_size is "
                      f"{vocab_size}; use a new workdir or the original vocabulary size")
    return vocab
  return train_vocab(sentences, path, vocab_size, model_type, max_sentences, seed)
