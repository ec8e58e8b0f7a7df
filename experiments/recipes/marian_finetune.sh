#!/usr/bin/env bash
# A trained run through Transformers' Marian format and back, then fine-tuned: what a user does with
# an OPUS-MT model, on a model whose scores are known. The run is exported (transformer-export
# --format=huggingface), saved again by Transformers (as the hub's models are), imported
# (transformer-import), evaluated beside the run itself (the same BLEU is expected: the import is
# the run bit for bit), fine-tuned for STEPS steps on the bundled Multi30k (train.init_from, a fresh
# schedule peaking near the run's last learning rate) and evaluated again. Writes
# experiments/results/marian_finetune/<cpu>-<date>-<commit>-lr<LR>.json (scores, the fine-tune's
# first and last losses, command, machine, commit); the work folder OUT keeps every run. LR
# multiplies the schedule (config.train.learning_rate; 0.15 peaks near the default run's last rate).
#   bash experiments/recipes/marian_finetune.sh RUN [OUT] [STEPS] [LR]
set -euo pipefail
RUN=${1:?"pass a trained run's workdir (e.g. the default run's)"}
OUT=${2:-runs/marian_finetune}
STEPS=${3:-300}
LR=${4:-0.15}
TUNED=tuned_lr$LR
COMMIT=$(git rev-parse --short HEAD)
CPU=$(python -c "from transformer import hardware; print(hardware.cpu_model().lower().replace(' ', '-').replace('\"', ''))")
RECORD=experiments/results/marian_finetune/${CPU}-$(date -u +%Y-%m-%d)-${COMMIT}-lr${LR}.json
mkdir -p "$OUT" "$(dirname "$RECORD")"
[ -d "$OUT/exported" ] || transformer-export --workdir="$RUN" --format=huggingface --output="$OUT/exported"
[ -d "$OUT/resaved" ] || python - "$OUT/exported" "$OUT/resaved" <<'PY'
import sys
from transformers import MarianMTModel, MarianTokenizer
MarianMTModel.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
MarianTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
PY
[ -d "$OUT/imported" ] || transformer-import --format=huggingface --model="$OUT/resaved" --workdir="$OUT/imported"
transformer-train --config=configs/multi30k.py --workdir="$OUT/$TUNED" --config.train.init_from="$OUT/imported" \
  --config.train.steps="$STEPS" --config.train.warmup_steps=$((STEPS / 3)) --config.train.learning_rate="$LR" \
  --config.train.eval_every="$STEPS" --config.train.checkpoint_every="$STEPS" --config.train.log_every=25 \
  > "$OUT/$TUNED.log" 2>&1
for run in "$RUN" "$OUT/imported" "$OUT/$TUNED"; do
  transformer-eval --workdir="$run" --report_dir="$OUT/eval/$(basename "$run")" > "$OUT/eval_$(basename "$run").log" 2>&1
done
python - "$RUN" "$OUT" "$STEPS" "$COMMIT" "$RECORD" "$LR" <<'PY'
import json, sys, time
from pathlib import Path
from transformer import hardware
from transformer.metrics import read_metrics
run, out, steps, commit, record, lr = (sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                       sys.argv[5], sys.argv[6])
def scores(name):
  report = next((out / "eval" / name).glob("validation_step*_ema.json"))
  return {k: v for k, v in json.loads(report.read_text()).items()
          if k in ("checkpoint_step", "sacrebleu", "chrf", "tokenized_bleu", "lc_tok_bleu")}
train = read_metrics(out / f"tuned_lr{lr}", "train")
result = {"command": f"bash experiments/recipes/marian_finetune.sh {run} {out} {steps} {lr}",
          "machine": hardware.describe()["machine"], "commit": commit,
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "run": scores(Path(run).name), "imported": scores("imported"),
          "fine_tuned": scores(f"tuned_lr{lr}"), "learning_rate": float(lr),
          "fine_tune_nll": {"first": train[0]["nll"], "last": train[-1]["nll"],
                            "steps": [r["step"] for r in train]}}
Path(record).write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1))
PY
