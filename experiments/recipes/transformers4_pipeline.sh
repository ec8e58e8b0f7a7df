#!/usr/bin/env bash
# A model written by `transformer-export --format=huggingface` under Transformers 4, where
# pipeline("translation") still exists: it must give the translations that MarianMTModel.generate
# gives under the installed Transformers 5, and load the stored position table. Installs
# transformers 4.57.6 and the two dependencies it pins apart from Transformers 5 into a folder
# (pip --target) that goes first on this interpreter's path, so the rest (torch included) is this
# environment's, in a venv or not.
#   bash experiments/recipes/transformers4_pipeline.sh EXPORTED_DIR SOURCE_FILE [FOLDER]
set -euo pipefail
model=${1:?"pass a directory written by transformer-export --format=huggingface"}
source_file=${2:?"pass a file of source sentences (one per line)"}
folder=${3:-runs/transformers4}
mkdir -p "$folder"
# --no-deps: the two dependencies Transformers 4 pins apart from 5's, nothing else (numpy, torch and
# the rest stay this environment's)
[ -d "$folder/packages/transformers" ] || python -m pip install --quiet --no-deps \
  --target "$folder/packages" "transformers==4.57.6" "huggingface_hub<1.0" "tokenizers<0.23"
snippet='
import json, sys
from transformers import MarianMTModel, MarianTokenizer
model, lines = sys.argv[1], open(sys.argv[2]).read().splitlines()[:64]
tokenizer, engine = MarianTokenizer.from_pretrained(model), MarianMTModel.from_pretrained(model)
batch = tokenizer(lines, return_tensors="pt", padding=True, truncation=True)
print(json.dumps(tokenizer.batch_decode(engine.generate(**batch), skip_special_tokens=True)))'
python -c "$snippet" "$model" "$source_file" 2>/dev/null > "$folder/generate_v5.json"
PYTHONPATH="$folder/packages${PYTHONPATH:+:$PYTHONPATH}" python - "$model" "$source_file" \
  "$folder/generate_v5.json" <<'PY'
import json, sys
import transformers
from transformers import pipeline
model, lines = sys.argv[1], open(sys.argv[2]).read().splitlines()[:64]
expected = json.load(open(sys.argv[3]))
got = [t["translation_text"] for t in pipeline("translation", model=model)(lines, truncation=True)]
same = sum(a == b for a, b in zip(got, expected))
print(f"transformers {transformers.__version__}: pipeline('translation') = Transformers 5's "
      f"generate() on {same} of {len(lines)} sentences")
sys.exit(0 if same == len(lines) else 1)
PY
