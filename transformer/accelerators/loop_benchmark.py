"""The training loop's speed beside its step's: `transformer-benchmark --loop=N`.

Runs the real training loop (transformer-train's, on the config's own data: loader, host work,
progress lines; validation and checkpoints only after the timed steps) for one progress interval
(`train.log_every` steps, untimed: start-up, compilation, the loader filling) and then N steps, and
reads its target tokens/s from the progress records of those N. Then the same step, alone: every
batch those N steps trained on, placed on the devices first, dispatched back to back from the same
starting state. The ratio (loop / step alone) is the share of the step's speed the loop keeps;
what it loses is the host's work between steps. The step-alone run also checks the loop: its final
parameters must equal the loop's bit for bit.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer import partitioning
from transformer.metrics import read_metrics
from transformer.model.transformer import PAD_ID
from transformer.training import compiled
from transformer.training.step import dropout_key
from transformer.training.train import start_run, train_and_evaluate
from transformer.training.workdir import load_run

log = logging.getLogger("transformer")


def benchmark_loop(cfg: ml_collections.ConfigDict, steps: int) -> dict[str, Any]:
  """The loop's and the step's target tokens/s over `steps` steps (rounded up to whole progress
  intervals) of the config's training data, and their ratio."""
  interval = cfg.train.log_every
  timed = max(1, -(-steps // interval)) * interval
  cfg = cfg.copy_and_resolve_references()
  cfg.train.steps = cfg.train.eval_every = cfg.train.checkpoint_every = interval + timed
  cfg.train.checkpoint_minutes = 0.0
  with tempfile.TemporaryDirectory() as workdir:
    log.info("The training loop: %d steps, then %d timed", interval, timed)
    train_and_evaluate(cfg, workdir)
    records = [r for r in read_metrics(workdir, "train") if r["step"] > interval]
    tokens = [r["tokens_per_sec"] for r in records]  # one a progress interval, of equal steps
    loop_tokens_per_sec = float(np.mean(tokens))
    loop_params = load_run(workdir).raw_params
    alone = step_alone(cfg, Path(workdir), interval, timed)
  for a, b in zip(jax.tree.leaves(loop_params), jax.tree.leaves(alone.pop("params"))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  return {"loop_steps": timed, "loop_target_tokens_per_sec": loop_tokens_per_sec,
          "loop_interval_tokens_per_sec": tokens, **alone,
          "loop_over_step": loop_tokens_per_sec / alone["step_target_tokens_per_sec"],
          "loop_params_equal_step_alone": True}


def step_alone(cfg: ml_collections.ConfigDict, workdir: Path, first: int, count: int
               ) -> dict[str, Any]:
  """The train step alone on the loop's batches: a fresh start of the same run (the state at step
  0), its first `first` batches untimed, then `count` timed, every batch on the devices before."""
  run = start_run(cfg, Path(tempfile.mkdtemp(dir=workdir)))  # a fresh start: the state at step 0
  step = compiled.PerShape(run.fns.step, "train step")
  rng = dropout_key(cfg)
  healthy = jax.device_put(True, partitioning.replicated(run.mesh))
  with contextlib.closing(run.batches):
    batches = [next(run.batches)[0] for _ in range(first + count - 1)]
  batches.insert(0, run.first_batch[0])
  state = run.state
  placed = [partitioning.shard_batch(b, run.mesh) for b in batches]
  compiled.compile_all(step.lower_all([(state, b, rng, healthy) for b in placed]))
  for batch in placed[:first]:  # the untimed interval, as the loop trained it
    state, sums = step(state, batch, rng, healthy)
    healthy = sums["healthy"]
  jax.block_until_ready(state)
  t = time.perf_counter()
  for batch in placed[first:]:
    state, sums = step(state, batch, rng, healthy)
    healthy = sums["healthy"]
  jax.block_until_ready(state)
  seconds = time.perf_counter() - t
  real = sum(float((b["tgt"] != PAD_ID).sum()) for b in batches[first:])
  return {"step_target_tokens_per_sec": real * jax.process_count() / seconds,
          "step_seconds_mean": seconds / count, "params": state.params}
