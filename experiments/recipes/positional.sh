#!/usr/bin/env bash
# The positional study on Multi30k, recorded in experiments/results/positional_full/: every
# positional encoding (sinusoidal, learned = Table 3 row E, relative, t5, rotary, alibi, none), each
# the full default recipe (configs/multi30k.py, 4,800 steps), 3 seeds, evaluated with beam search on
# the dev set and on the long-sentence set, with BLEU by source length. The record holds earlier
# sinusoidal and learned runs, which the runner restores rather than retrains: delete its runs/ to
# train them again with today's loader. Re-running resumes/skips finished runs and
# rebuilds the record from the stored runs; `--collect_only` only rebuilds it. The second command scores
# the same checkpoints with at least one token per translation (transformer-eval --min_len=1): the
# empty translations the paper's search allows are not spread evenly over the variants (min_len1/).
#   bash experiments/recipes/positional.sh [ROOT] [--collect_only]   (default ROOT: runs/experiments/positional_full)
set -euo pipefail
root=${1:-runs/experiments/positional_full}
transformer-experiment positional --base=configs/multi30k.py --seeds=3 --root="$root" \
  --record=experiments/results/positional_full "${@:2}"
transformer-experiment positional --base=configs/multi30k.py --seeds=3 --root="$root" --min_len=1 \
  --record=experiments/results/positional_full/min_len1 "${@:2}"
