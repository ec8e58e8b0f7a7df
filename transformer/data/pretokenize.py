"""The text a run reads and writes: as given, or the Multi30k release's lowercased, tokenized form.

`config.data.pretokenize = 'multi30k'` trains on both sides as the release made its
`*.lc.norm.tok.*` files (`multi30k_tokenize`: lowercased, punctuation normalised, Moses-tokenized),
which is how the multimodal-MT literature trains its text-only baselines; the subword vocabulary is
then learnt on that text. Every reader of the training data (vocabulary sample, token cache,
BPE-dropout) gets it through `sources.open_split`, and the programs that translate
(transformer-eval, transformer-translate) take raw sentences in and give readable text out: the
source is tokenized as in training and the model's tokenized output is Moses-detokenized
(sacremoses), so every score computes as for any other run. `multi30k_tokenize` of that
detokenized output gives back the model's own tokens (all but one of 63,042 lines of the release's
text round-trip exactly: the validation sets and 20,000 training lines of each language, the one a
training line with a double space; tests/test_pretokenize.py checks the validation sets), so the
lowercased, tokenized BLEU of such a run is the literature's BLEU of its raw output.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import ml_collections

if TYPE_CHECKING:
  from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

PRETOKENIZERS = ("none", "multi30k")
QUOTE_IN_WORD = re.compile(r"([a-z])[‘’]([a-z])")  # Moses 3a0631a's rule: ASCII letters only


@functools.lru_cache(maxsize=8)
def moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
  """sacremoses' punctuation normaliser and tokenizer for `lang` (made once: they compile regexes;
  imported here, where the first text is tokenized, so that programs start without it)."""
  from sacremoses import MosesPunctNormalizer, MosesTokenizer
  return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


@functools.lru_cache(maxsize=8)
def _detokenizer(lang: str) -> MosesDetokenizer:
  from sacremoses import MosesDetokenizer
  return MosesDetokenizer(lang=lang)


def multi30k_tokenize(sentence: str, lang: str) -> str:
  """The Multi30k release's `*.lc.norm.tok.*` preprocessing: lowercased, punctuation normalised and
  Moses-tokenized by sacremoses' ports of the perl scripts, with two things the release's Moses
  (3a0631a) did that sacremoses does not: a single quote mark (‘ ’ ‚) becomes an apostrophe only
  between two ASCII letters and a double quote elsewhere (so "d’œil" -> `d &quot; œil`), and the
  perl scripts saw each line's newline (so normalize-punctuation's `."` -> `".` applies at a line's
  end). Reproduces the release's train, val and test files for en, de and fr: of 97,425 lines one
  differs, by a trailing space (tests/test_bleu.py checks the bundled validation set)."""
  text = QUOTE_IN_WORD.sub(r"\1'\2", sentence.lower())
  text = text.replace("‘", '"').replace("’", '"').replace("‚", '"')
  punctuation, tokenizer = moses(lang)
  text = punctuation.normalize(text + "\n").strip()
  return tokenizer.tokenize(text, return_str=True, escape=True).strip()


def detokenize(tokenized: str, lang: str) -> str:
  """Moses-detokenized text (escapes such as `&apos;` undone): the inverse of multi30k_tokenize but
  for its lowercasing and punctuation normalisation."""
  return _detokenizer(lang).detokenize(tokenized.split())


@dataclasses.dataclass(frozen=True)
class TextForm:
  """How a run's text differs from the raw sentences: `kind` one of PRETOKENIZERS."""
  kind: str
  src_lang: str
  tgt_lang: str

  @property
  def lowercases(self) -> bool:
    """Whether the run writes lowercased text (then its sacreBLEU is scored uncased)."""
    return self.kind == "multi30k"

  def source(self, lines: Sequence[str]) -> list[str]:
    """Source sentences as the run was trained on them."""
    return self._tokenize(lines, self.src_lang)

  def target(self, lines: Sequence[str]) -> list[str]:
    """Target sentences as the run was trained on them (forced decoding's targets)."""
    return self._tokenize(lines, self.tgt_lang)

  def output(self, line: str) -> str:
    """A translation as a reader wants it: the model's tokenized text detokenized."""
    return line if self.kind == "none" else detokenize(line, self.tgt_lang)

  def _tokenize(self, lines: Sequence[str], lang: str) -> list[str]:
    if self.kind == "none":
      return list(lines)
    return [multi30k_tokenize(line, lang) if line.strip() else line for line in lines]


AS_GIVEN = TextForm("none", "", "")


def text_form(data: ml_collections.ConfigDict) -> TextForm:
  """The text form of a run's config (data.pretokenize; 'none' for runs written before the key)."""
  return TextForm(data.get("pretokenize", "none"), data.src_lang, data.tgt_lang)


class PretokenizedPairs:
  """A split's pairs (`len`, `read(indices)`, `name`) in a text form: what training reads."""

  def __init__(self, pairs, form: TextForm):
    self._pairs, self._form = pairs, form
    self.name = f"{pairs.name} ({form.kind}-tokenized)"

  def __len__(self) -> int:
    return len(self._pairs)

  def read(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
    src, tgt = self._pairs.read(indices)
    return self._form.source(src), self._form.target(tgt)
