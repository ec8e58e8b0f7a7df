#!/usr/bin/env bash
# Table 3 rows A-D on Multi30k, recorded in experiments/results/table3_multi30k/: the paper's changes
# relative to its base applied to configs/multi30k.py (experiments/recipes/table3_multi30k.py), 1,200 steps
# each, 2 seeds. Re-running resumes/skips finished runs and rebuilds the record from the stored runs;
# `--collect_only` only rebuilds it, `--print_commands` prints one line per run for a scheduler. The
# second command scores the same checkpoints with at least one token per translation
# (transformer-eval --min_len=1; record in min_len1/): at 1,200 steps some models end sentences at once.
#   bash experiments/recipes/table3_multi30k.sh [ROOT] [--collect_only]   (default ROOT: runs/experiments/table3_multi30k)
set -euo pipefail
root=${1:-runs/experiments/table3_multi30k}
transformer-experiment experiments/recipes/table3_multi30k.py --base=configs/multi30k.py --seeds=2 \
  --root="$root" --record=experiments/results/table3_multi30k "${@:2}"
transformer-experiment experiments/recipes/table3_multi30k.py --base=configs/multi30k.py --seeds=2 \
  --root="$root" --min_len=1 --record=experiments/results/table3_multi30k/min_len1 "${@:2}"
