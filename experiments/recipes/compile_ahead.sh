#!/usr/bin/env bash
# The default run's start (configs/multi30k.py) with its steps compiled ahead, every batch shape at
# once before the first step (train.compile_ahead, the default), and when the loop meets each shape
# (jit's way), alternating, REPS times each, every run from an empty compilation cache: launch to
# the first step's line, launch to the end of STEPS steps (log_every 1, no validation or
# checkpoint in between), the shapes compiled and the programs compiled inside the loop. Writes
# experiments/results/compile_ahead/<cpu>-<date>-<commit>/ (machine.json, one JSON and log a run).
# Pause anything else on the machine while it runs.
#   bash experiments/recipes/compile_ahead.sh [REPS] [STEPS]
set -euo pipefail
REPS=${1:-2}
STEPS=${2:-60}
COMMIT=$(git rev-parse --short HEAD)
CPU=$(python -c "from transformer import hardware; print(hardware.cpu_model().lower().replace(' ', '-').replace('\"', ''))")
OUT=experiments/results/compile_ahead/${CPU}-$(date -u +%Y-%m-%d)-${COMMIT}
SCRATCH=$(mktemp -d)
mkdir -p "$OUT"
python - "$COMMIT" "$REPS" "$STEPS" > "$OUT/machine.json" <<'PY'
import json, sys, time
from transformer import hardware
print(json.dumps({**hardware.describe(), "commit": sys.argv[1], "cores": hardware.usable_cpus(),
                  "reps": int(sys.argv[2]), "steps": int(sys.argv[3]),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
PY
for rep in $(seq 1 "$REPS"); do
  for ahead in True False; do
    run=$SCRATCH/run_${ahead}_$rep
    python -m experiments.analyses.start_time --out="$OUT/ahead_${ahead}_$rep.json" -- \
      transformer-train --config=configs/multi30k.py --workdir="$run" --compilation_cache= \
      --config.train.compile_ahead=$ahead --config.train.steps="$STEPS" --config.train.log_every=1 \
      --config.train.eval_every=100000 --config.train.checkpoint_every=100000 > /dev/null
    python - "$OUT/ahead_${ahead}_$rep.json" "$run/metrics.jsonl" <<'PY'
import json, sys
record = json.load(open(sys.argv[1]))
summary = [json.loads(l) for l in open(sys.argv[2]) if '"summary"' in l][-1]
record.update({k: summary[k] for k in ("shapes_compiled", "compiled_in_loop", "compile_sec",
                                       "train_time_sec", "startup_sec")})
json.dump(record, open(sys.argv[1], "w"), indent=1)
PY
  done
done
rm -rf "$SCRATCH"
