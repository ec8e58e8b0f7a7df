#!/usr/bin/env bash
# The input side at WMT's size on this machine: the stand-in corpus (4.5M pairs, En-De's size) is
# generated, prepared (vocabulary + token caches, timed), and the loader is benchmarked in bucket and
# pack modes, with BPE-dropout, and on a 40.8M-pair synthetic id cache (En-Fr's size). Writes the
# record experiments/results/input_pipeline/ (JSON per measurement) and regenerates the table in
# docs/data.md. Run from the repository root, nothing else running:
# Then the loader again beside 2 processes that keep both cores busy (a loaded host), and the start-up
# of transformer-train at both sizes (experiments/recipes/start_times.sh).
#   bash experiments/recipes/input_pipeline.sh [DATA_DIR]        # default: data/
set -euo pipefail
DATA=${1:-data}
OUT=experiments/results/input_pipeline
mkdir -p "$OUT" "$DATA"
export XDG_CACHE_HOME=$DATA/cache  # the vocabulary and token caches of this measurement only
BENCH="transformer-benchmark"  # as users run it: the programs' own malloc settings (host_memory.py)
CONFIG="configs/standin_ende.py:base,$DATA/standin_ende"
if [ ! -f "$DATA/standin_ende/standin.json" ]; then
  python -m transformer.data.standin --out="$DATA/standin_ende" --pairs=4500000
fi
cp "$DATA/standin_ende/standin.json" "$OUT/standin.json"
python - > "$OUT/machine.json" <<'PY'
import json, subprocess, time, grain, numpy, sentencepiece
from transformer import hardware
print(json.dumps({**hardware.describe(), "commit": subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "grain": grain.__version__,
    "numpy": numpy.__version__, "sentencepiece": sentencepiece.__version__}))
PY
if [ "${SKIP_PREPARE:-0}" != 1 ]; then
  /usr/bin/time -v python -m transformer.training.prepare --config="$CONFIG" \
    --report="$OUT/prepare_4.5m.json" 2> "$OUT/prepare_4.5m.log"
fi
python -m transformer.data.standin --out="$DATA/standin_ende" \
  --check_cache="$(python -c "import json; print(json.load(open('$OUT/prepare_4.5m.json'))['train']['path'])")" \
  > "$OUT/drops_4.5m.json"
for mode in bucket pack; do
  $BENCH --config="$CONFIG" --input_pipeline --config.data.batching=$mode \
    --loader_workers=0,1,2 --output="$OUT/${mode}_4.5m.json"
done
$BENCH --config="$CONFIG" --input_pipeline --config.data.subword_dropout=0.1 \
  --loader_workers=0,1,2 --batches=40 --stub_steps=40 --output="$OUT/bpe_dropout_4.5m.json"
if [ ! -f "$DATA/synthetic_40.8m/meta.json" ]; then
  python -m transformer.data.standin --synthetic_ids --pairs=40800000 --out="$DATA/synthetic_40.8m"
fi
for mode in bucket pack; do  # (En-Fr's batch settings; the synthetic ids' vocabulary is 37k)
  $BENCH --config=configs/wmt14_enfr.py:base --config.data.vocab_size=37000 --input_pipeline \
    --token_cache="$DATA/synthetic_40.8m" --config.data.batching=$mode --loader_workers=0,1,2 \
    --output="$OUT/${mode}_40.8m.json"
done
for mode in bucket pack; do
  $BENCH --config="$CONFIG" --input_pipeline --config.data.batching=$mode --busy_cores=2 \
    --loader_workers=0,1,2 --output="$OUT/${mode}_4.5m_busy.json"
done
bash experiments/recipes/start_times.sh "$DATA"
python -m experiments.tables
