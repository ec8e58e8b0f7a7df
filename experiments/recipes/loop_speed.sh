#!/usr/bin/env bash
# The training loop's target tokens/s beside its step's alone (transformer-benchmark --loop), with
# batches placed on the devices ahead by the feed's thread (train.device_prefetch=2, the default)
# and each placed when its step comes (0, the loop as it was), alternating, REPS times each: for a
# model small enough that the host's work between steps shows on a CPU (1 layer, d_model 32,
# 64-token batches of rows up to 64 tokens; 3,000 timed steps, ~15 s) and for the default run's
# model (100 timed steps, once). Writes experiments/results/loop/<cpu>-<date>-<commit>/
# (machine.json, one JSON and log a benchmark). Pause anything else on the machine while it runs.
#   bash experiments/recipes/loop_speed.sh [REPS]
set -euo pipefail
REPS=${1:-2}
COMMIT=$(git rev-parse --short HEAD)
CPU=$(python -c "from transformer import hardware; print(hardware.cpu_model().lower().replace(' ', '-').replace('\"', ''))")
OUT=experiments/results/loop/${CPU}-$(date -u +%Y-%m-%d)-${COMMIT}
TINY="--config.model.num_layers=1 --config.model.d_model=32 --config.model.d_ff=64
  --config.model.num_heads=2 --config.data.tokens_per_batch=64 --config.data.max_len=64
  --config.model.max_len=64"
mkdir -p "$OUT"
python - "$COMMIT" "$REPS" "$TINY" > "$OUT/machine.json" <<'PY'
import json, sys, time
from transformer import hardware
print(json.dumps({**hardware.describe(), "commit": sys.argv[1], "cores": hardware.usable_cpus(),
                  "reps": int(sys.argv[2]), "tiny": " ".join(sys.argv[3].split()),
                  "command": "bash experiments/recipes/loop_speed.sh " + sys.argv[2],
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
PY
bench() {  # NAME DEPTH STEPS [overrides...]
  local name=$1 depth=$2 steps=$3
  shift 3
  transformer-benchmark --config=configs/multi30k.py "$@" --config.train.device_prefetch="$depth" \
    --loop="$steps" --output="$OUT/$name.json" > "$OUT/$name.log" 2>&1
}
for rep in $(seq 1 "$REPS"); do
  for depth in 2 0; do
    # shellcheck disable=SC2086
    bench "tiny_prefetch${depth}_$rep" "$depth" 3000 $TINY
  done
done
for depth in 2 0; do
  bench "default_prefetch${depth}_1" "$depth" 100
done
