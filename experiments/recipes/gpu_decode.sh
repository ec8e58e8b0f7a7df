#!/usr/bin/env bash
# Decoding on a GPU, in one call (device time is short). First a trained Multi30k run translates
# the validation split repeated REPEAT times (so that decoding, not the clock's resolution, is timed;
# BLEU is the split's own, every count scaled alike) with transformer-eval: beam 4 and greedy, float32
# and bfloat16 weight products, with the config's decoding batch and with the whole of a length
# bucket in one batch. Then the benchmark's equal-work decoding (each hypothesis to its reference's
# length, untrained weights) for the default Multi30k model and for WMT base. Reports, JSONs and logs
# go to OUT (default: bench_gpu_decode/); WORKDIR gains nothing but eval/ reports.
#   bash experiments/recipes/gpu_decode.sh WORKDIR [OUT] [VOCAB_CACHE_DIR] [REPEAT]
# WORKDIR: a configs/multi30k.py run, its last checkpoint read. VOCAB_CACHE_DIR: where that config's
# cached vocabulary lies, for the benchmark (default: ~/.cache/transformer/vocab; trained if absent).
set -uo pipefail
workdir=$1
out=${2:-${OUT:-bench_gpu_decode}}
vocab=${3:-}
repeat=${4:-10}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
for lang in en de; do
  for _ in $(seq "$repeat"); do zcat "transformer/data/multi30k/val.$lang.gz"; done > "$out/val$repeat.$lang"
done
evaluate() {  # NAME FLAGS...: the moving average's report and the raw parameters' (the same compiled search, run second)
  local name=$1; shift
  echo "== $name"
  if timeout 120 python3 -m transformer.evaluation.evaluate --workdir="$workdir" --source_file="$out/val$repeat.en" \
      --reference_file="$out/val$repeat.de" "$@" >"$out/$name.out" 2>"$out/$name.log"; then
    grep -E "sacreBLEU|decoded" "$out/$name.out" | cut -c1-300
    # the two reports it printed (moving average, then raw), kept under this setting's name
    for report in $(grep -o "report: [^ ]*\.json" "$out/$name.out" | cut -d" " -f2); do
      cp "$report" "$out/$name.$(basename "$report")"
    done
  else
    tail -3 "$out/$name.log"
  fi
}
evaluate float32
evaluate bfloat16 --matmul_dtype=bfloat16
evaluate f32_onebatch --tokens_per_batch=32768
evaluate bf16_onebatch --matmul_dtype=bfloat16 --tokens_per_batch=32768
evaluate greedy --beam_size=1
evaluate greedy_onebatch --beam_size=1 --tokens_per_batch=32768
bench() {  # NAME CONFIG FLAGS...
  local name=$1 config=$2; shift 2
  echo "== $name"
  timeout 150 python3 -m transformer.accelerators.benchmark --config="$config" --steps=3 --warmup=1 \
    --output="$out/$name.json" "$@" 2>"$out/$name.log" | cut -c1-300 || tail -3 "$out/$name.log"
}
bench decode_multi30k configs/multi30k.py --decode_sentences=-1 \
  ${vocab:+--config.data.vocab_cache_dir="$vocab"}
bench decode_wmt_base configs/wmt14_ende.py:base --batch_tokens=25000 --seq_len=32 --decode_sentences=1000
rm -f "$out/val$repeat.en" "$out/val$repeat.de"
