"""BLEU as the field should report it: sacreBLEU, cased, 13a tokenization, with its signature.

sacreBLEU computes the score on detokenized text with a fixed, versioned tokenizer, so numbers are
comparable across papers and toolkits; the signature records exactly how. Never report BLEU on
subword ids or on the model's own tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
  """Corpus sacreBLEU (cased, 13a) of one hypothesis per reference line, with its signature."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  metric = BLEU(tokenize="13a", lowercase=False)
  result = metric.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": result.score, "signature": str(metric.get_signature()),
          "precisions": result.precisions, "brevity_penalty": result.bp,
          "hyp_len": result.sys_len, "ref_len": result.ref_len, "lines": len(references),
          "case": "cased", "tokenizer": "13a"}
