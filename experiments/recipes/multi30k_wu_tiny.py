"""Wu et al. (ACL 2021)'s text-only Transformer-Tiny on Multi30k at its own budget, three seeds.

    transformer-experiment experiments/recipes/multi30k_wu_tiny.py --base=configs/multi30k_tiny.py \
        --seeds=3 --root=runs/experiments/multi30k_wu_tiny --test_dir=../shared/data/multi30k_test \
        --record=experiments/results/multi30k_wu_tiny

The literature's recipe as configs/multi30k_tiny.py states it (8,000 updates of ~8,192 tokens,
dropout 0.3, their schedule, their text and vocabulary size), each run scored as they score it: the
mean of its last 10 epoch checkpoints, beam 5, lowercased tokenized BLEU on test2016, test2017 and
MSCOCO (`--test_dir`: the release's raw test files, not bundled) beside the validation set. The
test sets are scored here because this grid reproduces a published table; a grid that chooses
between recipes is scored on the validation set only.
"""

from transformer.sweeps.grids import Grid, Variant


def get_grid():
  return Grid("multi30k_wu_tiny", [Variant("wu_tiny")], average_last=10)
