#!/usr/bin/env bash
# The whole program on one GPU, and the step on the shapes WMT's batches have, in one call of under
# ten minutes. Most important first (a call may be cut short):
#   1. transformer-train on configs/multi30k.py, stopped at half way and resumed from its checkpoint
#      to the end (checkpoints written and restored on the GPU), then transformer-eval: wall time,
#      tokens/s and validation BLEU beside the CPU runs' (docs: the default-run table);
#   2. transformer-benchmark on base at the paper's 25k target tokens in rows of 16-256 tokens,
#      weighted by the WMT-sized stand-in's length mix (the record's standin_lengths.json): tokens/s
#      and MFU per shape and mixed, with the whole logits and with train.loss_chunks=4;
#   3. with FLAX_WMT_DIR (a checkout's examples/wmt carried along), the Flax example's step against
#      ours at base's shape, side by side in one process.
# Writes experiments/results/gpu/<gpu>-<date>-<commit>-whole-program/ (or OUT) and the docs' tables.
#   bash experiments/recipes/gpu_whole_program.sh [OUT]
# A dry run on a CPU: STEPS=40 SHAPES=8,16 TOKENS=512 EXTRA="--config.model.num_layers=1
# --config.model.d_model=32 --config.model.d_ff=64 --config.model.num_heads=2 --config.data.vocab_size=300"
set -uo pipefail
gpu=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo cpu) | head -1 \
  | tr 'A-Z ' 'a-z-' | sed 's/^nvidia-//')
out=${1:-experiments/results/gpu/${gpu}-$(date -u +%Y-%m-%d)-$(git rev-parse --short HEAD)-whole-program}
steps=${STEPS:-4800}
shapes=${SHAPES:-16,32,64,128,256}
tokens=${TOKENS:-25000}
read -r -a extra <<< "${EXTRA:-}"
run=$(mktemp -d)/m30k
mkdir -p "$out"
(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || echo "no GPU") > "$out/gpu.txt"
python3 - > "$out/machine.json" <<'PY'
import json, subprocess, time
from transformer import hardware
print(json.dumps({**hardware.describe(), "commit": subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
PY
# 1. the default run: half, resumed to the end, evaluated
timed() { local name=$1; shift; local t0; t0=$(date +%s)  # whole seconds: no bc on every image
  "$@" 2> "$out/$name.log"; local rc=$?
  echo "{\"$name\": {\"rc\": $rc, \"wall_sec\": $(( $(date +%s) - t0 ))}}" >> "$out/times.jsonl"
  tail -2 "$out/$name.log" | cut -c1-300; }
timed train_first_half transformer-train --config=configs/multi30k.py --workdir="$run" \
  --config.train.steps=$((steps / 2)) "${extra[@]}"
timed train_resumed transformer-train --config=configs/multi30k.py --workdir="$run" \
  --config.train.steps="$steps" --allow_config_change "${extra[@]}"
timed eval transformer-eval --workdir="$run"
cp "$run/metrics.jsonl" "$out/" 2>/dev/null; cp -r "$run/eval" "$out/" 2>/dev/null
# 2. the step on WMT-shaped rows, the whole logits and the chunked loss
for chunks in 0 4; do
  timed "shapes_loss_chunks$chunks" transformer-benchmark --config=configs/wmt14_ende.py:base \
    --batch_tokens="$tokens" --shapes="$shapes" --mix=experiments/results/input_pipeline/standin_lengths.json \
    --steps=10 --warmup=2 --decode_sentences=0 --checkpoint_saves=0 --config.train.loss_chunks=$chunks \
    --output="$out/shapes_loss_chunks$chunks.json" "${extra[@]}"
done
# 3. the Flax WMT example's step beside ours
if [ -n "${FLAX_WMT_DIR:-}" ]; then
  timed versus_flax python3 -m experiments.analyses.versus_flax_wmt --flax_wmt_dir="$FLAX_WMT_DIR" \
    --config=configs/wmt14_ende.py:base --rows=781 --seq_len=32 > "$out/versus_flax.txt"
fi
python3 -m experiments.tables || true
