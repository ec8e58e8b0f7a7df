#!/usr/bin/env bash
# The base model's train step on a CPU at the row lengths WMT's batches have (16-256 tokens), with
# the whole logits and with train.loss_chunks=4, weighted by the WMT-sized stand-in's length mix.
# A CPU cannot hold the paper's 25k-token step in reasonable time, so the budget is 2,048 tokens;
# the GPU's figures come from experiments/recipes/gpu_whole_program.sh. Writes
# experiments/results/cpu/<cpu>-<date>-<commit>-shapes/ and regenerates the docs' tables.
#   bash experiments/recipes/cpu_shapes.sh
set -euo pipefail
COMMIT=$(git rev-parse --short HEAD)
CPU=$(python -c "from transformer import hardware; print(hardware.cpu_model().lower().replace(' ', '-').replace('\"', ''))")
OUT=experiments/results/cpu/${CPU}-$(date -u +%Y-%m-%d)-${COMMIT}-shapes
mkdir -p "$OUT"
python - "$COMMIT" > "$OUT/machine.json" <<'PY'
import json, sys, time
from transformer import hardware
print(json.dumps({**hardware.describe(), "commit": sys.argv[1], "cores": hardware.usable_cpus(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
PY
for chunks in 0 4; do
  transformer-benchmark --config=configs/wmt14_ende.py:base --config.model.dtype=float32 \
    --batch_tokens=2048 --shapes=16,32,64,128,256 --mix=experiments/results/input_pipeline/standin_lengths.json \
    --steps=2 --warmup=1 --decode_sentences=0 --checkpoint_saves=0 --measure_peak \
    --config.train.loss_chunks=$chunks --output="$OUT/shapes_loss_chunks$chunks.json" \
    2> "$OUT/shapes_loss_chunks$chunks.log"
done
# The chunked loss against the whole logits, alternating in one process, on the default config
python -m experiments.analyses.step_profile --config=configs/multi30k.py --rows=128 --seq_len=16 \
  --versus=train.loss_chunks=4 --rounds=4 > "$OUT/multi30k_loss_chunks_versus.txt" 2> "$OUT/versus.log"
python -m experiments.tables
