#!/usr/bin/env bash
# What R-Drop (train.rdrop_alpha) costs a train step: the literature's Transformer-Tiny
# (configs/multi30k_tiny.py) at its batch of 8,192 target tokens in rows of 32: plain, with R-Drop,
# and with R-Drop in 2 and in 4 micro-batches (train.grad_accum_steps: the same update; with 2 each
# pass holds as many rows as a plain step), alternated twice (A B C D A B C D) in one sitting so that
# the machine's drift shows as the spread between the two rounds. Stop other work on the machine
# first (a background grid: kill -STOP its process group, -CONT after). Writes OUT (default
# experiments/results/cpu/rdrop_speed) with one transformer-benchmark JSON per run and a README (the
# recording tool's).
#   bash experiments/recipes/rdrop_speed.sh [OUT]
set -euo pipefail
OUT=${1:-experiments/results/cpu/rdrop_speed}
mkdir -p "$OUT"
for round in 1 2; do
  for setting in "0 1" "5 1" "5 2" "5 4"; do
    read -r alpha accum <<< "$setting"
    transformer-benchmark --config=configs/multi30k_tiny.py --batch_tokens=8192 --seq_len=32 \
      --steps=20 --warmup=3 --decode_sentences=0 --checkpoint_saves=0 \
      --config.train.rdrop_alpha=$alpha --config.train.grad_accum_steps=$accum \
      --output="$OUT/alpha${alpha}_accum${accum}_round${round}.json" > /dev/null
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
from transformer.sweeps import records
out = Path(sys.argv[1])
ACCUMS = (1, 2, 4)
label = lambda k: "R-Drop" if k == 1 else f"R-Drop, {k} micro-batches"
rows = ["| round | plain step (median) | " + " | ".join(f"{label(k)} | ratio" for k in ACCUMS) + " |",
        "|---|---|" + "---|---|" * len(ACCUMS)]
ratios = {k: [] for k in ACCUMS}
for r in (1, 2):
  step = lambda a, k: 1000 * json.loads((out / f"alpha{a}_accum{k}_round{r}.json").read_text())[
      "step_sec_median"]
  plain = step(0, 1)
  cells = [f"{plain:.0f} ms"]
  for accum in ACCUMS:
    ratios[accum].append(step(5, accum) / plain)
    cells += [f"{step(5, accum):.0f} ms", f"{ratios[accum][-1]:.2f}"]
  rows.append(f"| {r} | " + " | ".join(cells) + " |")
for accum in ACCUMS:
  rows.append(f"\n{label(accum)}: {statistics.mean(ratios[accum]):.2f}x a plain step (rounds "
              f"{min(ratios[accum]):.2f}-{max(ratios[accum]):.2f}).")
(out / "results.md").write_text("\n".join(rows) + "\n")
records.record([out / "results.md"], out, "R-Drop's cost a train step", 0.0,
               ["bash", "experiments/recipes/rdrop_speed.sh", *sys.argv[2:]])
print((out / "results.md").read_text())
PY
