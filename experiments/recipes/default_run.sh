#!/usr/bin/env bash
# The README's default run, timed: train configs/multi30k.py from scratch, evaluate the last
# checkpoint with beam search, and print the figures quoted in the README.
#   bash experiments/recipes/default_run.sh [WORKDIR]       (default WORKDIR: runs/m30k_default)
set -euo pipefail
workdir=${1:-runs/m30k_default}
if [ -e "$workdir" ]; then echo "refusing to overwrite $workdir; pass another WORKDIR" >&2; exit 1; fi
start=$(date +%s)
transformer-train --config=configs/multi30k.py --workdir="$workdir"
trained=$(date +%s)
transformer-eval --workdir="$workdir"
python - "$workdir" "$((trained - start))" <<'PY'
import json, sys
from pathlib import Path
from transformer.metrics import read_metrics
workdir, wall = Path(sys.argv[1]), int(sys.argv[2])
summary = read_metrics(workdir, "summary")[-1]
evals = read_metrics(workdir, "eval")
report = json.loads(sorted((workdir / "eval").glob("*.json"), key=lambda p: p.stat().st_mtime)[-1].read_text())
print(f"train command wall time {wall // 60}m{wall % 60:02d}s (loop {summary['train_time_sec']:.0f}s), "
      f"{summary['steps']} steps, {summary['tokens_per_sec']:.0f} target tokens/s")
print("validation perplexity by step: " + ", ".join(f"{e['step']}: {e['perplexity']:.2f}" for e in evals))
print(f"sacreBLEU {report['sacrebleu']['bleu']:.2f} ({report['sacrebleu']['signature']}), "
      f"{report['sentences_per_sec']:.1f} sentences/s decoding (+{report['compile_sec']:.0f}s compile)")
PY
