"""A grid of your own: warm-up length and label smoothing on Multi30k, 4 variants.

    transformer-experiment experiments/recipes/example_grid.py --base=configs/multi30k.py --seeds=3

Each Variant is a name (its folder under the experiment root) and the config keys it changes; the first
variant is the reference row of the table. Keys are the config's dotted names (transformer/config.py).
"""

from transformer.sweeps.grids import Grid, Variant


def get_grid():
  return Grid("warmup_smoothing", [
      Variant("reference"),
      Variant("warmup400", {"train.warmup_steps": 400}),
      Variant("warmup1600", {"train.warmup_steps": 1600}),
      Variant("no_smoothing", {"train.label_smoothing": 0.0}),
  ])
