"""Schedule, loss and train step against hand computations (sharded steps: test_partitioning.py)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer.config import RNG_IMPLS, base_config
from transformer.decoding import textbook as reference
from transformer.model.transformer import Transformer, shift_right
from transformer.training.step import (
  EmaTrainState,
  TrainState,
  dropout_key,
  ema_decay_at,
  forward,
  learning_rate_schedule,
  loss_sums,
  make_optimizer,
  train_step,
)


@pytest.mark.parametrize("step,expected", [
    (1, 512 ** -0.5 * 1 * 4000 ** -1.5),
    (2000, 512 ** -0.5 * 2000 * 4000 ** -1.5),
    (4000, 512 ** -0.5 * 4000 ** -0.5),
    (16000, 512 ** -0.5 * 16000 ** -0.5),
])
def test_learning_rate_schedule(step, expected):
  schedule = learning_rate_schedule(512, 4000)
  assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)  # optax counts from 0


def test_cooldown_falls_linearly_over_the_last_steps_and_leaves_the_rest_alone():
  paper = learning_rate_schedule(256, 800)
  cooled = learning_rate_schedule(256, 800, total_steps=4800, cooldown_steps=960)
  for step in (1, 800, 3000, 3840):  # before the cool-down: the paper's rate
    assert float(cooled(step - 1)) == pytest.approx(float(paper(step - 1)), rel=1e-6)
  for step, fraction in ((3841, 960 / 960), (4320, 481 / 960), (4800, 1 / 960)):
    assert float(cooled(step - 1)) == pytest.approx(256 ** -0.5 * step ** -0.5 * fraction, rel=1e-5)


def test_peak_learning_rate_is_at_warmup():
  schedule = learning_rate_schedule(512, 4000, scale=2.0)
  counts = list(range(3900, 4100))
  rates = [float(schedule(c)) for c in counts]
  assert counts[int(np.argmax(rates))] == 3999  # update count 3999 is step 4000, 1-based
  assert max(rates) == pytest.approx(2.0 * 512 ** -0.5 * 4000 ** -0.5, rel=1e-5)


def test_label_smoothed_loss_against_hand_computation():
  logits = np.array([[[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0], [9.0, 9.0, 9.0, 9.0]]])
  targets = np.array([[2, 3, 0]])  # the last position is padding
  smoothing = 0.1
  expected_loss, expected_nll = 0.0, 0.0
  for t in range(2):
    p = np.exp(logits[0, t]) / np.exp(logits[0, t]).sum()
    q = np.full(4, smoothing / 3)
    q[targets[0, t]] = 1 - smoothing
    expected_loss += -(q * np.log(p)).sum()
    expected_nll += -math.log(p[targets[0, t]])
  sums = loss_sums(jnp.asarray(logits), jnp.asarray(targets), smoothing)
  assert float(sums["loss"]) == pytest.approx(expected_loss, rel=1e-6)
  assert float(sums["nll"]) == pytest.approx(expected_nll, rel=1e-6)
  assert float(sums["tokens"]) == 2
  assert float(sums["correct"]) == 0  # argmaxes are 3 and 2; targets 2 and 3


def test_validation_reports_the_training_losses_label_smoothed_loss_beside_the_nll(rng):
  """What fairseq validates (and early-stops) on: the loss with the training's smoothing."""
  from transformer import partitioning
  from transformer.training.step import jit_eval_step
  model = Transformer(tiny_model_config())
  params = init_params(model)
  batch = {"src": random_tokens(rng, 3, 5, 24, lengths=[5, 3, 2]),
           "tgt": random_tokens(rng, 3, 6, 24, lengths=[6, 4, 1])}
  mesh = partitioning.make_mesh(base_config(), 24, jax.devices()[:1])
  got = jit_eval_step(model, mesh, smoothing=0.1)(params, batch)
  logits = model.apply({"params": params}, batch["src"], shift_right(batch["tgt"]))
  smoothed, plain = loss_sums(logits, batch["tgt"], 0.1), loss_sums(logits, batch["tgt"], 0.0)
  assert float(got["loss"]) == pytest.approx(float(smoothed["loss"]), rel=1e-5)
  assert float(got["nll"]) == pytest.approx(float(plain["loss"]), rel=1e-5)
  assert float(got["loss"]) > float(got["nll"])


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_hand_written_loss_gradient_matches_autodiff_of_log_softmax(smoothing, rng):
  """loss_sums' gradient is written by hand (p - q); it must equal autodiff of the textbook formula,
  for the smoothed loss and the NLL together, with padding positions contributing nothing."""
  logits = jnp.asarray(rng.normal(size=(3, 7, 50)) * 3, jnp.float32)
  targets = jnp.asarray(rng.integers(0, 50, (3, 7)))  # id 0 (padding) occurs too

  textbook = lambda x: (lambda s: 0.7 * s["loss"] + 1.3 * s["nll"])(
      reference.loss_sums(x, targets, smoothing))
  ours = lambda x: (lambda s: 0.7 * s["loss"] + 1.3 * s["nll"])(loss_sums(x, targets, smoothing))
  assert float(ours(logits)) == pytest.approx(float(textbook(logits)), rel=1e-6)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(textbook)(logits), atol=1e-6)
  assert not np.any(jax.grad(ours)(logits)[np.asarray(targets) == 0])


def test_train_step_follows_the_gradient_of_the_mean_token_loss(rng):
  """With SGD(1) the update is minus the gradient, checked against the objective written directly
  (Adam's first step is ~lr * sign(g): float noise in near-zero gradients would flip signs)."""
  model = Transformer(tiny_model_config())
  params = init_params(model)
  state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
  batch = {"src": random_tokens(rng, 3, 5, 24, lengths=[5, 3, 2]),
           "tgt": random_tokens(rng, 3, 6, 24, lengths=[6, 4, 1])}
  new_state, sums = train_step(state, batch, jax.random.key(0), smoothing=0.1)
  assert int(new_state.step) == 1
  assert float(sums["tokens"]) == 11

  def loss(p):  # the same objective written directly
    s = loss_sums(model.apply({"params": p}, batch["src"], shift_right(batch["tgt"])), batch["tgt"], 0.1)
    return s["loss"] / s["tokens"]
  grads = jax.grad(loss)(params)
  for new, old, g in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(params),
                         jax.tree.leaves(grads)):
    np.testing.assert_allclose(old - new, g, atol=1e-6)
  assert float(sums["grad_norm"]) == pytest.approx(float(optax.tree.norm(grads)), rel=1e-5)


@pytest.mark.slow
def test_bfloat16_train_step_compiles_on_cpu_and_follows_the_float32_gradient(rng):
  """Activations in bf16 (the accelerator configs' setting): the compiled step runs on XLA's CPU
  backend (which lacks some bf16 products with float32 sums) and its update is the float32
  objective's gradient to bf16 precision."""
  batch = {"src": random_tokens(rng, 4, 7, 24), "tgt": random_tokens(rng, 4, 8, 24)}
  params = init_params(Transformer(tiny_model_config()))
  step = jax.jit(functools.partial(train_step, smoothing=0.1))
  updates = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    model = Transformer(tiny_model_config(dtype=dtype))
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
    new_state, _ = step(state, batch, jax.random.key(0))
    updates[dtype] = np.concatenate([np.ravel(old - new) for new, old in zip(
        jax.tree.leaves(new_state.params), jax.tree.leaves(params))])
  want, got = updates[jnp.float32], updates[jnp.bfloat16]
  assert np.linalg.norm(got - want) < 0.05 * np.linalg.norm(want)  # 0.018 here


def test_moving_average_follows_the_applied_updates(rng):
  """ema' = d * ema + (1 - d) * params' with d = min(decay, (1 + step) / (10 + step)); a skipped
  (non-finite) update leaves it as it was."""
  model = Transformer(tiny_model_config())
  params = init_params(model)
  state = EmaTrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1),
                               ema_params=params)
  batch = {"src": random_tokens(rng, 3, 5, 24), "tgt": random_tokens(rng, 3, 6, 24)}
  step = jax.jit(functools.partial(train_step, smoothing=0.1, ema_decay=0.99, skip_nonfinite=True))
  averages = [params]
  for _ in range(3):
    state, _ = step(state, batch, jax.random.key(0))
    d = min(0.99, (1 + int(state.step)) / (10 + int(state.step)))  # 2/11, 3/12, 4/13
    averages.append(jax.tree.map(lambda a, p, d=d: d * a + (1 - d) * p, averages[-1], state.params))
    for got, want in zip(jax.tree.leaves(state.ema_params), jax.tree.leaves(averages[-1])):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  nan_batch_state = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
  skipped, sums = step(nan_batch_state, batch, jax.random.key(0))
  assert float(sums["finite"]) == 0
  for got, want in zip(jax.tree.leaves(skipped.ema_params), jax.tree.leaves(state.ema_params)):
    np.testing.assert_array_equal(got, want)
  assert float(ema_decay_at(10_000, 0.999)) == pytest.approx(0.999)


def test_train_step_applies_adam_on_the_paper_schedule(rng):
  cfg = base_config()
  cfg.model.d_model = 16
  cfg.train.learning_rate = 1000.0  # a first step of ~1e-3, far above float32 rounding of the weights
  model = Transformer(tiny_model_config())
  params = init_params(model)
  state = TrainState.create(apply_fn=model.apply, params=params, tx=make_optimizer(cfg))
  batch = {"src": random_tokens(rng, 3, 5, 24), "tgt": random_tokens(rng, 3, 6, 24)}
  new_state, _ = train_step(state, batch, jax.random.key(0), smoothing=0.1)
  lr = float(learning_rate_schedule(16, cfg.train.warmup_steps, 1000.0)(0))
  steps = np.concatenate([np.abs(np.asarray(a - b)).ravel() for a, b in
                          zip(jax.tree.leaves(new_state.params), jax.tree.leaves(params))])
  assert steps.max() <= lr * 1.001  # Adam's first step moves each weight by at most lr,
  assert np.median(steps) > 0.9 * lr  # and by about lr wherever the gradient is not tiny.


@pytest.mark.slow
def test_gradient_accumulation_makes_the_same_update(rng):
  """4 micro-batches of 2 rows give the gradient of one batch of 8 rows (no dropout to differ).

  Plain SGD makes the update the gradient itself (Adam's first step is ~lr * sign(g), which turns
  float noise in near-zero gradients into sign flips)."""
  model = Transformer(tiny_model_config(dropout=0.0))
  state = TrainState.create(apply_fn=model.apply, params=init_params(model), tx=optax.sgd(1.0))
  batch = {"src": random_tokens(rng, 8, 6, 24, lengths=[6, 5, 4, 3, 6, 2, 5, 1]),
           "tgt": random_tokens(rng, 8, 7, 24, lengths=[7, 3, 4, 5, 2, 6, 1, 7])}
  whole, whole_sums = train_step(state, batch, jax.random.key(0), smoothing=0.1)
  accumulated, sums = jax.jit(functools.partial(train_step, smoothing=0.1, accum_steps=4))(
      state, batch, jax.random.key(0))
  for key in ("loss", "nll", "tokens", "grad_norm"):
    assert float(sums[key]) == pytest.approx(float(whole_sums[key]), rel=1e-5)
  for got, want in zip(jax.tree.leaves(accumulated.params), jax.tree.leaves(whole.params)):
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_packed_rows_train_like_the_same_pairs_unpacked(rng):
  """Same pairs, packed several per row or one per row: the same per-token losses and update."""
  from transformer.data import batching
  model = Transformer(tiny_model_config(dropout=0.0, max_len=40))
  params = init_params(model, scale=3.0)
  lengths = [(3, 5), (6, 2), (2, 2), (7, 6), (4, 9), (1, 3)]
  source = [np.append(rng.integers(4, 24, a), 1).astype(np.int32) for a, _ in lengths]
  target = [np.append(rng.integers(4, 24, b), 1).astype(np.int32) for _, b in lengths]
  rows = [[0, 1, 2], [3, 5], [4]]  # with EOS: sources 14, 10, 5 tokens; targets 12, 11, 10
  packed = batching.pairs_batch(source, target, rows, 16, len(rows), packed=True)
  unpacked = batching.pairs_batch(source, target, [[i] for i in range(len(lengths))], 12,
                                  len(lengths), packed=False)

  def token_losses(batch):
    logits = forward(model.apply, params, batch)
    log_probs = jax.nn.log_softmax(logits)
    return -np.take_along_axis(np.asarray(log_probs), batch["tgt"][..., None], -1)[..., 0]

  packed_losses, unpacked_losses = token_losses(packed), token_losses(unpacked)
  for r, members in enumerate(rows):
    for segment, i in enumerate(members, start=1):
      got = packed_losses[r][packed["tgt_segments"][r] == segment]
      want = unpacked_losses[i][:len(target[i])]
      np.testing.assert_allclose(got, want, rtol=1e-4)  # float32 sums in other orders
  cfg = base_config()
  cfg.model.d_model = 16
  state = TrainState.create(apply_fn=model.apply, params=params, tx=make_optimizer(cfg))
  a, sums_a = train_step(state, packed, jax.random.key(0), smoothing=0.1)
  b, sums_b = train_step(state, unpacked, jax.random.key(0), smoothing=0.1)
  assert float(sums_a["tokens"]) == float(sums_b["tokens"]) == sum(t for _, t in lengths) + 6
  assert float(sums_a["loss"]) == pytest.approx(float(sums_b["loss"]), rel=1e-5)
  for got, want in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_packed_decoder_input_starts_every_pair_with_bos():
  tgt = jnp.array([[5, 6, 1, 7, 1, 8, 9, 1, 0, 0]])
  segments = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
  assert shift_right(tgt, segments).tolist() == [[2, 5, 6, 2, 7, 2, 8, 9, 0, 0]]
  assert shift_right(tgt).tolist() == [[2, 5, 6, 1, 7, 1, 8, 9, 0, 0]]  # unpacked: one sequence


@pytest.mark.parametrize("impl", RNG_IMPLS)
def test_dropout_keys_draw_fair_masks_that_depend_on_seed_and_step(impl):
  cfg = base_config()
  cfg.train.dropout_rng = impl
  key = dropout_key(cfg)
  mask = lambda k: np.asarray(jax.random.bernoulli(k, 0.9, (1000, 1000)))
  kept = mask(key).mean()
  assert abs(kept - 0.9) < 5 * math.sqrt(0.9 * 0.1 / 1e6)  # within five standard errors
  np.testing.assert_array_equal(mask(key), mask(dropout_key(cfg)))  # resume draws the same masks
  assert (mask(jax.random.fold_in(key, 1)) != mask(key)).mean() > 0.1  # another step, another mask
  cfg.seed += 1
  assert (mask(dropout_key(cfg)) != mask(key)).mean() > 0.1


def test_unsafe_rbg_threefry_draws_xla_threefry_bits_from_unsafe_rbg_keys():
  cfg = base_config()
  cfg.train.dropout_rng = "unsafe_rbg_threefry"
  key = dropout_key(cfg)
  cfg.train.dropout_rng = "unsafe_rbg"
  rbg_key = dropout_key(cfg)
  np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(rbg_key))
  expected = jax.lax.rng_bit_generator(jax.random.key_data(key), (64,), dtype=jnp.uint32,
                                       algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)[1]
  np.testing.assert_array_equal(jax.random.bits(key, (64,)), expected)
  assert (np.asarray(jax.random.bits(rbg_key, (64,))) != np.asarray(expected)).all()
