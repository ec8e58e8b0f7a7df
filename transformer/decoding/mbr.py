"""Minimum Bayes risk (MBR) decoding: from a sentence's n-best list, choose the hypothesis that the
others agree with most, rather than the one the search scores highest.

Each hypothesis h is given its expected utility against the list as a sample of what the model
believes: E[u] = sum_j w_j * u(h, h_j), with weights w = softmax(scores / temperature) over the
search's (length-normalised) scores, and itself counted among the h_j. The hypothesis of highest
expected utility is the translation (Kumar & Byrne 2004; with chrF as the utility as in Freitag et
al. 2022). The utilities are sentence-level chrF and BLEU as sacreBLEU computes them (its
`sentence_score`), so the metric the choice optimises is the metric the reports use.

It costs beam_size**2 sentence scores per sentence on the host after the search; the search itself
runs once, with its n-best list. For chrF the list's character n-grams are counted once per
hypothesis (sacreBLEU's own extraction) and the pairs' matches are counted in numpy, ~10x faster
than calling `sentence_score` for every pair, with the same scores (tests/test_mbr.py checks them
against sacreBLEU's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.helpers import extract_all_char_ngrams

_CHRF = CHRF()
_BLEU = BLEU(effective_order=True)  # sentence BLEU: n-gram orders a short sentence lacks are skipped


def weights(scores: Sequence[float], temperature: float) -> np.ndarray:
  """softmax(scores / temperature): how much each hypothesis counts as a pseudo-reference."""
  z = np.asarray(scores, np.float64) / temperature
  w = np.exp(z - z.max())
  return w / w.sum()


def chrf_matrix(texts: Sequence[str]) -> np.ndarray:
  """[n, n] sentence chrF of hypothesis i against reference j, as sacreBLEU's default CHRF()
  scores it (character 6-grams without whitespace, beta 2, precision and recall averaged over the
  orders both sides have): each text's n-grams counted once, the pairs' matches in numpy."""
  grams = [extract_all_char_ngrams(t, _CHRF.char_order, _CHRF.whitespace) for t in texts]
  n = len(texts)
  precision, recall, orders = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
  for k in range(_CHRF.char_order):
    index: dict[str, int] = {}
    for g in grams:
      for gram in g[k]:
        index.setdefault(gram, len(index))
    counts = np.zeros((n, len(index)))
    for row, g in zip(counts, grams):
      row[[index[gram] for gram in g[k]]] = list(g[k].values())
    totals = counts.sum(1)
    match = np.minimum(counts[:, None, :], counts[None, :, :]).sum(-1)
    both = (totals[:, None] > 0) & (totals[None, :] > 0)
    precision += np.where(both, match / np.maximum(totals[:, None], 1), 0.0)
    recall += np.where(both, match / np.maximum(totals[None, :], 1), 0.0)
    orders += both
  precision /= np.maximum(orders, 1)
  recall /= np.maximum(orders, 1)
  factor = _CHRF.beta ** 2
  denominator = factor * precision + recall
  return np.where(denominator > 0, 100 * (1 + factor) * precision * recall
                  / np.where(denominator > 0, denominator, 1.0), 0.0)


def bleu_matrix(texts: Sequence[str]) -> np.ndarray:
  """[n, n] sentence BLEU of hypothesis i against reference j: sacreBLEU's `sentence_score` per pair."""
  return np.array([[_BLEU.sentence_score(h, [r]).score for r in texts] for h in texts], np.float64)


# A utility maps a sentence's n-best texts to the [n, n] matrix of hypothesis-against-reference scores.
UTILITIES: dict[str, Callable[[Sequence[str]], np.ndarray]] = {"chrf": chrf_matrix, "bleu": bleu_matrix}


def expected_utilities(texts: Sequence[str], scores: Sequence[float], utility: str,
                       temperature: float) -> np.ndarray:
  """[n] each hypothesis's utility against every hypothesis of the list, weighted by `weights`."""
  return UTILITIES[utility](texts) @ weights(scores, temperature)


def rerank(nbest: Sequence[Sequence[dict[str, Any]]], utility: str, temperature: float
           ) -> list[int]:
  """Per sentence, the index of the MBR choice in its n-best list (dicts with 'text' and 'score',
  best-scored first; 0 for an empty list). Adds each hypothesis's 'expected_utility' in place."""
  chosen = []
  for hypotheses in nbest:
    if not hypotheses:
      chosen.append(0)
      continue
    values = expected_utilities([h["text"] for h in hypotheses], [h["score"] for h in hypotheses],
                                utility, temperature)
    for h, value in zip(hypotheses, values):
      h["expected_utility"] = float(value)
    chosen.append(int(np.argmax(values)))  # ties go to the better-scored hypothesis
  return chosen
