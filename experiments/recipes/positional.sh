#!/usr/bin/env bash
# The positional study on Multi30k, recorded in experiments/results/positional_full/: every
# positional encoding (sinusoidal, learned = Table 3 row E, relative, t5, rotary, alibi, none), each
# the full default recipe (configs/multi30k.py, 4,800 steps), 3 seeds, seed 0 of every kind first,
# evaluated with beam search on the dev set, the long-sentence set and the three held-out test sets
# (TEST_DIR: Multi30k's test_2016_flickr, test_2017_flickr and test_2017_mscoco, not bundled), with
# BLEU by source length and every run in TensorBoard's HParams dashboard (tensorboard --logdir ROOT).
# What the grid changes from the README's single run: it keeps the last 2 checkpoints, not 20 (the
# study scores the last; 1.6 GB a run otherwise). Re-running resumes a killed run from its last
# checkpoint, skips finished ones, restores those kept in the record (a fresh checkout) and rebuilds
# the record; `--collect_only` only rebuilds it. Each run is also scored with at least one token per
# translation (transformer-eval --min_len=1) as soon as it is trained, while its checkpoints exist
# (runs move between machines without them), tabulated in min_len1/: the empty translations the
# paper's search allows are not spread evenly over the variants.
#   bash experiments/recipes/positional.sh TEST_DIR [ROOT] [--collect_only | --parallel=N]
#   (--parallel=N: N runs at a time, for one GPU; on a CPU one run already uses every core)
#   (ROOT: runs/experiments/positional_full; fetch TEST_DIR once with a network:
#    for f in test_2016_flickr test_2017_flickr test_2017_mscoco; do for l in en de; do
#      curl -LO https://github.com/multi30k/dataset/raw/master/data/task1/raw/$f.$l.gz; done; done)
set -euo pipefail
test_dir=${1:?"pass the folder of Multi30k's test sets (see this script's header)"}
root=${2:-runs/experiments/positional_full}
transformer-experiment positional --base=configs/multi30k.py --base.train.keep_checkpoints=2 \
  --seeds=3 --root="$root" --test_dir="$test_dir" --also_min_len=1 \
  --record=experiments/results/positional_full "${@:3}"
