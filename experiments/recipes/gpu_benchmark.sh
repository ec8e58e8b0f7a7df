#!/usr/bin/env bash
# Every GPU figure docs/performance.md asks for, in one call (device time is short):
# base and big at the paper's 25k target tokens per step, bf16, with each attention kernel and the
# memory options; one JSON per setting in OUT (default: bench_gpu/), then a summary table. Most
# important first (a lease may end mid-way); decoding and checkpoint saves on base and big only.
# On one H200 base and big take ~5 minutes with their decoding and saves, the profile ~2, the whole
# recipe over 15: a 10-minute call reaches the profile or the first comparison.
#   bash experiments/recipes/gpu_benchmark.sh [OUT [PART...]]
# PARTs name what to run (default: all), e.g. `big big_remat_dots big_accum2 big_scan` for the memory options.
set -uo pipefail
out=${1:-${OUT:-bench_gpu}}
parts=" ${*:2} "
want() { [[ "$parts" == "  " || "$parts" == *" $1 "* ]]; }
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
bench() {  # NAME CONFIG FLAGS...
  local name=$1 config=$2; shift 2
  want "$name" || return 0
  echo "== $name"
  python3 -m transformer.accelerators.benchmark --config="$config" --batch_tokens=25000 --seq_len=32 \
    --steps=20 --warmup=5 --decode_sentences=0 --measure_peak --checkpoint_saves=0 \
    --output="$out/$name.json" "$@" \
    2>"$out/$name.log" | cut -c1-400 || tail -3 "$out/$name.log"
}
bench base configs/wmt14_ende.py:base --checkpoint_saves=3 --decode_sentences=-1
bench big configs/wmt14_ende.py:big --checkpoint_saves=3 --decode_sentences=-1
# Where base's step goes (the measured step is 1.8x the compiled prediction): GPU kernels summed by
# the model code they come from; the trace is kept in base_trace/ for TensorBoard or Perfetto.
if want base_profile; then
  echo "== base_profile"
  python3 -m experiments.analyses.step_profile --config=configs/wmt14_ende.py:base --rows=781 --seq_len=32 \
    --top=25 --trace_dir="$out/base_trace" > "$out/base_profile.txt" 2> "$out/base_profile.log" \
    && grep -v "^    " "$out/base_profile.txt" || tail -3 "$out/base_profile.log"
fi
# cuDNN's flash attention against ours, alternating in one process (separate processes differ by up
# to 8%): at rows of 32 tokens ours made the step 0.934x, at 64 1.022x, at 128 1.107x (one H200, 2026-11-26),
# which is why `auto` keeps cuDNN (WMT's buckets reach 256). Each comparison takes ~2.5 minutes.
for len in 32 128; do
  want "base_attention_versus_$len" || continue
  echo "== base_attention_versus_$len"
  python3 -m experiments.analyses.step_profile --config=configs/wmt14_ende.py:base --rows=$((25000 / len)) \
    --seq_len=$len --versus=model.attention=reference --rounds=6 2> "$out/base_attention_versus_$len.log" \
    | tee "$out/base_attention_versus_$len.txt"
done
bench base_xla_attention configs/wmt14_ende.py:base --config.model.attention=xla
bench big_remat_dots configs/wmt14_ende.py:big --config.model.remat=dots
bench big_accum2 configs/wmt14_ende.py:big --config.train.grad_accum_steps=2
bench big_scan configs/wmt14_ende.py:big --config.model.scan_layers=True
bench base_reference_attention configs/wmt14_ende.py:base --config.model.attention=reference
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
from transformer.model.size import table_peak
print("| setting | tokens/s | step s | MFU (table peak) | MFU vs measured | peak GiB | decode sent/s |")
print("|---|---|---|---|---|---|---|")
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(path.read_text())
    peak = table_peak(r["device"])
    table = r["analytic_tflops_per_sec"] / (peak * r["devices"]) if peak else float("nan")
    mem = (r["peak_memory_bytes"] or 0) / 2**30
    print(f"| {path.stem} | {r['target_tokens_per_sec']:,.0f} | {r['step_sec_median']:.3f} | {table:.1%} | "
          f"{r['mfu']:.1%} | {mem:.1f} | {r.get('decode_beam4_sentences_per_sec', 0):.1f} |".replace("| 0.0 |", "| – |"))
PY
