r"""BLEU three ways: sacreBLEU (the primary number), the paper's tokenized, compound-split BLEU, and
the lowercased, tokenized BLEU of the multimodal-MT literature on Multi30k.

1. sacreBLEU, cased, 13a, with its signature (chrF, also sacreBLEU's, beside it): computed on
   detokenized text with a fixed, versioned tokenizer, so numbers compare across papers and toolkits.
2. The paper's (tensor2tensor's get_ende_bleu.sh), step by step: Unicode punctuation replaced as
   Moses' replace-unicode-punctuation.perl does (sacremoses' port; „“ ” become ", … becomes ...),
   the Moses tokenizer (sacremoses' port of tokenizer.perl, escaping as tokenizer.perl does), then
   the script's `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`: a hyphen between two non-space characters is
   split off (not only between letters: '3-%' too), and, as that regex consumes the characters
   beside it, a one-character part keeps its second hyphen ('a-b-c' -> 'a ##AT##-##AT## b-c');
   then cased corpus BLEU on those tokens with no
   smoothing, as multi-bleu.perl computes it. The script normalises the decodes only (its references
   were tokenized beforehand); here both sides go through the same steps. Compound splitting turns one
   token into three, so this number reads higher than sacreBLEU on German; report which you quote.
3. The Multi30k literature's (`lc_tok_bleu`): both sides preprocessed as the dataset's release made
   its `*.lc.norm.tok.*` files (scripts/task1-tokenize.sh: Moses' lowercase.perl, then
   normalize-punctuation.perl -l L, then tokenizer.perl -l L, at Moses commit 3a0631a), then
   multi-bleu.perl's uncased corpus BLEU on those tokens. With this the references are the release's
   tokenized files line for line, so a score here sits beside a paper's on test2016/2017.

Never report BLEU on subword ids or on the model's own tokenization.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sacrebleu.metrics import BLEU, CHRF

from transformer.data.pretokenize import moses, multi30k_tokenize

COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")  # get_ende_bleu.sh's, with its non-overlapping matches


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str],
                    lowercase: bool = False) -> dict:
  """Corpus sacreBLEU (cased, 13a) of one hypothesis per reference line, with its signature;
  `lowercase`: uncased (for a run that writes lowercased text; the signature says case:lc)."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  metric = BLEU(tokenize="13a", lowercase=lowercase)
  result = metric.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": result.score, "signature": str(metric.get_signature()),
          "precisions": result.precisions, "brevity_penalty": result.bp,
          "hyp_len": result.sys_len, "ref_len": result.ref_len, "lines": len(references),
          "case": "lowercased" if lowercase else "cased", "tokenizer": "13a"}


def chrf_score(hypotheses: Sequence[str], references: Sequence[str],
               lowercase: bool = False) -> dict:
  """Corpus chrF (sacreBLEU's defaults: character 6-grams, beta 2), with its signature;
  `lowercase`: uncased, as `sacrebleu_score`'s."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  metric = CHRF(lowercase=lowercase)
  result = metric.corpus_score(list(hypotheses), [list(references)])
  return {"chrf": result.score, "signature": str(metric.get_signature())}


def compound_split(tokenized: str) -> str:
  """'rich-text' -> 'rich ##AT##-##AT## text', exactly as t2t's get_ende_bleu.sh's perl s///g, whose
  matches do not overlap: 'a-b-c' -> 'a ##AT##-##AT## b-c'."""
  return COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", tokenized)


def paper_tokenize(sentence: str, lang: str) -> str:
  """Unicode punctuation replaced, Moses-tokenized (tokenizer.perl's rules and escaping for `lang`),
  compounds split: get_ende_bleu.sh's steps."""
  punctuation, tokenizer = moses(lang)
  text = punctuation.replace_unicode_punct(sentence)
  return compound_split(tokenizer.tokenize(text, return_str=True, escape=True))


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str,
                   lowercase: bool = False) -> dict:
  """The paper's BLEU: cased corpus BLEU (multi-bleu.perl) on Moses-tokenized, compound-split text;
  `lowercase`: both sides lowercased first (a run that writes lowercased text)."""
  case = (lambda text: text.lower()) if lowercase else (lambda text: text)
  return {**multi_bleu(hypotheses, references, lambda text: paper_tokenize(case(text), lang)),
          "case": "lowercased" if lowercase else "cased",
          "tokenizer": f"unicode punctuation + moses({lang}) + compound splitting (##AT##-##AT##), "
                       "as t2t's get_ende_bleu.sh"}


def multi_bleu_metric() -> BLEU:
  """sacreBLEU set up as multi-bleu.perl: text already tokenized, case kept, no smoothing."""
  return BLEU(tokenize="none", lowercase=False, smooth_method="none", force=True)


def multi_bleu(hypotheses: Sequence[str], references: Sequence[str],
               tokenize: Callable[[str], str]) -> dict:
  """multi-bleu.perl's corpus BLEU (no smoothing, as is) on whitespace tokens of `tokenize(line)`."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  hyp, ref = [tokenize(h) for h in hypotheses], [tokenize(r) for r in references]
  result = multi_bleu_metric().corpus_score(hyp, [ref])
  return {"bleu": result.score, "precisions": result.precisions, "brevity_penalty": result.bp,
          "hyp_len": result.sys_len, "ref_len": result.ref_len, "lines": len(references),
          "smoothing": "none (multi-bleu.perl)"}


def lc_tok_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> dict:
  """The Multi30k literature's BLEU: multi-bleu.perl on both sides as `multi30k_tokenize` leaves
  them (the release's `*.lc.norm.tok.*` references, hypotheses treated alike)."""
  return {**multi_bleu(hypotheses, references, lambda text: multi30k_tokenize(text, lang)),
          "case": "lowercased", "tokenizer": f"Multi30k's lc.norm.tok (lowercase, moses "
                                             f"normalize-punctuation and tokenizer, {lang})"}
