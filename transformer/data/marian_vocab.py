"""Marian's vocabulary (the OPUS-MT models'): a SentencePiece model per side, `source.spm` and
`target.spm`, whose pieces are numbered by one joint map (`vocab.json`), not by the models.

A run imported from a Marian model keeps the three as one file, WORKDIR/vocab.marian (JSON: the
pieces in our id order and both models' bytes), so that everything that names a run's vocabulary
by one path (the token caches' fingerprints, copies into new runs, ensembles' comparisons) works as
with vocab.model. `MarianVocab` answers the calls the data pipeline, the searches and the exports
make of a SentencePieceProcessor: `encode` and `decode` of its `source` and `target` sides (and of
itself: source for `encode`, target for `decode`), `id_to_piece`, `get_piece_size`. Encoding is
MarianTokenizer's: the side's model cuts the text into pieces, the joint map numbers them, a piece
it lacks is unknown; a leading language code (`>>de<<`, multilingual models' target tag) is one
piece. Decoding drops the special pieces and joins the rest with the target model, each word-start
mark it leaves a space, as MarianTokenizer decodes.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from transformer.data.sources import DataError
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

MARIAN_VOCAB_FILE = "vocab.marian"
FORMAT = "transformer/marian-vocabulary/1"
_LANGUAGE_CODE = re.compile(r"^(>>[^<>\s]+<<)\s*")
WORD_BOUNDARY = "\u2581"  # SentencePiece's word-start mark


class MarianSide:
  """One side's SentencePiece model, its pieces numbered by the joint map."""

  def __init__(self, model: bytes, ids: dict[str, int], pieces: Sequence[str], specials: set[int]):
    self.model = spm.SentencePieceProcessor(model_proto=model)
    self.ids, self.pieces, self.specials = ids, pieces, specials

  def _encode_one(self, text: str, **sampling: Any) -> list[int]:
    match = _LANGUAGE_CODE.match(text)
    code = [self.ids.get(match.group(1), UNK_ID)] if match else []
    text = text[match.end():] if match else text
    return code + [self.ids.get(p, UNK_ID) for p in self.model.encode(text, out_type=str,
                                                                       **sampling)]

  def encode(self, text: str | Sequence[str], enable_sampling: bool = False, alpha: float = 0.1,
             nbest_size: int = -1, num_threads: int = 1) -> list[int] | list[list[int]]:
    """Ids of `text` (a sentence or a list of them), no EOS; with `enable_sampling`, one of the
    segmentations SentencePiece samples (BPE-dropout at `alpha`), as for a shared model. One
    sentence at a time (`num_threads` is SentencePieceProcessor's argument, kept for its callers)."""
    sampling = dict(enable_sampling=True, alpha=alpha, nbest_size=nbest_size) if enable_sampling else {}
    if isinstance(text, str):
      return self._encode_one(text, **sampling)
    return [self._encode_one(t, **sampling) for t in text]

  def decode(self, ids: Sequence[int]) -> str:
    """MarianTokenizer's decoding: the side's model joins the pieces, and a word boundary it
    leaves (on a piece only the other side's model has: names, numbers, copied words in a joint
    vocabulary) becomes a space."""
    text = self.model.decode_pieces([self.pieces[int(i)] for i in ids
                                     if int(i) not in self.specials])
    return text.replace(WORD_BOUNDARY, " ").strip()

  def serialized_model_proto(self) -> bytes:
    """The side's SentencePiece model, as a SentencePieceProcessor gives its own."""
    return self.model.serialized_model_proto()


class MarianVocab:
  """Both sides over one id map (see the module's docstring); `bundle` is the file's bytes."""

  def __init__(self, bundle: bytes, where: str = "the vocabulary"):
    try:
      content = json.loads(bundle)
      if content.get("format") != FORMAT:
        raise ValueError(f"format {content.get('format')!r}, not {FORMAT!r}")
      pieces = list(content["pieces"])
      source, target = (base64.b64decode(content[k]) for k in ("source_spm", "target_spm"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise DataError(f"{where} is not a Marian vocabulary written by transformer-import ({e})"
                      ) from None
    ids = {piece: i for i, piece in enumerate(pieces)}
    specials = {PAD_ID, EOS_ID, UNK_ID} | ({BOS_ID} if content.get("bos") else set())
    try:
      self.source = MarianSide(source, ids, pieces, specials)
      self.target = MarianSide(target, ids, pieces, specials)
    except RuntimeError as e:
      raise DataError(f"{where} holds a SentencePiece model that does not load ({e})") from None
    self.pieces, self.bundle = pieces, bundle

  def encode(self, text, **kwargs):
    return self.source.encode(text, **kwargs)

  def decode(self, ids: Sequence[int]) -> str:
    return self.target.decode(ids)

  def id_to_piece(self, i: int) -> str:
    return self.pieces[int(i)]

  def get_piece_size(self) -> int:
    return len(self.pieces)

  def serialized_model_proto(self) -> bytes:
    """The file's bytes: what two runs' vocabularies are compared by (vocab.same_vocabulary)."""
    return self.bundle


def write_marian_vocab(path: str | os.PathLike, pieces: Sequence[str], source_spm: bytes,
                       target_spm: bytes, bos: bool) -> None:
  """Writes the bundle: `pieces` in our id order (PAD, EOS, [BOS where `bos`], UNK at their ids)."""
  Path(path).write_text(json.dumps({
      "format": FORMAT, "bos": bos, "pieces": list(pieces),
      "source_spm": base64.b64encode(source_spm).decode("ascii"),
      "target_spm": base64.b64encode(target_spm).decode("ascii")}, ensure_ascii=False) + "\n")


def side(vocab: Any, name: str) -> Any:
  """The `name` ('source' or 'target') side of a vocabulary: a Marian one's own, else the shared
  SentencePiece model itself."""
  return getattr(vocab, name, vocab)
