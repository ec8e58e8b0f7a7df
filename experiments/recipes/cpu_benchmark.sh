#!/usr/bin/env bash
# The CPU figures of docs/performance.md and docs/reliability.md, and the README's smoke run, on this
# machine: the default config's and the base model's train step, searches and checkpoint saves
# (transformer-benchmark), then the README's two-minute smoke command, timed. Writes the record
# experiments/results/cpu/<cpu>-<date>-<commit>/ and regenerates the docs' tables. Run from the
# repository root on a clean tree (the commit names the code), nothing else running:
#   bash experiments/recipes/cpu_benchmark.sh
set -euo pipefail
COMMIT=$(git rev-parse --short HEAD)
CPU=$(python -c "from transformer import hardware; print(hardware.cpu_model().lower().replace(' ', '-').replace('\"', ''))")
OUT=experiments/results/cpu/${CPU}-$(date -u +%Y-%m-%d)-${COMMIT}
mkdir -p "$OUT"
python - "$COMMIT" > "$OUT/machine.json" <<'PY'
import json, sys, time
import flax, jax, optax
from transformer import hardware
print(json.dumps({**hardware.describe(), "commit": sys.argv[1], "cores": hardware.usable_cpus(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "flax": flax.__version__, "optax": optax.__version__}))
PY
transformer-benchmark --config=configs/multi30k.py --seq_len=16 --steps=10 --measure_peak \
  --checkpoint_saves=3 --checkpoint_dir="$OUT/tmp_ckpt" --output="$OUT/multi30k.json" 2> "$OUT/multi30k.log"
transformer-benchmark --config=configs/wmt14_ende.py:base --config.model.dtype=float32 \
  --config.data.vocab_size=37000 --batch_tokens=2048 --seq_len=32 --steps=3 --warmup=1 \
  --decode_sentences=256 --measure_peak --checkpoint_saves=3 --checkpoint_dir="$OUT/tmp_ckpt" \
  --output="$OUT/wmt14_ende_base.json" 2> "$OUT/wmt14_ende_base.log"
rm -rf "$OUT/tmp_ckpt"
# The README's smoke command as on a fresh machine: empty workdir, vocabulary, token and
# compilation caches (so training the vocabulary, tokenizing and compiling are included).
SMOKE=$(mktemp -d)
START=$(date +%s.%N)
XDG_CACHE_HOME="$SMOKE/cache" transformer-train --config=configs/multi30k.py --workdir="$SMOKE/run" \
  --config.train.steps=150 --config.train.eval_every=150 2> "$OUT/smoke.log"
END=$(date +%s.%N)
python - "$START" "$END" > "$OUT/smoke.json" <<'PY'
import json, sys
print(json.dumps({"command": "transformer-train --config=configs/multi30k.py --workdir=runs/smoke "
                  "--config.train.steps=150 --config.train.eval_every=150",
                  "wall_sec": float(sys.argv[2]) - float(sys.argv[1])}))
PY
rm -rf "$SMOKE"
python -m experiments.tables
