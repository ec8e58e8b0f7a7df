"""The default recipe's neighbours at equal CPU time: would another setting reach a better BLEU sooner?

    python -m experiments.run experiments/recipe_sweep.py --base=configs/multi30k.py --seeds=1 \
        --first_seed=1 --root=runs/experiments/recipe_sweep

Each variant changes one setting of configs/multi30k.py and trains for the CPU time of the reference's
first REFERENCE_STEPS steps (a quarter of the 40-minute default run: what one session's CPU holds for
a sweep; rankings this early can differ from those at the end). A variant whose step costs less gets
more steps: STEP_COST is seconds per step on the config's own batches relative to the reference,
from `transformer-benchmark --config=configs/multi30k.py [--config.KEY=VALUE] --seq_len=16 --steps=5
--decode_sentences=0 --checkpoint_saves=0 --real_batches=40` (real_step_sec_mean, one after the
other on the 2-core VM, 2026-11-23, with the speed-up's intermediate code: one malloc arena, the
projection's gradient by autodiff; the ratio, not the seconds, is what the grid uses). The
inverse-square-root schedule and the moving average do not depend on train.steps, so a shortened run
is exactly the first part of a full one. Issue 18's third round made dropout's masks cheaper
(`train.dropout_rng = unsafe_rbg_threefry`), so before the sweep goes on, re-measure the ratio in one
process (`python -m experiments.step_profile --versus=model.dropout=0.0`) and restart the variants
that use dropout (their masks changed); dropout0/seed1 does not depend on the key.

Batches of 4,096 tokens are not in the grid: their step cost 2.39x the reference's (1.78 s vs 0.75 s
on real batches, more padding in larger buckets), 18% fewer real tokens per second and half the
updates, so they lose at equal time before training starts. Results: experiments/results/recipe_sweep/.
"""

from experiments.grids import Grid, Variant

REFERENCE_STEPS = 1000
STEP_COST = {"dropout0": 0.652 / 0.747}  # real_step_sec_mean, dropout 0.0 vs the reference


def equal_time_steps(name: str) -> int:
  """The steps that take as long as the reference's REFERENCE_STEPS, rounded to 50."""
  return round(REFERENCE_STEPS / STEP_COST[name] / 50) * 50


def get_grid():
  return Grid("recipe_sweep", [
      Variant("reference", {"train.steps": REFERENCE_STEPS}),
      Variant("lr2", {"train.learning_rate": 2.0, "train.steps": REFERENCE_STEPS}),
      Variant("dropout0", {"model.dropout": 0.0, "train.steps": equal_time_steps("dropout0")}),
  ])
