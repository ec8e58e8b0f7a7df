"""sacreBLEU through our wrapper against BLEU computed by hand from clipped n-gram counts."""

import collections
import math

import pytest

from transformer.bleu import sacrebleu_score


def reference_bleu(hypotheses, references):
  """Papineni et al.'s corpus BLEU on whitespace tokens (13a leaves these sentences unchanged)."""
  matches, totals = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_grams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      r_grams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
      totals[n - 1] += max(len(h) - n + 1, 0)
  log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
  brevity = min(1.0, math.exp(1 - ref_len / hyp_len))
  return 100 * brevity * math.exp(log_precision)


def test_matches_hand_computed_corpus_bleu():
  hypotheses = ["the cat sat on the mat today", "a dog runs in the big park",
                "two men are playing football"]
  references = ["the cat sat on a mat today", "a dog runs in the park",
                "two young men are playing football outside"]
  result = sacrebleu_score(hypotheses, references)
  assert result["bleu"] == pytest.approx(reference_bleu(hypotheses, references), abs=1e-6)
  assert result["lines"] == 3 and result["case"] == "cased" and result["tokenizer"] == "13a"
  assert "tok:13a" in result["signature"] and "case:mixed" in result["signature"]


def test_short_hypotheses_pay_the_brevity_penalty_and_case_counts():
  refs = ["the cat sat on the mat with a hat"]
  assert sacrebleu_score(refs, refs)["bleu"] == pytest.approx(100.0)
  assert sacrebleu_score(["The Cat sat on the mat with a hat"], refs)["bleu"] < 100.0
  short = sacrebleu_score(["the cat sat on the mat"], refs)
  assert short["brevity_penalty"] == pytest.approx(math.exp(1 - 9 / 6))
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    sacrebleu_score(["a", "b"], refs)
