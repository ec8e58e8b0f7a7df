"""The literature's tiny Transformer at the default run's CPU time: do smaller, faster steps win?

    transformer-experiment experiments/recipes/tiny_recipe.py --base=configs/multi30k.py --seeds=2 \
        --root=runs/experiments/tiny_recipe

The strongest published text-only Multi30k baselines are tiny (d_model 128, d_ff 256, 4 heads, 4 + 4
layers, dropout 0.3; Wu et al. 2021). A tiny step costs a fraction of the default's, so in the default
run's 40 CPU-minutes it gets more updates: STEP_COST is the variant's step time relative to the
default's, measured in one process with the two steps alternating (`python -m
experiments.analyses.step_profile --versus=model.d_model=128,model.d_ff=256,train.learning_rate=0.7071
[,model.num_layers=4] --rounds=4`, 2-core VM, 2026-11-26: 0.340 for 2 + 2 layers, 0.510 for 4 + 4).
The schedule's peak scales as d_model^-0.5, so learning_rate 1/sqrt(2) keeps the default's peak
(2.2e-3; a higher peak cost 11-17 BLEU in the recipe sweep). Step counts, not the clock, fix each
run's budget, so the results do not depend on what else the machine did.
"""

from transformer.sweeps.grids import Grid, Variant

DEFAULT_STEPS = 4800
STEP_COST = {"tiny2": 0.340, "tiny4_drop0.3": 0.510}
TINY = {"model.d_model": 128, "model.d_ff": 256, "model.num_heads": 4, "train.learning_rate": 0.7071}


def equal_time_steps(name: str) -> int:
  """The steps that take as long as the default's DEFAULT_STEPS, rounded to 50."""
  return round(DEFAULT_STEPS / STEP_COST[name] / 50) * 50


def get_grid():
  return Grid("tiny_recipe", [
      Variant("default"),
      Variant("tiny2", {**TINY, "train.steps": equal_time_steps("tiny2")}),
      Variant("tiny4_drop0.3", {**TINY, "model.num_layers": 4, "model.dropout": 0.3,
                                 "train.steps": equal_time_steps("tiny4_drop0.3")}),
  ])
