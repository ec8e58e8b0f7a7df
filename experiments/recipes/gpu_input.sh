#!/usr/bin/env bash
# The input side on a GPU host: the stand-in corpus prepared with every core, the loader benchmarked
# with up to 16 Grain workers, and a few minutes of base training from the real loader on one GPU,
# whose tokens/s set against transformer-benchmark's step-only figure is the input's cost.
# Writes OUT (default: experiments/results/input_pipeline_gpu/) beside the CPU record.
#   bash experiments/recipes/gpu_input.sh [OUT [DATA]]
# Cost on a 16-core host with one H200: corpus ~1 min, preparation ~1-2 min, benchmarks ~3 min,
# training 3 min + compiling. PAIRS, STEPS and EXTRA (config flags for the step and training) shrink
# it: a dry run on a CPU is PAIRS=20000 STEPS=2 EXTRA="--config.model.num_layers=1
# --config.model.d_model=32 --config.model.d_ff=64 --config.model.num_heads=2 --config.data.tokens_per_batch=1000".
set -euo pipefail
out=${1:-experiments/results/input_pipeline_gpu}
data=${2:-data}
pairs=${PAIRS:-4500000}
steps=${STEPS:-600}
read -r -a extra <<< "${EXTRA:-}"
mkdir -p "$out" "$data"
export XDG_CACHE_HOME=$data/cache
config="configs/standin_ende.py:base,$data/standin_gpu"
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU") > "$out/gpu.txt"
nproc > "$out/cpus.txt"
[ -f "$data/standin_gpu/standin.json" ] || python -m transformer.data.standin \
  --out="$data/standin_gpu" --pairs="$pairs"
/usr/bin/time -v python -m transformer.training.prepare --config="$config" \
  --report="$out/prepare.json" 2> "$out/prepare.log"
workers="0,4,$(nproc)"
env TRANSFORMER_MALLOC_DEFAULTS=1 transformer-benchmark --config="$config" --input_pipeline \
  --loader_workers="$workers" --output="$out/bucket.json" 2> "$out/bucket.log"
env TRANSFORMER_MALLOC_DEFAULTS=1 transformer-benchmark --config="$config" --input_pipeline \
  --config.data.subword_dropout=0.1 --loader_workers="$workers" --batches=40 --stub_steps=40 \
  --output="$out/bpe_dropout.json" 2> "$out/bpe_dropout.log"
# The step alone, on the batch shapes of the paper's 25k tokens (rows of 32), then training from the
# loader: the ratio of the trainer's real target tokens/s to this is what input costs.
transformer-benchmark --config="$config" "${extra[@]}" --seq_len=32 --steps=20 --warmup=5 \
  --decode_sentences=0 --checkpoint_saves=0 --real_batches=50 --output="$out/step.json" \
  2> "$out/step.log"
rm -rf "$out/run"
transformer-train --config="$config" "${extra[@]}" --workdir="$out/run" --config.train.steps="$steps" \
  --config.train.log_every=50 --config.train.eval_every="$steps" \
  --config.train.checkpoint_every="$steps" 2> "$out/train.log"
cp "$out/run/metrics.jsonl" "$out/train_metrics.jsonl"
rm -rf "$out/run"
tail -2 "$out/train.log"
