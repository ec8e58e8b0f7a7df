#!/usr/bin/env bash
# The compile checks docs/accelerators.md quotes: the mesh search for big on a v5p-32, the launch
# recipes' exact configs (train, eval and beam programs), and a config that does not fit. No TPU or
# GPU needed (pip install -e '.[tpu]' and the CUDA plugin, docs/accelerators.md); ~1 hour on 2 cores.
# A check whose report exists is kept: delete it to redo it.
#   bash experiments/recipes/accelerator_checks.sh [OUT]
set -uo pipefail
out=${1:-experiments/results/accelerators}
mkdir -p "$out"
check() {  # NAME ARGS...: the report in NAME.txt (error lines and exit status included), JSON beside
  local name=$1; shift
  if [ -f "$out/$name.txt" ]; then echo "== $name: kept (delete $out/$name.txt to redo it)"; return; fi
  echo "== $name: transformer-compile $*"
  transformer-compile "$@" --output="$out/$name.json" > "$out/$name.tmp" 2> "$out/$name.log"
  local status=$?
  grep -A20 "^transformer-compile: error" "$out/$name.log" >> "$out/$name.tmp"
  echo "exit status $status" >> "$out/$name.tmp"
  mv "$out/$name.tmp" "$out/$name.txt"
  rm -f "$out/$name.log"
}
check search_big_v5p-32 --config=configs/wmt14_ende.py:big --topology=v5p-32 --search_mesh --programs=train
check recipe_v5e-8 --config=configs/wmt14_ende.py:base --topology=v5e-8
check recipe_v5p-32 --config=configs/wmt14_ende.py:big --topology=v5p-32
check recipe_16xH100 --config=configs/wmt14_ende.py:big --topology=16xH100
check does_not_fit --config=configs/wmt14_ende.py:base --topology=v5e-8 --programs=train \
  --config.data.tokens_per_batch=1000000
check max_batch_base_v5p-8 --config=configs/wmt14_ende.py:base --topology=v5p-8 --max_batch
check max_batch_big_v5p-8 --config=configs/wmt14_ende.py:big --topology=v5p-8 --max_batch
check gpu_benchmark_base_1xH100 --config=configs/wmt14_ende.py:base --topology=1xH100 --seq_len=32 --programs=train
check gpu_benchmark_big_1xH100 --config=configs/wmt14_ende.py:big --topology=1xH100 --seq_len=32 --programs=train
