#!/usr/bin/env bash
# Launch to first step of transformer-train, fresh (a new workdir, the vocabulary and token caches
# built) and resumed (from that run's checkpoint), on the stand-in at En-De's size (4.5M pairs) and
# En-Fr's (40.8M: the 4.5M corpus repeated, experiments/recipes/standin_repeated.py), with the
# programs' default allocator. The documented command, with a 2,048-token batch (the paper's 25k
# takes minutes a step on a CPU) and the compilation cache warmed by one run first, so the figures
# are the start-up's, not XLA's. Writes experiments/results/input_pipeline/start_*.json (+ .log).
#   bash experiments/recipes/start_times.sh [DATA_DIR]     # after input_pipeline.sh prepared DATA_DIR
set -euo pipefail
DATA=${1:-data}
OUT=experiments/results/input_pipeline
export XDG_CACHE_HOME=$DATA/cache
if [ ! -f "$DATA/standin_40.8m/train.en" ]; then
  python -m experiments.recipes.standin_repeated --small="$DATA/standin_ende" --out="$DATA/standin_40.8m"
fi
ARGS="--config.data.tokens_per_batch=2048 --config.train.steps=1000 --config.train.log_every=1"
TIMED="python -m experiments.analyses.start_time --stop_after_first_step"
rm -rf "$DATA/runs/start_warmup"
$TIMED --out="$DATA/runs/start_warmup.json" -- transformer-train \
  --config="configs/standin_ende.py:base,$DATA/standin_ende" --workdir="$DATA/runs/start_warmup" $ARGS
for size in 4.5m 40.8m; do
  corpus=$DATA/standin_ende
  [ "$size" = 40.8m ] && corpus=$DATA/standin_40.8m
  rm -rf "$DATA/runs/start_$size"
  for start in fresh resumed; do
    $TIMED --out="$OUT/start_${size}_$start.json" -- transformer-train \
      --config="configs/standin_ende.py:base,$corpus" --workdir="$DATA/runs/start_$size" $ARGS
  done
done
