"""The default recipe's neighbours at equal CPU time: would another setting reach a better BLEU sooner?

    transformer-experiment experiments/recipes/recipe_sweep.py --base=configs/multi30k.py --seeds=1 \
        --first_seed=1 --root=runs/experiments/recipe_sweep

Each variant changes one setting of configs/multi30k.py and trains for the CPU time of the reference's
first REFERENCE_STEPS steps (about a quarter of the 40-minute default run: what one session's CPU holds
for a sweep; rankings this early can differ from those at the end). A variant whose step costs less gets
more steps: STEP_COST is the variant's step time relative to the reference's, measured in one process
with the two steps alternating (`python -m experiments.analyses.step_profile --versus=KEY=VALUE --rounds=4`,
2,048 padded tokens per side as in the default batches, 2-core VM, 2026-11-24; dropout 0's with
--rounds=6 on 2026-11-23). The ratio, not the seconds, is what the grid uses. The inverse-square-root
schedule and the moving average do not depend on train.steps, so a shortened run is exactly the first
part of a full one.

Batches of 4,096 tokens are not in the grid: their step cost 2.39x the reference's (1.78 s vs 0.75 s
on real batches, more padding in larger buckets), 18% fewer real tokens per second and half the
updates, so they lose at equal time before training starts. Results: experiments/results/recipe_sweep/.
"""

from transformer.sweeps.grids import Grid, Variant

REFERENCE_STEPS = 1000
STEP_COST = {  # step time relative to the reference's (step_profile --versus)
    "dropout0": 0.886, "vocab4k": 0.881, "vocab16k": 1.198, "layers2": 0.730, "layers4": 1.251}


def equal_time_steps(name: str) -> int:
  """The steps that take as long as the reference's REFERENCE_STEPS, rounded to 50."""
  return round(REFERENCE_STEPS / STEP_COST[name] / 50) * 50


def get_grid():
  return Grid("recipe_sweep", [
      Variant("reference", {"train.steps": REFERENCE_STEPS}),
      Variant("lr2", {"train.learning_rate": 2.0, "train.steps": REFERENCE_STEPS}),
      Variant("warmup400", {"train.warmup_steps": 400, "train.steps": REFERENCE_STEPS}),
      Variant("dropout0", {"model.dropout": 0.0, "train.steps": equal_time_steps("dropout0")}),
      Variant("vocab4k", {"data.vocab_size": 4000, "train.steps": equal_time_steps("vocab4k")}),
      Variant("vocab16k", {"data.vocab_size": 16000, "train.steps": equal_time_steps("vocab16k")}),
      Variant("layers2", {"model.num_layers": 2, "train.steps": equal_time_steps("layers2")}),
      Variant("layers4", {"model.num_layers": 4, "train.steps": equal_time_steps("layers4")}),
  ])
