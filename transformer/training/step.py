"""The training step, checkable against the paper in one read: Adam on the inverse-square-root
schedule (section 5.3), the label-smoothed loss (5.4), the train state and its moving average, and
the jit-compiled, sharded functions that training and the benchmark both run.

Dropout's randomness is a key per run (`dropout_key`) folded with the step number, so a resumed run
draws the masks an uninterrupted one would. The loop around these functions (data, logging,
checkpoints, signals) is train.py's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.random
import jax.numpy as jnp
import ml_collections
import optax
from flax.training import train_state

from transformer import partitioning
from transformer.model.transformer import Transformer, initial_params, shift_right
from transformer.training.loss import loss_sums, projected_loss_sums, rdrop_loss_sums

TrainState = train_state.TrainState


class EmaTrainState(TrainState):
  """Flax's train state plus an exponential moving average of the parameters (`train.ema_decay` >
  0); runs without one keep Flax's state, and so the checkpoint layout they always had."""
  ema_params: Any = None


# ------------------------------------------------------------------------------ optimizer and loss

def learning_rate_schedule(d_model: int, warmup_steps: int, scale: float = 1.0,
                           total_steps: int = 0, cooldown_steps: int = 0) -> optax.Schedule:
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

  With `cooldown_steps`, the rate is also multiplied by (total_steps - step + 1) / cooldown_steps
  over the last `cooldown_steps` of `total_steps` (a linear fall to a last update of 1/cooldown of
  the paper's rate): the end of the run averages out the noise of its last updates, as the paper's
  checkpoint averaging did.
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0  # optax counts updates from 0
    rate = scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
    if cooldown_steps:
      rate *= jnp.clip((total_steps - step + 1.0) / cooldown_steps, 0.0, 1.0)
    return rate
  return schedule


def run_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """The config's learning-rate schedule (`train.learning_rate` scales the paper's; a cool-down
  over the last `train.cooldown_steps`)."""
  return learning_rate_schedule(cfg.model.d_model, cfg.train.warmup_steps, cfg.train.learning_rate,
                                cfg.train.steps, cfg.train.cooldown_steps)


def make_optimizer(cfg: ml_collections.ConfigDict,
                   schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
  """Adam(beta1, beta2, eps) on the paper's schedule (the config's, unless `schedule` is given)."""
  return optax.adam(schedule or run_schedule(cfg), b1=cfg.train.adam_b1, b2=cfg.train.adam_b2,
                    eps=cfg.train.adam_eps)




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
  return partitioning.with_sharding(jax.eval_shape(init, jax.random.key(0)), sharding)


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


def summed_gradients(grad_fn: Callable, params: Any, batch: dict[str, jax.Array], rng: jax.Array,
                     accum_steps: int) -> tuple[Any, dict[str, jax.Array]]:
  """`grad_fn(params, batch, rng)` -> (gradient, sums) of the summed loss, in `accum_steps` micro-batches
  (rows k, k + A, k + 2A, ... make micro-batch k; its dropout key is `rng` folded with k)."""
  if accum_steps == 1:
    return grad_fn(params, batch, rng)
  micro_batches = jax.tree.map(
      lambda x: x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]).swapaxes(0, 1), batch)

  def accumulate(totals, micro_and_index):
    micro, k = micro_and_index
    grads, sums = grad_fn(params, micro, jax.random.fold_in(rng, k))
    return jax.tree.map(jnp.add, totals, (grads, sums)), None

  first = jax.tree.map(lambda x: x[0], micro_batches)
  zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, first, rng))
  totals, _ = jax.lax.scan(accumulate, zeros, (micro_batches, jnp.arange(accum_steps)))
  return totals


def train_step(state: TrainState, batch: dict[str, jax.Array], dropout_rng: jax.Array,
               healthy: jax.Array | bool = True, *, smoothing: float, accum_steps: int = 1,
               skip_nonfinite: bool = False, ema_decay: float = 0.0, loss_chunks: int = 0,
               product_dtype: Any = None, rdrop_alpha: float = 0.0) -> tuple[TrainState, dict[str, jax.Array]]:
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

  With `loss_chunks` > 0 the loss never holds the batch's logits: the projection onto the
  vocabulary, the loss and their backward pass run that many chunks of target positions at a time
  (loss.py), the product in `product_dtype`; the same sums and gradients.

  With `rdrop_alpha` > 0 every row runs twice, side by side under different dropout masks, and
  the loss is R-Drop's (loss.rdrop_loss_sums).
  """
  rng = jax.random.fold_in(dropout_rng, state.step)

  def loss_fn(params, micro, micro_rng):
    kwargs = dict(deterministic=False, rngs={"dropout": micro_rng})
    if rdrop_alpha:
      twice = jax.tree.map(lambda a: jnp.repeat(a, 2, axis=0), micro)  # rows 2i, 2i + 1: row i
      sums = rdrop_loss_sums(forward(state.apply_fn, params, twice, **kwargs), micro["tgt"],
                             smoothing, rdrop_alpha)
    elif loss_chunks:
      x, matrix, bias = forward(state.apply_fn, params, micro, project=False, **kwargs)
      sums = projected_loss_sums(x, matrix, micro["tgt"], smoothing, product_dtype, loss_chunks,
                                 bias)
    else:
      sums = loss_sums(forward(state.apply_fn, params, micro, **kwargs), micro["tgt"], smoothing)
    return sums["loss"], sums

  grads, sums = summed_gradients(jax.grad(loss_fn, has_aux=True), state.params, batch, rng,
                                 accum_steps)
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
  `abstract_state`: shapes, dtypes and shardings of the state (the checkpoint restore target);
  `schedule`: the optimizer's learning rate by update count (what the loop logs).
  Training and the benchmark both use these, so they time exactly what trains.
  """
  init: Callable[[jax.Array], TrainState]
  step: Callable[..., tuple[TrainState, dict[str, jax.Array]]]
  abstract_state: TrainState
  schedule: optax.Schedule


def jit_train_fns(cfg: ml_collections.ConfigDict, model: Transformer,
                  mesh: jax.sharding.Mesh) -> TrainFunctions:
  """Compiles init and step with the state laid out by partitioning's rules on `mesh`."""
  schedule = run_schedule(cfg)
  tx = make_optimizer(cfg, schedule)  # one object: the state's static fields must match across functions
  init_fn = functools.partial(create_train_state, model, tx, ema=cfg.train.ema_decay > 0)
  boxed = jax.eval_shape(functools.partial(init_fn, logical_axes=True), jax.random.key(0))
  shardings = partitioning.logical_shardings(boxed, mesh)
  replicated = partitioning.replicated(mesh)
  init = jax.jit(init_fn, out_shardings=shardings)
  step = jax.jit(functools.partial(train_step, smoothing=cfg.train.label_smoothing,
                                   accum_steps=cfg.train.grad_accum_steps,
                                   skip_nonfinite=cfg.train.on_nonfinite == "skip",
                                   ema_decay=cfg.train.ema_decay,
                                   loss_chunks=cfg.train.loss_chunks,
                                   rdrop_alpha=cfg.train.rdrop_alpha,
                                   product_dtype=model.config.vocab_matmul_dtype
                                   or model.config.matmul_dtype or model.config.dtype),
                 out_shardings=(shardings, replicated), donate_argnums=(0,))
  abstract = partitioning.with_sharding(jax.eval_shape(init_fn, jax.random.key(0)), shardings)
  return TrainFunctions(init=init, step=partitioning.with_mesh(step, mesh),
                        abstract_state=abstract, schedule=schedule)


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: Transformer,
              smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Summed validation metrics: 'nll', 'correct', 'tokens', and 'loss', the label-smoothed loss
  with the training's `smoothing` (what fairseq validates and early-stops on)."""
  return loss_sums(forward(model.apply, params, batch), batch["tgt"], smoothing=smoothing)


def jit_eval_step(model: Transformer, mesh: jax.sharding.Mesh, smoothing: float = 0.0
                  ) -> Callable:
  """`eval_step` compiled for parameters laid out on `mesh` (the training loop's validation and
  transformer-compile's), summed metrics replicated."""
  step = functools.partial(eval_step, model=model, smoothing=smoothing)
  return partitioning.with_mesh(jax.jit(step, out_shardings=partitioning.replicated(mesh)), mesh)
