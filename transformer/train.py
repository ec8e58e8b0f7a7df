"""Training: the paper's optimizer and schedule, label-smoothed loss, jit-compiled steps, the loop.

    transformer-train --config=configs/multi30k.py --workdir=runs/m30k [--config.train.steps=...]

The train step is compiled once per batch shape with the state replicated and the batch split over a
1-D `data` mesh of all devices (partitioning.py). The loop logs a progress line every
`train.log_every` steps, computes validation loss/accuracy/perplexity every `train.eval_every` steps
(teacher-forced, cheap; BLEU is the separate evaluation program's job), saves Orbax checkpoints
asynchronously every `train.checkpoint_every` steps, and resumes from the latest one when restarted.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags
from flax.training import train_state
from ml_collections import config_flags

from transformer import checkpoints, partitioning
from transformer.cli import run_program
from transformer.config import ConfigError, validate
from transformer.data import batching, sources, vocab as vocab_lib
from transformer.metrics import MetricWriter, format_duration
from transformer.model import PAD_ID, ModelConfig, Transformer, shift_right

log = logging.getLogger("transformer")

TrainState = train_state.TrainState
FLAGS = flags.FLAGS


# ------------------------------------------------------------------------------ optimizer and loss

def learning_rate_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0  # optax counts updates from 0
    return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
  return schedule


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam(beta1, beta2, eps) on the paper's schedule."""
  schedule = learning_rate_schedule(cfg.model.d_model, cfg.train.warmup_steps,
                                    cfg.train.learning_rate)
  return optax.adam(schedule, b1=cfg.train.adam_b1, b2=cfg.train.adam_b2, eps=cfg.train.adam_eps)


def loss_sums(logits: jax.Array, targets: jax.Array, smoothing: float) -> dict[str, jax.Array]:
  """Summed float32 losses over non-padding target tokens.

  'loss' is label-smoothed cross-entropy: the true class gets probability 1 - smoothing and the
  smoothing mass is spread evenly over the other V - 1 classes. 'nll' is the plain negative
  log-likelihood (for perplexity), 'correct' counts argmax hits, 'tokens' counts real tokens.
  """
  vocab_size = logits.shape[-1]
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  off = smoothing / (vocab_size - 1)
  smoothed = -((1.0 - smoothing - off) * target_log_prob + off * log_probs.sum(axis=-1))
  weights = (targets != PAD_ID).astype(jnp.float32)
  return {"loss": (smoothed * weights).sum(), "nll": (-target_log_prob * weights).sum(),
          "correct": ((logits.argmax(-1) == targets) * weights).sum(), "tokens": weights.sum()}


# -------------------------------------------------------------------------------------- the steps

def create_train_state(model: Transformer, tx: optax.GradientTransformation,
                       rng: jax.Array) -> TrainState:
  dummy = jnp.ones((1, 8), jnp.int32)
  params = model.init(rng, dummy, dummy)["params"]
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def abstract_train_state(cfg: ml_collections.ConfigDict, model: Transformer,
                         sharding: jax.sharding.Sharding) -> TrainState:
  """Shapes, dtypes and layout of the train state, without computing it (the restore target)."""
  init = functools.partial(create_train_state, model, make_optimizer(cfg))
  return partitioning.with_sharding(jax.eval_shape(init, jax.random.PRNGKey(0)), sharding)


def train_step(state: TrainState, batch: dict[str, jax.Array], dropout_rng: jax.Array, *,
               smoothing: float) -> tuple[TrainState, dict[str, jax.Array]]:
  """One Adam update on the mean label-smoothed loss per target token of the (global) batch."""
  rng = jax.random.fold_in(dropout_rng, state.step)

  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["src"], shift_right(batch["tgt"]),
                            deterministic=False, rngs={"dropout": rng})
    sums = loss_sums(logits, batch["tgt"], smoothing)
    return sums["loss"] / jnp.maximum(sums["tokens"], 1.0), sums

  grads, sums = jax.grad(loss_fn, has_aux=True)(state.params)
  sums["grad_norm"] = optax.tree.norm(grads)
  return state.apply_gradients(grads=grads), sums


def jit_train_fns(cfg: ml_collections.ConfigDict, model: Transformer, mesh: jax.sharding.Mesh):
  """(init, step): the jit-compiled state initialisation and train step, state replicated on `mesh`.

  `init(rng) -> state`; `step(state, batch, dropout_rng) -> (state, sums)`, donating the old state.
  Training and the benchmark both use these, so they time exactly what trains.
  """
  replicated = partitioning.replicated(mesh)
  init = jax.jit(functools.partial(create_train_state, model, make_optimizer(cfg)),
                 out_shardings=replicated)
  step = jax.jit(functools.partial(train_step, smoothing=cfg.train.label_smoothing),
                 out_shardings=(replicated, replicated), donate_argnums=(0,))
  return init, step


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: Transformer) -> dict[str, jax.Array]:
  logits = model.apply({"params": params}, batch["src"], shift_right(batch["tgt"]))
  return loss_sums(logits, batch["tgt"], smoothing=0.0)


def evaluate_loss(eval_fn, params: Any, batches: Iterable[dict[str, np.ndarray]],
                  mesh: jax.sharding.Mesh) -> dict[str, float]:
  """Teacher-forced validation metrics: per-token NLL, accuracy and perplexity."""
  totals = {"nll": 0.0, "correct": 0.0, "tokens": 0.0}
  for batch in batches:
    sums = jax.device_get(eval_fn(params, partitioning.shard_batch(batch, mesh)))
    for k in totals:
      totals[k] += float(sums[k])
  nll = totals["nll"] / totals["tokens"]
  return {"nll": nll, "accuracy": totals["correct"] / totals["tokens"],
          "perplexity": float(np.exp(nll)), "tokens": totals["tokens"]}


# --------------------------------------------------------------------------------------- the loop

def interval_record(step_sums: list[dict[str, np.ndarray]], seconds: float) -> dict[str, float]:
  """Per-token averages of the steps since the last progress line, and their throughput."""
  tokens = sum(float(s["tokens"]) for s in step_sums)
  return {"loss": sum(float(s["loss"]) for s in step_sums) / tokens,
          "nll": sum(float(s["nll"]) for s in step_sums) / tokens,
          "accuracy": sum(float(s["correct"]) for s in step_sums) / tokens,
          "grad_norm": float(np.mean([s["grad_norm"] for s in step_sums])),
          "tokens": tokens, "tokens_per_sec": tokens / seconds}


def prepare_data(cfg: ml_collections.ConfigDict, workdir: Path, row_multiple: int):
  """Reads the text, builds or reuses the vocabulary, and returns (vocab, train and eval batchers)."""
  train_text = sources.load_split(cfg.data, cfg.data.train_split)
  eval_text = sources.load_split(cfg.data, cfg.data.eval_split)
  vocab = vocab_lib.vocab_for_run(workdir, train_text.source + train_text.target,
                                  cfg.data.vocab_size, cfg.data.vocab_model_type,
                                  cfg.data.vocab_sample_sentences, cfg.seed)
  train_pairs = batching.encode_pairs(vocab, train_text, cfg.data.max_len)
  eval_pairs = batching.encode_pairs(vocab, eval_text, cfg.data.max_len)
  train_batches = batching.TokenBudgetBatcher(train_pairs, cfg.data.tokens_per_batch,
                                              cfg.data.max_len, seed=cfg.seed, shuffle=True,
                                              row_multiple=row_multiple)
  eval_batches = batching.TokenBudgetBatcher(eval_pairs, cfg.data.tokens_per_batch,
                                             cfg.data.max_len, shuffle=False,
                                             row_multiple=row_multiple)
  log.info("Data: %d training pairs (%d batches per epoch), %d validation pairs, vocabulary %d",
           len(train_pairs.source), train_batches.batches_per_epoch, len(eval_pairs.source),
           vocab.get_piece_size())
  return vocab, train_batches, eval_batches


def train_and_evaluate(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (or resumes) the run in `workdir` up to `cfg.train.steps`; returns a summary."""
  validate(cfg)
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  checkpoints.save_run_config(workdir, cfg)
  mesh = partitioning.data_mesh()
  vocab, train_batches, eval_batches = prepare_data(cfg, workdir, row_multiple=mesh.size)

  model = Transformer(ModelConfig.from_config(cfg.model, vocab.get_piece_size()))
  replicated = partitioning.replicated(mesh)
  init_rng = jax.random.PRNGKey(cfg.seed)
  dropout_rng = jax.random.key(cfg.seed + 1, impl=cfg.train.dropout_rng)
  init, step_fn = jit_train_fns(cfg, model, mesh)
  mngr = checkpoints.manager(workdir, keep=cfg.train.keep_checkpoints)
  if mngr.latest_step() is not None:
    state = checkpoints.restore(mngr, abstract_train_state(cfg, model, replicated))
    log.info("Resumed from the checkpoint at step %d", int(state.step))
  else:
    state = init(init_rng)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  log.info("Model: %s parameters; %d devices (%s)", f"{n_params:,}", mesh.size,
           jax.devices()[0].platform)

  eval_fn = jax.jit(functools.partial(eval_step, model=model), out_shardings=replicated)
  schedule = learning_rate_schedule(cfg.model.d_model, cfg.train.warmup_steps,
                                    cfg.train.learning_rate)
  writer = MetricWriter(workdir)
  start = int(state.step)
  total = cfg.train.steps
  if start >= total:
    log.info("Already trained to step %d (train.steps = %d); nothing to do", start, total)
  t_start = time.time()
  interval_start, interval_sums = time.time(), []
  tokens_seen = 0.0
  for step in range(start, total):
    state, sums = step_fn(state, partitioning.shard_batch(train_batches.batch_at(step), mesh),
                          dropout_rng)
    interval_sums.append(sums)  # fetched only when logging, so the host never waits on the device
    done = step + 1
    if done % cfg.train.log_every == 0 or done == total:
      step_sums = jax.device_get(interval_sums)  # waits for the device to finish the interval
      now = time.time()
      record = interval_record(step_sums, now - interval_start)
      record.update(learning_rate=float(schedule(step)),
                    epoch=done / train_batches.batches_per_epoch, elapsed=now - t_start)
      tokens_seen += record.pop("tokens")
      writer.write("train", done, **record)
      eta = record["elapsed"] / (done - start) * (total - done)
      log.info("step %d/%d | loss %.3f | nll %.3f | lr %.2e | %.0f tok/s | elapsed %s | ETA %s",
               done, total, record["loss"], record["nll"], record["learning_rate"],
               record["tokens_per_sec"], format_duration(record["elapsed"]), format_duration(eta))
      interval_start, interval_sums = time.time(), []
    if done % cfg.train.eval_every == 0 or done == total:
      metrics = evaluate_loss(eval_fn, state.params, eval_batches.one_pass(), mesh)
      writer.write("eval", done, **metrics)
      log.info("eval at step %d | nll %.3f | perplexity %.2f | accuracy %.3f", done,
               metrics["nll"], metrics["perplexity"], metrics["accuracy"])
    if done % cfg.train.checkpoint_every == 0 or done == total:
      checkpoints.save(mngr, done, state)
  mngr.wait_until_finished()
  train_time = time.time() - t_start
  summary = {"steps": total, "resumed_from": start, "train_time_sec": train_time,
             "tokens_per_sec": tokens_seen / train_time if train_time and tokens_seen else None,
             "parameters": n_params}
  if total > start:
    writer.write("summary", total, **summary)
    log.info("Trained steps %d-%d in %s (%.0f target tokens/s). Next: transformer-eval "
             "--workdir=%s", start, total, format_duration(train_time), summary["tokens_per_sec"],
             workdir)
  return summary


# ---------------------------------------------------------------------------------- command line

def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.config is None or FLAGS.workdir is None:
    raise app.UsageError("pass --config=configs/multi30k.py (or another config) and --workdir=DIR")
  try:
    train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (ConfigError, sources.DataError, checkpoints.CheckpointError) as e:
    sys.exit(f"transformer-train: error: {e}")


def run() -> None:
  """Console-script entry point (flags are defined here, so importing this module defines none)."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file, e.g. "
                                  "configs/multi30k.py or configs/wmt14_ende.py:big.")
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary and metrics.")
  run_program("transformer-train", main)


if __name__ == "__main__":
  run()
