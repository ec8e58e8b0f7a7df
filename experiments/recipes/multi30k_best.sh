#!/usr/bin/env bash
# The best Multi30k En->De recipe measured here, one command: Wu et al.'s Transformer-Tiny with three
# levers (their fork's q/k/v initialisation, feed-forward dropout, word dropout), an ensemble of
# them as the teacher of a distilled student (experiments/recipes/multi30k_teacher.py), and the
# ensemble that the validation set chose among the four (experiments/results/
# multi30k_levers_ensemble/selection/): the student, word dropout and the q/k/v initialisation,
# decoded together (beam 5), scored on validation and the three official test sets.
#   bash experiments/recipes/multi30k_best.sh TEST_DIR [--parallel=N]
# Its runs are the levers grid's (experiments/results/multi30k_levers/): a run kept in that record
# is restored, not trained again, so on a checkout with the committed record this only decodes
# (~3 min on 2 cores). To train it all (~6 hours of a 2-core Zen 5 EPYC), first remove the four
# runs' folders and the teacher from the record:
#   rm -r experiments/results/multi30k_levers/{teacher,runs/{fairseq_init,act_dropout,word_dropout,distilled}}
set -euo pipefail
test_dir=${1:?"pass the folder of Multi30k's test sets (test_2016_flickr.en.gz, ...; see docs/experiments.md)"}
record=experiments/results/multi30k_levers
levers=(transformer-experiment experiments/recipes/multi30k_levers.py --base=configs/multi30k_tiny.py
        --seeds=1 --root=runs/experiments/multi30k_levers --record=$record "${@:2}")
"${levers[@]}" --only=fairseq_init,act_dropout,word_dropout   # the teacher's runs
python -m experiments.recipes.multi30k_teacher                  # the teacher's translations
"${levers[@]}" --only=distilled                                 # the student
members=""                                                      # their kept models, ensembled
for name in distilled word_dropout fairseq_init; do members+="${members:+,}$record/runs/$name/seed0/model"; done
python -m experiments.recipes.multi30k_test_sets "$members" \
  --test_dir="$test_dir" --output_dir=experiments/results/multi30k_levers_ensemble \
  --report_dir=experiments/results/multi30k_levers_ensemble/en-de/translations
