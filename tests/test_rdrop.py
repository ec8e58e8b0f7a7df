"""R-Drop (train.rdrop_alpha): its loss against numpy, its gradient against autodiff of the paper's
formula, the train step against that objective on the step's own two passes, and its config errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer.config import base_config, validate
from transformer.errors import ConfigError
from transformer.model.transformer import Transformer, shift_right
from transformer.tokens import PAD_ID
from transformer.training.loss import loss_sums, rdrop_loss_sums
from transformer.training.step import TrainState, train_step


def _numpy_rdrop(logits, targets, smoothing, alpha):
  """The R-Drop paper's per-token objective CE_1 + CE_2 + alpha * (KL(P1||P2) + KL(P2||P1)) / 2,
  halved, summed over real tokens; rows 2i and 2i + 1 are pair i's two passes."""
  logits = np.asarray(logits, np.float64)
  log_p = logits - logits.max(-1, keepdims=True)
  log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
  vocab = logits.shape[-1]
  on, off = 1 - smoothing, smoothing / (vocab - 1)
  out = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0, "rdrop_kl": 0.0}
  for i in range(targets.shape[0]):
    for t in range(targets.shape[1]):
      target = targets[i, t]
      if target == PAD_ID:
        continue
      first, second = log_p[2 * i, t], log_p[2 * i + 1, t]
      smoothed = [-(on * lp[target] + off * (lp.sum() - lp[target])) for lp in (first, second)]
      kl = (np.exp(first) * (first - second)).sum() + (np.exp(second) * (second - first)).sum()
      out["loss"] += np.mean(smoothed) + alpha * kl / 4
      out["nll"] += -(first[target] + second[target]) / 2
      out["correct"] += sum(lp.argmax() == target for lp in (first, second)) / 2
      out["tokens"] += 1
      out["rdrop_kl"] += kl / 2
  return out


def _jax_rdrop(logits, targets, smoothing, alpha):
  """The summed R-Drop loss written with jax.nn.log_softmax (differentiable; no custom gradient)."""
  log_p = jax.nn.log_softmax(logits)
  vocab = logits.shape[-1]
  on, off = 1 - smoothing, smoothing / (vocab - 1)
  doubled = jnp.repeat(targets, 2, axis=0)
  target_lp = jnp.take_along_axis(log_p, doubled[..., None], -1)[..., 0]
  smoothed = -(on - off) * target_lp - off * log_p.sum(-1)
  first, second = log_p[0::2], log_p[1::2]
  kl = ((jnp.exp(first) - jnp.exp(second)) * (first - second)).sum(-1)
  return (((smoothed[0::2] + smoothed[1::2]) / 2 + alpha * kl / 4) * (targets != PAD_ID)).sum()


def _pairs(seed=0, pairs=3, length=6, vocab=11):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(2 * pairs, length, vocab)).astype(np.float32) * 2
  targets = rng.integers(4, vocab, (pairs, length)).astype(np.int32)
  targets[0, 4:] = PAD_ID
  targets[2, 1:] = PAD_ID
  return jnp.asarray(logits), jnp.asarray(targets)


@pytest.mark.parametrize("smoothing,alpha", [(0.0, 1.0), (0.1, 5.0), (0.1, 0.0)])
def test_rdrop_loss_equals_the_papers_formula_in_numpy(smoothing, alpha):
  logits, targets = _pairs()
  got = jax.device_get(rdrop_loss_sums(logits, targets, smoothing, alpha))
  want = _numpy_rdrop(logits, np.asarray(targets), smoothing, alpha)
  for key, value in want.items():
    assert float(got[key]) == pytest.approx(value, rel=1e-5, abs=1e-5), key


def test_rdrop_loss_of_two_equal_passes_is_the_plain_loss():
  logits, targets = _pairs(seed=1)
  twice = jnp.repeat(logits[::2], 2, axis=0)
  got = rdrop_loss_sums(twice, targets, 0.1, alpha=5.0)
  plain = loss_sums(logits[::2], targets, 0.1)
  assert float(got["rdrop_kl"]) == pytest.approx(0.0, abs=1e-5)
  for key in ("loss", "nll", "correct", "tokens"):
    assert float(got[key]) == pytest.approx(float(plain[key]), rel=1e-6), key


def test_rdrop_gradient_equals_autodiff_of_the_formula():
  """The hand-written cross-entropy gradient (loss.py) plus autodiff of the KL term, against
  autodiff of the whole objective written with jax.nn.log_softmax."""
  logits, targets = _pairs(seed=2)
  smoothing, alpha = 0.1, 3.0

  got = jax.grad(lambda z: rdrop_loss_sums(z, targets, smoothing, alpha)["loss"])(logits)
  want = jax.grad(lambda z: _jax_rdrop(z, targets, smoothing, alpha))(logits)
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_rdrop_train_step_follows_the_gradient_of_its_two_passes(rng):
  """With SGD(1) the update is minus the gradient of the mean R-Drop loss per target token, computed
  here on the step's two passes (each row twice, side by side, under the step's dropout key)."""
  model = Transformer(tiny_model_config(dropout=0.3, num_layers=1))
  params = init_params(model)
  state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
  batch = {"src": random_tokens(rng, 3, 5, 24, lengths=[5, 3, 2]),
           "tgt": random_tokens(rng, 3, 6, 24, lengths=[6, 4, 1])}
  key, alpha = jax.random.key(7, impl="unsafe_rbg"), 5.0  # quick to compile
  step = jax.jit(functools.partial(train_step, smoothing=0.1, rdrop_alpha=alpha))
  new_state, sums = step(state, batch, key)
  assert float(sums["tokens"]) == 11
  assert float(sums["rdrop_kl"]) > 0  # two different masks

  def objective(p):
    src, tgt = (jnp.repeat(batch[k], 2, axis=0) for k in ("src", "tgt"))
    logits = model.apply({"params": p}, src, shift_right(tgt), deterministic=False,
                         rngs={"dropout": jax.random.fold_in(key, 0)})
    s = _jax_rdrop(logits, batch["tgt"], 0.1, alpha)
    return s / 11
  grads = jax.jit(jax.grad(objective))(params)
  for new, old, g in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(params),
                         jax.tree.leaves(grads)):
    np.testing.assert_allclose(old - new, g, atol=1e-6)
  assert float(sums["loss"]) / 11 == pytest.approx(float(objective(params)), rel=1e-5)


def test_rdrop_without_dropout_makes_the_plain_update(rng):
  model = Transformer(tiny_model_config(dropout=0.0, num_layers=1))
  state = TrainState.create(apply_fn=model.apply, params=init_params(model), tx=optax.sgd(1.0))
  batch = {"src": random_tokens(rng, 4, 5, 24), "tgt": random_tokens(rng, 4, 6, 24)}
  step = lambda **kw: jax.jit(functools.partial(train_step, smoothing=0.1, **kw))
  plain, plain_sums = step()(state, batch, jax.random.key(0))
  rdrop, rdrop_sums = step(rdrop_alpha=5.0)(state, batch, jax.random.key(0))
  assert float(rdrop_sums["rdrop_kl"]) == pytest.approx(0.0, abs=1e-6)
  for key in ("loss", "nll", "correct", "tokens", "grad_norm"):
    assert float(rdrop_sums[key]) == pytest.approx(float(plain_sums[key]), rel=1e-5), key
  for got, want in zip(jax.tree.leaves(rdrop.params), jax.tree.leaves(plain.params)):
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("changes,message", [
    ({"train.rdrop_alpha": -1.0}, "rdrop_alpha must be a number >= 0"),
    ({"train.rdrop_alpha": 5.0, "model.dropout": 0.0}, "the model has no dropout"),
    ({"train.rdrop_alpha": 5.0, "train.loss_chunks": 4}, "set one of them to 0"),
])
def test_rdrop_config_errors_say_what_to_change(changes, message):
  cfg = base_config()
  for dotted, value in changes.items():
    section, key = dotted.split(".")
    cfg[section][key] = value
  with pytest.raises(ConfigError, match=message):
    validate(cfg)
