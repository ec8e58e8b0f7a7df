#!/usr/bin/env bash
# The chunked loss (train.loss_chunks) compiled for GPUs without them: base and big on 8xH100 at
# the paper's batch, rows of 32 and of 128 tokens, with the whole logits (0) and in 4 chunks; HBM
# bytes per step, temporary memory and the step's bound, from transformer-compile's reports.
# Writes experiments/results/accelerators/loss_chunks/ and regenerates the docs' tables.
#   bash experiments/recipes/loss_chunks.sh
set -euo pipefail
OUT=experiments/results/accelerators/loss_chunks
mkdir -p "$OUT"
for size in base big; do
  for seq in 32 128; do
    for chunks in 0 4; do
      transformer-compile --config=configs/wmt14_ende.py:$size --topology=8xH100 --programs=train \
        --seq_len=$seq --config.train.loss_chunks=$chunks \
        --output="$OUT/${size}_seq${seq}_chunks${chunks}.json" > "$OUT/${size}_seq${seq}_chunks${chunks}.txt"
    done
  done
done
python -m experiments.tables
