"""Is one run's BLEU really above another's? Paired bootstrap resampling over sentences.

Koehn (2004), as sacreBLEU implements it (`sacrebleu.significance.PairedTest`): both systems'
translations of the same test set are resampled together, sentence by sentence, 1,000 times (seed
12345, so a table is the same each time it is built); p is the probability, under the null
hypothesis that the two systems are equally good, of a BLEU difference at least as large as the one
observed. A small p says the difference is unlikely to come from which sentences happen to be in
the test set. It says nothing about the seed-to-seed spread of training: the tables compare each
seed of a variant with the same seed of the baseline and print every seed's p.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

RESAMPLES = 1000


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
