#!/usr/bin/env bash
# Multi30k against its literature, one queue: Wu et al.'s Transformer-Tiny reproduced (three seeds,
# scored on validation and the three test sets, experiments/results/multi30k_wu_tiny/), then the
# levers on it (one seed each, validation only, experiments/results/multi30k_levers/), with the
# De->En run some of them learn from (experiments/results/multi30k_backward/). Each grid
# resumes where it stopped and restores what its record holds, so the same line continues the queue
# wherever it was; run it at low priority beside other work:
#   bash experiments/recipes/multi30k_literature.sh TEST_DIR [--parallel=N]
# with `../shared/tools/commit-records` (or any committer) on each of the three record folders. Before the
# levers start, two runs are reused rather than trained again: the levers' first row is the
# reproduction's seed 0 (same config, same seed: copied from its record), and `steps16k` seed 0 is
# that run continued from its step-8,000 checkpoint (the inverse square root schedule has no end,
# so training to 8,000 and on to 16,000 is the same run as training to 16,000; the grid continues a
# run whose stored train.steps is below the planned ones). The levers' `distilled` trains on the
# training sources' translations by an ensemble of the levers trained before it, chosen on
# validation and made once (experiments/recipes/multi30k_teacher.py) after they have trained;
# `distilled2` on those of a second teacher whose pool holds the first student; `diversified` also
# on the training targets' back-translations by the De->En run of multi30k_backward.py.
set -euo pipefail
test_dir=${1:?"pass the folder of Multi30k's test sets (test_2016_flickr.en.gz, ...; see docs/experiments.md)"}
root=runs/experiments
transformer-experiment experiments/recipes/multi30k_wu_tiny.py --base=configs/multi30k_tiny.py \
  --seeds=3 --root=$root/multi30k_wu_tiny --test_dir="$test_dir" \
  --record=experiments/results/multi30k_wu_tiny "${@:2}"

first=experiments/results/multi30k_levers/runs/wu_tiny/seed0
if [[ ! -e $first ]]; then
  mkdir -p "$(dirname "$first")"
  cp -r experiments/results/multi30k_wu_tiny/runs/wu_tiny/seed0 "$first"
fi
longer=$root/multi30k_levers/steps16k/seed0
if [[ ! -e $longer && -e $root/multi30k_wu_tiny/wu_tiny/seed0/checkpoints/8000 ]]; then
  mkdir -p "$(dirname "$longer")"
  cp -r $root/multi30k_wu_tiny/wu_tiny/seed0 "$longer"
  rm -rf "$longer/eval" "$longer/eval.log"
fi
levers=(transformer-experiment experiments/recipes/multi30k_levers.py --base=configs/multi30k_tiny.py
        --seeds=1 --root=$root/multi30k_levers --record=experiments/results/multi30k_levers "${@:2}")
# The teacher's runs first, then the De->En run that back-translates the training targets, then
# the teachers (the students' targets), then the rest of the levers.
"${levers[@]}" --only="$(python -c 'from experiments.recipes.multi30k_levers import TEACHERS as t
print(",".join(t["teacher"].pool))')" || echo "a run of the teacher's failed (above): the teacher waits, the other levers go on" >&2
transformer-experiment experiments/recipes/multi30k_backward.py --base=configs/multi30k_tiny.py \
  --seeds=1 --root=$root/multi30k_backward --record=experiments/results/multi30k_backward "${@:2}" \
  || echo "the De->En run failed (above): the back-translations wait, the other levers go on" >&2
python -m experiments.recipes.multi30k_teacher
"${levers[@]}"
