"""The De->En Transformer-Tiny that back-translates Multi30k's training targets for the levers.

    transformer-experiment experiments/recipes/multi30k_backward.py --base=configs/multi30k_tiny.py \
        --seeds=1 --root=runs/experiments/multi30k_backward \
        --record=experiments/results/multi30k_backward

Data diversification (Nguyen et al., 2020) trains on the real pairs, the training sources paired
with a forward model's translations, and the training targets paired with a backward model's
translations of them. This grid trains the backward model: the reproduced recipe
(configs/multi30k_tiny.py) in the other direction, German to English, on the bundled pairs (its own
joint vocabulary: what it gives the students is text), scored on the validation set as the levers
are. Its kept model is the `backward` teacher of experiments/recipes/multi30k_levers.py,
which experiments/recipes/multi30k_teacher.py makes: the English of the 29,000 German training
targets, which the levers' `diversified` student learns from. It has its own grid, since its
translations are English: against the levers' German references its scores would mean nothing.
experiments/recipes/multi30k_literature.sh trains it before the levers' students.
"""

from transformer.sweeps.grids import Grid, Variant

BACKWARD = {"data.src_lang": "de", "data.tgt_lang": "en"}


def get_grid():
  return Grid("multi30k_backward", [Variant("de_en", BACKWARD)], average_last=10,
              select_on="dev", keep_models="float16")
