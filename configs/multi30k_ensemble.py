"""One member of the two-run ensemble recipe: the default trained 4,250 steps, twice, decoded together.

    for s in 0 1; do transformer-train --config=configs/multi30k_ensemble.py --config.seed=$s \
        --workdir=runs/m30k_ens/seed$s; done
    transformer-eval --workdir=runs/m30k_ens/seed0 --ensemble=runs/m30k_ens/seed1

`configs/multi30k_ensemble.py:en-fr` is the same for English->French (configs/multi30k_enfr.py).
configs/multi30k.py stopped at step 4,250 (neither its learning-rate schedule nor its moving average
depends on train.steps, so this is the default's own step-4,250 checkpoint), so that two seeds
train in the default's 40 minutes on the 2-core AMD EPYC VMs (En->De 19m25s each there, En->Fr
19m04s-20m14s); transformer-eval averages the two models' next-token log-probabilities at every
step of one beam search of 8 hypotheses (the paper's alpha 0.6) and translates each sentence with
the hypothesis the other seven agree with most: minimum Bayes risk with sentence chrF as the
utility (decode.mbr, transformer/decoding/mbr.py), which also lengthens the ensemble's short outputs
(its gain on the test sets is MSCOCO's, whose references are long like the validation set's:
docs/experiments.md). The seeds share their vocabulary (on Multi30k every seed trains it on all
29,000 pairs, so they come out identical). Chosen on validation, both pairs of seeds of both language pairs:
experiments/results/multi30k_test_sets/en-de/README.md. Float32 throughout, so it needs no bf16
hardware; on a slower CPU (the Xeon VM trained the default in 36 minutes) two runs exceed the 40
minutes.
"""

import runpy
from pathlib import Path

DEFAULTS = {"en-de": "multi30k.py", "en-fr": "multi30k_enfr.py"}


def get_config(pair: str = "en-de"):
  if pair not in DEFAULTS:
    raise ValueError(f"configs/multi30k_ensemble.py:{pair}: the language pair must be one of "
                     f"{', '.join(DEFAULTS)}")
  # The pair's default, run by path (config files are not a package on sys.path).
  c = runpy.run_path(str(Path(__file__).with_name(DEFAULTS[pair])))["get_config"]()
  c.train.steps = 4250
  c.decode.beam_size = 8
  c.decode.mbr = "chrf"
  return c
