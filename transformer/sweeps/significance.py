"""Is one run's BLEU really above another's? Paired bootstrap resampling over sentences.

Koehn (2004), as sacreBLEU implements it (`sacrebleu.significance.PairedTest`): both systems'
translations of the same test set are resampled together, sentence by sentence, 1,000 times (seed
12345, so a table is the same each time it is built); p is the probability, under the null
hypothesis that the two systems are equally good, of a BLEU difference at least as large as the one
observed. A small p says the difference is unlikely to come from which sentences happen to be in
the test set. It says nothing about the seed-to-seed spread of training: the tables compare each
seed of a variant with the same seed of the baseline and print every seed's p.

`seeds_bootstrap` is the test that does: a two-level bootstrap of the mean difference over seeds,
which resamples the trainings (seeds, with replacement) and, within each, the sentences. It is as
sure as its seeds allow: with three, one resample in nine draws a single seed three times, so a
difference that one seed contradicts seldom comes out significant.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

RESAMPLES = 1000
SEED = 12345  # sacreBLEU's, so both tests' tables are the same each time they are built


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], references: Sequence[str],
                     resamples: int = RESAMPLES, metric: BLEU | None = None) -> float:
  """The p-value of `system`'s sacreBLEU differing from `baseline`'s on the same `references`.
  `metric`: another BLEU set-up (e.g. `bleu.multi_bleu_metric()` on text tokenized by
  `bleu.multi30k_tokenize`, the Multi30k literature's score)."""
  if not len(baseline) == len(system) == len(references):
    raise ValueError(f"paired test needs one translation per reference: {len(baseline)} and "
                     f"{len(system)} translations for {len(references)} references")
  metric = metric or BLEU()
  if list(baseline) == list(system) or (
      metric.corpus_score(list(baseline), [list(references)]).score
      == metric.corpus_score(list(system), [list(references)]).score):
    return 1.0  # no difference is never significant (sacreBLEU would give its smallest p)
  sacrebleu_log = logging.getLogger("sacrebleu")
  level = sacrebleu_log.level
  sacrebleu_log.setLevel(logging.WARNING)  # it logs every stage of the test at INFO
  try:
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": metric}, [list(references)], test_type="bs",
                      n_samples=resamples)
    _, scores = test()
  finally:
    sacrebleu_log.setLevel(level)
  return float(scores["BLEU"][1].p_value)


def seeds_bootstrap(pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
                    references: Sequence[str], resamples: int = RESAMPLES,
                    metric: BLEU | None = None) -> float:
  """The p-value of the mean BLEU difference over seeds, `pairs` holding each seed's (baseline's,
  system's) translations of `references`: each resample draws as many seeds as there are, with
  replacement, and for each drawn seed the sentences (both systems' alike, as Koehn's test); p is
  the share of resampled mean differences that stray from their own mean by more than the observed
  mean difference (sacreBLEU's centred count, with its +1). A zero difference has p = 1."""
  metric = metric or BLEU()
  for base, system in pairs:
    if not len(base) == len(system) == len(references):
      raise ValueError(f"paired test needs one translation per reference: {len(base)} and "
                       f"{len(system)} translations for {len(references)} references")
  refs = [list(references)]
  stats = [(np.asarray(metric._extract_corpus_statistics(list(base), refs), np.float64),
            np.asarray(metric._extract_corpus_statistics(list(system), refs), np.float64))
           for base, system in pairs]
  score = lambda totals: metric._compute_score_from_stats(totals.tolist()).score
  difference = lambda counts, b, s: score(counts @ s) - score(counts @ b)
  ones = np.ones(len(references))
  observed = float(np.mean([difference(ones, b, s) for b, s in stats]))
  if observed == 0:
    return 1.0
  rng = np.random.default_rng(SEED)
  sampled = np.empty(resamples)
  for i in range(resamples):
    drawn = rng.integers(len(stats), size=len(stats))
    sampled[i] = np.mean([difference(np.bincount(rng.integers(len(references), size=len(references)),
                                                 minlength=len(references)), *stats[k])
                          for k in drawn])
  return float((np.sum(np.abs(sampled - sampled.mean()) > abs(observed)) + 1) / (resamples + 1))
