#!/bin/bash
# Same checkpoint, same translations? Translates 1,000 synthetic sentences (test2016's size: random
# words of the bundled Multi30k training sources, 4-30 words, seeded) with beam search, greedy search,
# an n-best list with a minimum length and sampling; prints one sha256 per output. Run it on the
# code before and after a change that must not move a number (PYTHONPATH=<other checkout> for the
# other side; SAMPLE=--sample for code older than --search):
#   bash experiments/analyses/translation_hashes.sh RUN_WORKDIR OUT_DIR
set -e; SAMPLE=${SAMPLE:---search=sample}
RUN=$1; OUT=$2; mkdir -p $OUT
DATA=$(python -c "from transformer.data import sources; print(sources.BUNDLED_DIR)")
DATA=$DATA python - > $OUT/input.en <<'PY'
import gzip, random
words = gzip.open(__import__('os').environ['DATA'] + '/train.en.gz', 'rt').read().split()[:200000]
rng = random.Random(2016)
for _ in range(1000):
  print(' '.join(rng.choice(words) for _ in range(rng.randint(4, 30))))
PY
T="python -m transformer.evaluation.translate --workdir=$RUN --input_file=$OUT/input.en"
$T --output_file=$OUT/beam.de 2> $OUT/beam.log
$T --output_file=$OUT/greedy.de --beam_size=1 2> $OUT/greedy.log
$T --output_file=$OUT/nbest.de --nbest=3 --min_len=3 2> $OUT/nbest.log
$T --output_file=$OUT/sample.de $SAMPLE --top_p=0.9 --seed=1 2> $OUT/sample.log
cd $OUT && sha256sum beam.de greedy.de nbest.de nbest.de.nbest.jsonl sample.de
