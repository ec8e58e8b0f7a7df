#!/usr/bin/env bash
# The positional ablation recorded in experiments/results/positional/: sinusoidal vs learned positions
# on the bundled Multi30k En->De, 3 seeds each, the default model trained for 500 steps (a CPU budget),
# evaluated with beam search on the dev set and on the long-sentence set. Re-running resumes/skips.
#   bash experiments/positional.sh [ROOT]      (default ROOT: runs/experiments/positional)
set -euo pipefail
root=${1:-runs/experiments/positional}
python -m experiments.run positional --base=configs/multi30k.py --base.train.steps=500 \
  --base.train.warmup_steps=400 --base.train.eval_every=100 --seeds=3 --root="$root"
mkdir -p experiments/results/positional
cp "$root"/results.md "$root"/results.csv "$root"/curves.png "$root"/bleu.png "$root"/test_sets/long.json \
  experiments/results/positional/
