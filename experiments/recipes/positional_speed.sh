#!/usr/bin/env bash
# Speed of every positional encoding beside the paper's sinusoids, the figures of the positional
# study's record (experiments/results/positional_speed/): the default config's train step and its
# greedy and beam searches on the 1,014 validation sentences (transformer-benchmark), each kind
# once per round and the rounds repeated so that every kind's runs are spread over the same minutes
# (side by side, on one machine, nothing else running); then the base model's train step compiled for
# 8 H100s (transformer-compile: FLOPs, HBM traffic and the roofline bound, once: it is the same
# on any machine). More rounds later: FIRST_ROUND > 1 keeps the earlier ones. Then the table
# (python -m experiments.tables):
#   bash experiments/recipes/positional_speed.sh [ROUNDS] [FIRST_ROUND]     (default 4 1)
set -euo pipefail
ROUNDS=${1:-4}
FIRST=${2:-1}
OUT=experiments/results/positional_speed
KINDS=$(python -c "from transformer.model import positions; print(' '.join(positions.kinds()))")
mkdir -p "$OUT/benchmark" "$OUT/compile"
python - "$(git rev-parse --short HEAD)" "$ROUNDS" > "$OUT/machine.json" <<'PY'
import json, sys, time
import flax, jax
from transformer import hardware
from transformer.model import positions
print(json.dumps({**hardware.describe(), "commit": sys.argv[1], "cores": hardware.usable_cpus(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jax": jax.__version__,
                  "flax": flax.__version__, "rounds": int(sys.argv[2]), "kinds": positions.kinds()}))
PY
for round in $(seq "$FIRST" "$ROUNDS"); do
  for kind in $KINDS; do
    transformer-benchmark --config=configs/multi30k.py --config.model.positional="$kind" \
      --seq_len=16 --steps=10 --checkpoint_saves=0 \
      --output="$OUT/benchmark/$kind-round$round.json" 2> "$OUT/benchmark/$kind-round$round.log"
  done
done
for kind in $KINDS; do
  [ -f "$OUT/compile/$kind.json" ] && continue
  transformer-compile --config=configs/wmt14_ende.py:base --config.model.positional="$kind" \
    --topology=8xH100 --mesh=8,1,1 --programs=train \
    --output="$OUT/compile/$kind.json" > "$OUT/compile/$kind.txt" 2> "$OUT/compile/$kind.log"
done
