"""Levers on the literature's Transformer-Tiny (configs/multi30k_tiny.py), chosen on validation only.

    transformer-experiment experiments/recipes/multi30k_levers.py --base=configs/multi30k_tiny.py \
        --seeds=1 --root=runs/experiments/multi30k_levers --record=experiments/results/multi30k_levers

Each variant changes one thing of the reproduced recipe; every run is scored as the literature
scores (the mean of its last 10 epoch checkpoints, beam 5) on the validation set only, with the
paired bootstrap against the same seed of the first row. No `--test_dir`: the held-out test sets
are scored once for each final candidate (experiments/recipes/multi30k_test_sets.py), never here.

The first row is the reproduction itself: its runs are multi30k_wu_tiny's (same config, same
seeds), copied into this record before the grid starts rather than trained twice:

    mkdir -p experiments/results/multi30k_levers/runs/wu_tiny
    cp -r experiments/results/multi30k_wu_tiny/runs/wu_tiny/seed0 \
        experiments/results/multi30k_levers/runs/wu_tiny/

A run is ~2.5 hours of the 2-core CPU alone (R-Drop in two micro-batches ~3x that, measured in
experiments/results/cpu/rdrop_speed/; twice the updates 2x); the grid resumes where it stopped.
Variants whose difference is under the seeds' spread get more seeds (`--seeds=3 --only=NAME`).
"""

from transformer.sweeps.grids import Grid, Variant

LEVERS = [
    Variant("wu_tiny"),                                      # the reproduction: the first row
    Variant("patience10", {"train.patience": 10}),           # their early stop (--patience 10)
    Variant("rdrop5", {"train.rdrop_alpha": 5.0,            # R-Drop, the paper's IWSLT weight,
                       "train.grad_accum_steps": 2}),       # in 2 micro-batches (cheaper on CPUs)
    Variant("steps16k", {"train.steps": 16000}),             # twice the training, same averaging
    Variant("rotary", {"model.positional": "rotary"}),       # led within the training lengths
    Variant("bpe_dropout", {"data.subword_dropout": 0.1}),   # subword regularisation
    Variant("attn_dropout", {"model.attention_dropout": 0.1}),
    Variant("deep6", {"model.num_layers": 6}),               # shape: 6 + 6 layers of d_model 128
    Variant("smooth2", {"train.label_smoothing": 0.2}),
]


def get_grid():
  return Grid("multi30k_levers", LEVERS, average_last=10, select_on="dev")
