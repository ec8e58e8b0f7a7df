#!/usr/bin/env bash
# Table 3 row E on Multi30k, recorded in experiments/results/positional_full/: sinusoidal vs learned
# positions, each the full default recipe (configs/multi30k.py, 4,800 steps), 3 seeds, evaluated with
# beam search on the dev set and on the long-sentence set. Re-running resumes/skips; the table alone is
# rebuilt from the stored runs with `... --collect_only`.
#   bash experiments/positional.sh [ROOT]      (default ROOT: runs/experiments/positional_full)
set -euo pipefail
root=${1:-runs/experiments/positional_full}
python -m experiments.run positional --base=configs/multi30k.py --seeds=3 --root="$root"
mkdir -p experiments/results/positional_full
cp "$root"/results.md "$root"/results.csv "$root"/curves.png "$root"/bleu.png "$root"/test_sets/long.json \
  experiments/results/positional_full/
