"""Training: the paper's optimizer and schedule, label-smoothed loss, jit-compiled steps, the loop.

    transformer-train --config=configs/multi30k.py --workdir=runs/m30k [--config.train.steps=...]

The train step is compiled once per batch shape on a (data, fsdp, tensor) mesh of all devices of all
processes, the state laid out by partitioning.py's rules (replicated in plain data parallelism) and
the batch rows split over the data-parallel axes. The loop logs a progress line every
`train.log_every` steps, computes validation loss/accuracy/perplexity every `train.eval_every` steps
(teacher-forced, cheap; BLEU is the separate evaluation program's job), saves Orbax checkpoints
asynchronously every `train.checkpoint_every` steps and, if `train.checkpoint_minutes` is set, at
the first progress line after that many minutes (the paper's 10-minute cadence), and resumes from the
latest readable one when restarted: same parameters, Adam state, step, dropout keys (a function of
seed and step) and input position, so an interrupted run ends bit-identical to an uninterrupted one.

Start-up checks everything (config, data, vocabulary, checkpoints, the first batch) before it writes
anything but the vocabulary. SIGTERM/SIGINT stop after the current step with a checkpoint
(preemption.py); a non-finite loss or gradient stops with the last good state and the batch saved,
or is skipped (faults.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.extend.random
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags
from flax.training import train_state
from ml_collections import config_flags

from transformer import checkpoints, faults, partitioning, preemption, progress
from transformer.cli import (
  define_distributed_flags,
  define_progress_flag,
  initialize_distributed,
  run_program,
)
from transformer.config import validate
from transformer.data import pipeline, sources
from transformer.data import vocab as vocab_lib
from transformer.distributed import leader_first
from transformer.errors import UserError
from transformer.info import table_peak, training_flops_per_target_token
from transformer.metrics import MetricWriter, format_duration
from transformer.model import (
  PAD_ID,
  ModelConfig,
  Transformer,
  initial_params,
  shift_right,
)

log = logging.getLogger("transformer")

FLAGS = flags.FLAGS
TrainState = train_state.TrainState


class EmaTrainState(TrainState):
  """Flax's train state plus an exponential moving average of the parameters (`train.ema_decay` >
  0); runs without one keep Flax's state, and so the checkpoint layout they always had."""
  ema_params: Any = None


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
  log-likelihood (for perplexity), 'correct' counts tokens whose target has the largest logit,
  'tokens' counts real tokens. The gradient is written by hand (`_token_losses`): autodiff of a
  log-softmax over the vocabulary made the largest single op of a CPU step.
  """
  weights = (targets != PAD_ID).astype(jnp.float32)
  loss, nll, correct = _token_losses(logits.astype(jnp.float32), targets, smoothing)
  return {"loss": (loss * weights).sum(), "nll": (nll * weights).sum(),
          "correct": (correct * weights).sum(), "tokens": weights.sum()}


def _smoothed_target(vocab_size: int, smoothing: float) -> tuple[float, float]:
  """(probability of the target, probability of each other word) of the smoothed distribution."""
  return 1.0 - smoothing, smoothing / (vocab_size - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits: jax.Array, targets: jax.Array, smoothing: float):
  """Per token: smoothed cross-entropy, NLL and 1.0 where the target's logit is the largest."""
  return _token_losses_fwd(logits, targets, smoothing)[0]


def _token_losses_fwd(logits, targets, smoothing):
  top = logits.max(axis=-1)
  log_z = jnp.log(jnp.exp(logits - top[..., None]).sum(axis=-1)) + top
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  on, off = _smoothed_target(logits.shape[-1], smoothing)
  nll = log_z - target_logit
  # -sum_v q_v log p_v with q = off everywhere, plus (on - off) at the target.
  loss = (on - off) * nll + off * (logits.shape[-1] * log_z - logits.sum(axis=-1))
  correct = (target_logit >= top).astype(jnp.float32)
  return (loss, nll, correct), (logits, log_z, targets)


def _token_losses_bwd(smoothing, residuals, cotangents):
  """d loss / d logits = p - q (q the smoothed target distribution); d nll / d logits = p - onehot."""
  logits, log_z, targets = residuals
  d_loss, d_nll, _ = cotangents
  on, off = _smoothed_target(logits.shape[-1], smoothing)
  p = jnp.exp(logits - log_z[..., None])
  is_target = jnp.arange(logits.shape[-1]) == targets[..., None]
  grad = ((d_loss + d_nll)[..., None] * p - (d_loss * off)[..., None]
          - jnp.where(is_target, (d_loss * (on - off) + d_nll)[..., None], 0.0))
  return grad, None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


# -------------------------------------------------------------------------------------- the steps

def create_train_state(model: Transformer, tx: optax.GradientTransformation, rng: jax.Array,
                       logical_axes: bool = False, ema: bool = False) -> TrainState:
  """Fresh parameters and Adam state (and, with `ema`, their moving average, starting equal to
  them); with `logical_axes` (under eval_shape) every parameter and moment keeps its logical axis
  names, from which partitioning.py derives the state's layout."""
  params = initial_params(model, rng, logical_axes)
  if ema:
    return EmaTrainState.create(apply_fn=model.apply, params=params, tx=tx,
                                ema_params=jax.tree.map(jnp.copy, params))
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def ema_decay_at(step: jax.Array, decay: float) -> jax.Array:
  """The moving average's decay after `step` updates: min(decay, (1 + step) / (10 + step)), so the
  average forgets the random initialisation quickly and spans ~the last tenth of a short run."""
  step = jnp.asarray(step, jnp.float32)
  return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def abstract_train_state(cfg: ml_collections.ConfigDict, model: Transformer,
                         sharding: jax.sharding.Sharding) -> TrainState:
  """Shapes and dtypes of the train state, without computing it, all in one `sharding`: the restore
  target of programs that only read parameters (evaluation, averaging)."""
  init = functools.partial(create_train_state, model, make_optimizer(cfg),
                           ema=cfg.train.ema_decay > 0)
  return partitioning.with_sharding(jax.eval_shape(init, jax.random.PRNGKey(0)), sharding)


PACKING_KEYS = ("src_segments", "src_positions", "tgt_segments", "tgt_positions")


def forward(apply_fn, params: Any, batch: dict[str, jax.Array], **kwargs) -> jax.Array:
  """Teacher-forced logits for a batch of one pair per row, or of packed rows (with segment ids)."""
  tgt_in = shift_right(batch["tgt"], batch.get("tgt_segments"))
  packing = {k: batch[k] for k in PACKING_KEYS if k in batch}
  return apply_fn({"params": params}, batch["src"], tgt_in, **packing, **kwargs)


def _threefry_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
  return jax.lax.rng_bit_generator(key, shape, dtype=jnp.dtype(f"uint{bit_width}"),
                                   algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)[1]


_UNSAFE_RBG = jax.extend.random.unsafe_rbg_prng_impl
# JAX's unsafe_rbg keys (seed, split and fold_in as they are) drawing their bits with XLA's ThreeFry
# generator instead of the backend's default: on the CPU the default (Philox) is 4x slower, and the
# dropout masks' bits were 12% of a train step (docs/performance.md).
UNSAFE_RBG_THREEFRY = jax.extend.random.define_prng_impl(
    key_shape=_UNSAFE_RBG.key_shape, seed=_UNSAFE_RBG.seed, split=_UNSAFE_RBG.split,
    random_bits=_threefry_bits, fold_in=_UNSAFE_RBG.fold_in, name="unsafe_rbg_threefry",
    tag="urbg3f")


def dropout_key(cfg: ml_collections.ConfigDict) -> jax.Array:
  """The run's dropout key (seed + 1) of the PRNG `train.dropout_rng` names; each step folds in its
  number, so masks are a function of (seed, step) and a resumed run draws the same ones."""
  impl = cfg.train.dropout_rng
  return jax.random.key(cfg.seed + 1,
                        impl=UNSAFE_RBG_THREEFRY if impl == "unsafe_rbg_threefry" else impl)


def train_step(state: TrainState, batch: dict[str, jax.Array], dropout_rng: jax.Array,
               healthy: jax.Array | bool = True, *, smoothing: float, accum_steps: int = 1,
               skip_nonfinite: bool = False, ema_decay: float = 0.0
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One Adam update on the mean label-smoothed loss per target token of the (global) batch.

  With `accum_steps` > 1 the batch is split into that many micro-batches whose summed gradients make
  the same update (up to float rounding and dropout masks) with a fraction of the activation memory:
  how one GPU follows the paper's 25k-token batches. Micro-batch k takes rows k, k + A, k + 2A, ...,
  so each device keeps working on its own rows.

  With `ema_decay` > 0 the state's moving average of the parameters follows each applied update
  (decay from `ema_decay_at`).

  An update whose loss or gradient is not finite is never applied: the parameters and Adam state
  stay as they were (sums['finite'] = 0). With `skip_nonfinite` the step counter still advances
  (the batch is skipped), and with it the optimizer's counters, so the learning rate stays the
  schedule's at the step. Otherwise the step is a no-op and sums['healthy'] turns false; fed back
  as `healthy`, it makes every later step a no-op too, so the trainer, which looks at the flags
  only when it syncs with the device anyway, finds the state exactly as it was before the bad step.
  """
  rng = jax.random.fold_in(dropout_rng, state.step)

  def loss_fn(params, micro, micro_rng):
    logits = forward(state.apply_fn, params, micro, deterministic=False, rngs={"dropout": micro_rng})
    sums = loss_sums(logits, micro["tgt"], smoothing)
    return sums["loss"], sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, rng)
  else:
    micro_batches = jax.tree.map(
        lambda x: x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]).swapaxes(0, 1),
        batch)

    def accumulate(totals, micro_and_index):
      micro, k = micro_and_index
      grads, sums = grad_fn(state.params, micro, jax.random.fold_in(rng, k))
      return jax.tree.map(jnp.add, totals, (grads, sums)), None

    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, state.params,
                                                        jax.tree.map(lambda x: x[0], micro_batches),
                                                        rng))
    (grads, sums), _ = jax.lax.scan(accumulate, zeros, (micro_batches, jnp.arange(accum_steps)))
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
  sums["grad_norm"] = optax.tree.norm(grads)
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(sums["grad_norm"])
  apply = finite if skip_nonfinite else finite & healthy
  updated = state.apply_gradients(grads=grads)
  keep_if_bad = lambda new, old: jnp.where(apply, new, old)
  if ema_decay > 0:
    decay = ema_decay_at(updated.step, ema_decay)
    ema = jax.tree.map(lambda avg, new: decay * avg + (1.0 - decay) * new, state.ema_params,
                       updated.params)
    updated = updated.replace(ema_params=jax.tree.map(keep_if_bad, ema, state.ema_params))
  opt_state = jax.tree.map(keep_if_bad, updated.opt_state, state.opt_state)
  if skip_nonfinite:  # the batch counts as a step: the schedule's (and Adam's) counters go on
    opt_state = _with_update_counts(opt_state, updated.opt_state)
  new_state = updated.replace(
      step=state.step + 1 if skip_nonfinite else state.step + apply.astype(jnp.int32),
      params=jax.tree.map(keep_if_bad, updated.params, state.params), opt_state=opt_state)
  sums["finite"] = finite.astype(jnp.float32)
  sums["healthy"] = jnp.asarray(True) if skip_nonfinite else apply
  return new_state, sums


def _with_update_counts(opt_state: Any, advanced: Any) -> Any:
  """`opt_state` with every optax `count` field (the schedule's step, Adam's bias correction) taken
  from `advanced`: a skipped update keeps the moments but not a learning rate behind the step."""
  is_count = lambda path: getattr(path[-1], "name", None) == "count"
  return jax.tree_util.tree_map_with_path(
      lambda path, kept, new: new if is_count(path) else kept, opt_state, advanced)


@dataclasses.dataclass(frozen=True)
class TrainFunctions:
  """The jit-compiled training functions for one model on one mesh, and the state's layout.

  `init(rng) -> state`; `step(state, batch, dropout_rng[, healthy]) -> (state, sums)`, donating the
  old state;
  `abstract_state`: shapes, dtypes and shardings of the state (the checkpoint restore target).
  Training and the benchmark both use these, so they time exactly what trains.
  """
  init: Callable[[jax.Array], TrainState]
  step: Callable[..., tuple[TrainState, dict[str, jax.Array]]]
  abstract_state: TrainState


def jit_train_fns(cfg: ml_collections.ConfigDict, model: Transformer,
                  mesh: jax.sharding.Mesh) -> TrainFunctions:
  """Compiles init and step with the state laid out by partitioning's rules on `mesh`."""
  tx = make_optimizer(cfg)  # one object: the state's static fields must match across functions
  init_fn = functools.partial(create_train_state, model, tx, ema=cfg.train.ema_decay > 0)
  boxed = jax.eval_shape(functools.partial(init_fn, logical_axes=True), jax.random.PRNGKey(0))
  shardings = partitioning.logical_shardings(boxed, mesh)
  replicated = partitioning.replicated(mesh)
  init = jax.jit(init_fn, out_shardings=shardings)
  step = jax.jit(functools.partial(train_step, smoothing=cfg.train.label_smoothing,
                                   accum_steps=cfg.train.grad_accum_steps,
                                   skip_nonfinite=cfg.train.on_nonfinite == "skip",
                                   ema_decay=cfg.train.ema_decay),
                 out_shardings=(shardings, replicated), donate_argnums=(0,))
  abstract = partitioning.with_sharding(jax.eval_shape(init_fn, jax.random.PRNGKey(0)), shardings)
  return TrainFunctions(init=init, step=partitioning.with_mesh(step, mesh),
                        abstract_state=abstract)


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: Transformer) -> dict[str, jax.Array]:
  return loss_sums(forward(model.apply, params, batch), batch["tgt"], smoothing=0.0)


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
  """Per-token averages of the steps since the last progress line (skipped non-finite updates left
  out), and the throughput of all of them."""
  tokens = sum(float(s["tokens"]) for s in step_sums)
  good = [s for s in step_sums if s.get("finite", 1.0)]
  good_tokens = sum(float(s["tokens"]) for s in good) or float("nan")
  return {"loss": sum(float(s["loss"]) for s in good) / good_tokens,
          "nll": sum(float(s["nll"]) for s in good) / good_tokens,
          "accuracy": sum(float(s["correct"]) for s in good) / good_tokens,
          "grad_norm": float(np.mean([s["grad_norm"] for s in good])) if good else float("nan"),
          "tokens": tokens, "tokens_per_sec": tokens / seconds}


def batch_flops(config: ModelConfig, batch: dict[str, np.ndarray]) -> float:
  """Analytic training FLOPs of this process's share of a batch (info.py's count, at the padded
  shape the device computes), times the processes: the global batch's."""
  rows, src_len = batch["src"].shape
  tgt_len = batch["tgt"].shape[1]
  return (training_flops_per_target_token(config, src_len, tgt_len) * rows * tgt_len
          * jax.process_count())


def batch_spec(cfg: ml_collections.ConfigDict, num_devices: int) -> pipeline.BatchSpec:
  """How the training pipeline batches: rows divisible by the devices times the micro-batches."""
  return pipeline.BatchSpec(
      mode=cfg.data.batching, tokens_per_batch=cfg.data.tokens_per_batch, max_len=cfg.data.max_len,
      max_ratio=cfg.data.max_length_ratio, pack_length=cfg.data.pack_length,
      row_multiple=num_devices * cfg.train.grad_accum_steps)


def prepare_data(cfg: ml_collections.ConfigDict, workdir: Path, num_devices: int):
  """Opens the data, builds or reuses the vocabulary; returns (vocab, train pipeline, eval batches).

  Validation pairs are batched once (length buckets, no junk filter) and kept in memory.
  """
  train_source = sources.open_split(cfg.data, cfg.data.train_split)
  eval_source = sources.open_split(cfg.data, cfg.data.eval_split)
  # Process 0 trains (or copies) the vocabulary first; the others then find it in the workdir.
  vocab = leader_first("vocabulary", lambda: vocab_lib.vocab_for_run(workdir, cfg.data,
                                                                     train_source, cfg.seed))
  spec = batch_spec(cfg, num_devices)
  train_pipeline = pipeline.InputPipeline(train_source, vocab, spec, seed=cfg.seed,
                                          window_size=cfg.data.shuffle_window)
  eval_spec = dataclasses.replace(spec, mode="bucket", max_ratio=0, row_multiple=num_devices)
  eval_pipeline = pipeline.InputPipeline(eval_source, vocab, eval_spec, shuffle=False, repeat=False,
                                         window_size=len(eval_source))
  eval_batches = [batch for batch, _ in eval_pipeline.batches()]
  log.info("Data: %s training pairs (%s), %s validation pairs in %d batches; vocabulary %d; "
           "%s batches of ~%d tokens per side%s", f"{len(train_source):,}", train_source.name,
           f"{len(eval_source):,}", len(eval_batches), vocab.get_piece_size(), cfg.data.batching,
           cfg.data.tokens_per_batch,
           f" in {cfg.train.grad_accum_steps} micro-batches" if cfg.train.grad_accum_steps > 1 else "")
  return vocab, train_pipeline, eval_batches


def minutes_since(t: float) -> float:
  """Minutes since `t` by process 0's clock, so every process makes the same checkpoint decision."""
  elapsed = np.float64((time.time() - t) / 60)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    elapsed = multihost_utils.broadcast_one_to_all(elapsed)
  return float(elapsed)


@contextlib.contextmanager
def _undone_if_failed(workdir: Path):
  """Start-up creates only the workdir and its vocab.model; if start-up fails (bad data, a broken
  checkpoint, ...) they are removed again, so a failed start leaves the disk as it found it."""
  missing = [p for p in (workdir, *workdir.parents) if not p.exists()]  # deepest first
  vocab_path = workdir / vocab_lib.VOCAB_FILE
  had_vocab = vocab_path.exists()
  try:
    yield
  except BaseException:
    if jax.process_index() == 0:
      if not had_vocab:
        vocab_path.unlink(missing_ok=True)
      for directory in missing:
        with contextlib.suppress(OSError):
          directory.rmdir()  # only if empty
    raise


@dataclasses.dataclass
class Run:
  """Everything a started run needs; made by `start_run` before anything is written."""
  cfg: ml_collections.ConfigDict
  workdir: Path
  vocab: Any
  train_pipeline: pipeline.InputPipeline
  eval_batches: list[dict[str, np.ndarray]]
  mesh: jax.sharding.Mesh
  model: Transformer
  fns: TrainFunctions
  state: TrainState
  data_state: pipeline.PipelineState
  batches: Any          # the training batch generator, positioned at data_state
  first_batch: Any      # its first (batch, state after it), already read (None if nothing to do)
  broken_after: int | None  # restored a checkpoint older than broken ones: their steps are > this


def start_run(cfg: ml_collections.ConfigDict, workdir: Path) -> Run:
  """Checks what can go wrong before training (data, vocabulary, checkpoints, the first batch) and
  restores or initializes the state; writes nothing but the workdir and its vocabulary."""
  workdir.mkdir(parents=True, exist_ok=True)
  vocab, train_pipeline, eval_batches = prepare_data(cfg, workdir, num_devices=jax.device_count())
  mesh = partitioning.make_mesh(cfg, vocab.get_piece_size())
  model = Transformer(ModelConfig.from_config(cfg.model, vocab.get_piece_size()))
  fns = jit_train_fns(cfg, model, mesh)
  data_state, broken_after = pipeline.PipelineState(), None
  reader = checkpoints.manager(workdir, read_only=True)
  if reader.all_steps():
    state, data = checkpoints.restore(reader, fns.abstract_state, with_data=True)
    data_state = pipeline.PipelineState.from_dict(data)
    if int(state.step) < max(reader.all_steps()):
      broken_after = int(state.step)
    log.info("Resumed from the checkpoint at step %d (data: epoch %d, window %d, batch %d)",
             int(state.step), data_state.epoch, data_state.window, data_state.batch)
  else:
    state = fns.init(jax.random.PRNGKey(cfg.seed))
  batches = train_pipeline.batches(data_state)
  first = next(batches) if int(state.step) < cfg.train.steps else None  # e.g. all pairs filtered
  return Run(cfg, workdir, vocab, train_pipeline, eval_batches, mesh, model, fns, state, data_state,
             batches, first, broken_after)


def train_and_evaluate(cfg: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> dict[str, Any]:
  """Trains (or resumes) the run in `workdir` up to `cfg.train.steps`; returns a summary.

  Raises preemption.Interrupted after a SIGTERM/SIGINT (a checkpoint saved), faults.NonFiniteError
  at a non-finite loss or gradient (train.on_nonfinite='stop'), and ConfigError, DataError or
  CheckpointError for bad input, before writing anything.
  """
  validate(cfg)
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise UserError(f"--workdir={workdir} is a file, not a directory: pass a new directory (or "
                    "the workdir of the run to continue)")
  changed = checkpoints.check_run_config(workdir, cfg, allow_config_change)
  with _undone_if_failed(workdir):
    run = start_run(cfg, workdir)
  with contextlib.closing(run.batches):  # stops the input pipeline's thread, however we leave
    return _write_and_train(run, changed)


def _write_and_train(run: Run, changed: list[str]) -> dict[str, Any]:
  """Start-up succeeded: from here on the run writes."""
  cfg, workdir, start = run.cfg, run.workdir, int(run.state.step)
  if changed:
    log.warning("Continuing %s with a changed config (--allow_config_change): %s; the old one is "
                "kept as config.until_step%d.json", workdir, ", ".join(changed), start)
  leader_first("run config", lambda: checkpoints.write_run_config(
      workdir, cfg, previous_step=start if changed else None))
  reader = checkpoints.manager(workdir, read_only=True)
  if run.broken_after is not None:
    moved = leader_first("broken checkpoints", lambda: checkpoints.move_broken(reader,
                                                                               run.broken_after))
    log.warning("Moved the broken checkpoint(s) %s to %s", ", ".join(map(str, moved)),
                workdir / checkpoints.BROKEN_DIR)
  mngr = checkpoints.manager(workdir, keep=cfg.train.keep_checkpoints)
  n_params = sum(x.size for x in jax.tree.leaves(run.state.params))
  log.info("Model: %s parameters; %d devices (%s) in %d process(es); mesh %s", f"{n_params:,}",
           run.mesh.size, jax.devices()[0].platform, jax.process_count(),
           " x ".join(f"{axis} {size}" for axis, size in run.mesh.shape.items()))
  # TensorBoard hides what an earlier process logged after the checkpoint this run resumes from.
  # The bar shows on process 0's terminal; in a log file the loop's own lines are the progress.
  with (preemption.StopRequests() as stop,
        MetricWriter(workdir, purge_step=start + 1 if start else None) as writer,
        progress.Progress("training", cfg.train.steps, "steps", initial=start, line_seconds=None,
                          mode=None if jax.process_index() == 0 else "off") as bar):
    return _train_loop(run, mngr, stop, writer, bar, n_params)


def _train_loop(run: Run, mngr, stop: preemption.StopRequests, writer: MetricWriter,
                bar: progress.Progress, n_params: int) -> dict[str, Any]:
  cfg, workdir, mesh, state = run.cfg, run.workdir, run.mesh, run.state
  eval_fn = partitioning.with_mesh(jax.jit(functools.partial(eval_step, model=run.model),
                                           out_shardings=partitioning.replicated(mesh)), mesh)
  schedule = learning_rate_schedule(cfg.model.d_model, cfg.train.warmup_steps,
                                    cfg.train.learning_rate)
  dropout_rng = dropout_key(cfg)
  peak = table_peak(jax.devices()[0].device_kind)  # None off the table (CPUs): no MFU then
  watch = faults.NonFiniteWatch(skip=cfg.train.on_nonfinite == "skip")
  start, total = int(state.step), cfg.train.steps
  if start >= total:
    log.info("Already trained to step %d (train.steps = %d); nothing to do", start, total)
  batches = itertools.chain([run.first_batch] if run.first_batch else [], run.batches)
  data_state = run.data_state
  healthy = jax.device_put(True, partitioning.replicated(mesh))  # laid out like the step's output
  t_start = time.time()
  interval_start, interval_sums, interval_flops = time.time(), [], 0.0
  tokens_seen = 0.0
  minutes = cfg.train.checkpoint_minutes  # the wall-clock cadence; 0 = off
  last_save, saved_step = time.time(), start

  def save(step: int, state: TrainState, position: pipeline.PipelineState) -> None:
    nonlocal last_save, saved_step
    t = time.perf_counter()
    checkpoints.save(mngr, step, state, position.to_dict())
    blocked = time.perf_counter() - t
    writer.write("checkpoint", step, blocking_sec=blocked)
    log.info("checkpoint at step %d (training paused %.3fs; written in the background)", step,
             blocked)
    last_save, saved_step = time.time(), step

  for step in range(start, total):
    batch, next_data_state = next(batches)
    state, sums = run.fns.step(state, partitioning.shard_batch(batch, mesh), dropout_rng, healthy)
    healthy = sums["healthy"]  # stays on the device: see train_step
    watch.record(step + 1, batch, data_state, sums)
    data_state = next_data_state
    interval_sums.append(sums)  # fetched only when logging, so the host never waits on the device
    interval_flops += batch_flops(run.model.config, batch)
    bar.update(1, tokens=float((batch["tgt"] != PAD_ID).sum()) * jax.process_count())
    done = step + 1
    log_due = done % cfg.train.log_every == 0 or done == total
    eval_due = done % cfg.train.eval_every == 0 or done == total
    save_due = (done % cfg.train.checkpoint_every == 0 or done == total
                or (minutes and log_due and minutes_since(last_save) >= minutes))
    stop_due = stop.requested(done)
    if not (log_due or eval_due or save_due or stop_due):
      continue
    bad = watch.check()  # the device catches up here anyway
    if bad is not None:
      _stop_at_nonfinite(run, mngr, state, bad, writer)
    if log_due:
      step_sums = jax.device_get(interval_sums)
      now = time.time()
      record = interval_record(step_sums, now - interval_start)
      record.update(learning_rate=float(schedule(step)),
                    epoch=run.train_pipeline.epoch_fraction(data_state), elapsed=now - t_start,
                    skipped_updates=watch.skipped,
                    tflops_per_sec=interval_flops / (now - interval_start) / 1e12)
      if peak:
        record["mfu"] = record["tflops_per_sec"] / (peak * jax.device_count())
      tokens_seen += record.pop("tokens")
      writer.write("train", done, **record)
      eta = record["elapsed"] / (done - start) * (total - done)
      mfu = f" | MFU {record['mfu']:.1%}" if "mfu" in record else ""
      log.info("step %d/%d | loss %.3f | nll %.3f | lr %.2e | %.0f tok/s | %.2f TFLOP/s%s | "
               "elapsed %s | ETA %s", done, total, record["loss"], record["nll"],
               record["learning_rate"], record["tokens_per_sec"], record["tflops_per_sec"], mfu,
               format_duration(record["elapsed"]), format_duration(eta))
      bar.update(0, loss=record["loss"])
      checkpoints.check_saves(mngr)  # a failed background write (disk full) stops the run here
      interval_start, interval_sums, interval_flops = time.time(), [], 0.0
    if eval_due:
      metrics = evaluate_loss(eval_fn, state.params, run.eval_batches, mesh)
      ema = ""
      if isinstance(state, EmaTrainState):
        ema_metrics = evaluate_loss(eval_fn, state.ema_params, run.eval_batches, mesh)
        metrics.update({f"ema_{k}": v for k, v in ema_metrics.items() if k != "tokens"})
        ema = (f" | EMA: nll {ema_metrics['nll']:.3f} | perplexity {ema_metrics['perplexity']:.2f}"
               f" | accuracy {ema_metrics['accuracy']:.3f}")
      writer.write("eval", done, **metrics)
      log.info("eval at step %d | nll %.3f | perplexity %.2f | accuracy %.3f%s", done,
               metrics["nll"], metrics["perplexity"], metrics["accuracy"], ema)
    if save_due or (stop_due and saved_step != done):
      save(done, state, data_state)
    if stop_due:
      checkpoints.finish_saves(mngr)
      writer.write("interrupted", done, signal=stop.signal_name)
      raise preemption.Interrupted(
          f"stopped by {stop.signal_name} after step {done}/{total}; the checkpoint at step {done} "
          f"is in {mngr.directory}. Run the same command again to resume")
  checkpoints.finish_saves(mngr)
  train_time = time.time() - t_start
  summary = {"steps": total, "resumed_from": start, "train_time_sec": train_time,
             "tokens_per_sec": tokens_seen / train_time if train_time and tokens_seen else None,
             "skipped_updates": watch.skipped, "parameters": n_params}
  if total > start:
    writer.write("summary", total, **summary)
    log.info("Trained steps %d-%d in %s (%.0f target tokens/s). Next: transformer-eval "
             "--workdir=%s", start, total, format_duration(train_time), summary["tokens_per_sec"],
             workdir)
  return summary


def _stop_at_nonfinite(run: Run, mngr, state: TrainState, bad: faults.StepRecord,
                       writer: MetricWriter) -> None:
  """Saves the state from before the bad step (unless that checkpoint exists) and its batch, then
  raises NonFiniteError."""
  last_good = bad.number - 1
  assert int(state.step) == last_good, (int(state.step), last_good)  # later steps were no-ops
  loss, grad_norm = (float(x) for x in jax.device_get((bad.sums["loss"] / bad.sums["tokens"],
                                                       bad.sums["grad_norm"])))
  checkpoints.finish_saves(mngr)
  if last_good not in mngr.all_steps():
    checkpoints.save(mngr, last_good, state, bad.data_before.to_dict())
    checkpoints.finish_saves(mngr)
  batch_file = (faults.write_batch(run.workdir, bad, run.vocab) if jax.process_index() == 0
                else run.workdir / faults.BATCH_DIR)
  writer.write("nonfinite", bad.number, loss=loss, grad_norm=grad_norm)
  raise faults.NonFiniteError(
      f"non-finite loss or gradient at step {bad.number} (loss {loss:.4g}, gradient norm "
      f"{grad_norm:.4g}); the last good state is the checkpoint at step {last_good} in "
      f"{mngr.directory} and the batch is in {batch_file}. Lower train.learning_rate or raise "
      "train.warmup_steps, or set train.on_nonfinite=skip to skip such updates")


# ---------------------------------------------------------------------------------- command line

def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.config is None or FLAGS.workdir is None:
    raise app.UsageError("pass --config=configs/multi30k.py (or another config) and --workdir=DIR")
  try:
    initialize_distributed()
    progress.configure(FLAGS.progress)
    train_and_evaluate(FLAGS.config, FLAGS.workdir, FLAGS.allow_config_change)
  except preemption.Interrupted as e:
    print(f"transformer-train: {e}", file=sys.stderr)
    sys.exit(preemption.EXIT_INTERRUPTED)


def run() -> None:
  """Console-script entry point (flags are defined here, so importing this module defines none)."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file, e.g. "
                                  "configs/multi30k.py or configs/wmt14_ende.py:big.")
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary and metrics (shared "
                      "by all processes of a multi-host job).")
  flags.DEFINE_bool("allow_config_change", False, "Continue a workdir whose run has a different "
                    "model or data config (e.g. fine-tuning with another dropout or data); the old "
                    "config.json is kept as config.until_step<N>.json.")
  define_distributed_flags()
  define_progress_flag()
  run_program("transformer-train", main)


if __name__ == "__main__":
  run()
