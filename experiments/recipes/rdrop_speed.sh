#!/usr/bin/env bash
# What R-Drop (train.rdrop_alpha) costs a train step: the literature's Transformer-Tiny
# (configs/multi30k_tiny.py) at its batch of 8,192 target tokens in rows of 32, with and without
# R-Drop, alternated twice (A B A B) in one sitting so that the machine's drift shows as the spread
# between the two rounds. Stop other work on the machine first (a background grid: kill -STOP its
# process group, -CONT after). Writes OUT (default experiments/results/cpu/rdrop_speed) with one
# transformer-benchmark JSON per run and a README (the recording tool's).
#   bash experiments/recipes/rdrop_speed.sh [OUT]
set -euo pipefail
OUT=${1:-experiments/results/cpu/rdrop_speed}
mkdir -p "$OUT"
for round in 1 2; do
  for alpha in 0 5; do
    transformer-benchmark --config=configs/multi30k_tiny.py --batch_tokens=8192 --seq_len=32 \
      --steps=20 --warmup=3 --decode_sentences=0 --checkpoint_saves=0 \
      --config.train.rdrop_alpha=$alpha --output="$OUT/alpha${alpha}_round${round}.json" > /dev/null
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
from transformer.sweeps import records
out = Path(sys.argv[1])
rows = ["| round | plain step (median) | R-Drop step (median) | ratio |", "|---|---|---|---|"]
ratios = []
for r in (1, 2):
  plain, rdrop = (json.loads((out / f"alpha{a}_round{r}.json").read_text()) for a in (0, 5))
  step = lambda report: 1000 * report["step_sec_median"]
  ratios.append(step(rdrop) / step(plain))
  rows.append(f"| {r} | {step(plain):.0f} ms | {step(rdrop):.0f} ms | {ratios[-1]:.2f} |")
rows.append(f"\nMean ratio {statistics.mean(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}).")
(out / "results.md").write_text("\n".join(rows) + "\n")
records.record([out / "results.md"], out, "R-Drop's cost a train step", 0.0,
               ["bash", "experiments/recipes/rdrop_speed.sh", *sys.argv[2:]])
print((out / "results.md").read_text())
PY
