"""The loss computed a chunk of target positions at a time, from the decoder's output, equals the
loss of the whole [B, T, V] logits: sums and both gradients, with label smoothing and padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model.vocab_projection import output_logits
from transformer.tokens import PAD_ID
from transformer.training.loss import loss_sums, projected_loss_sums


def _inputs(seed=0, batch=3, length=7, d=16, vocab=50):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, length, d)), jnp.float32)
  matrix = jnp.asarray(rng.normal(size=(vocab, d)) / 4, jnp.float32)
  targets = rng.integers(4, vocab, (batch, length)).astype(np.int32)
  targets[0, 5:] = PAD_ID  # padding at a row's end
  targets[2, 2:] = PAD_ID
  return x, matrix, jnp.asarray(targets)


def _objective(sums):  # a mix of both losses, so both cotangents reach the backward pass
  return 0.7 * sums["loss"] + 1.3 * sums["nll"]


@pytest.mark.parametrize("chunks", [1, 2, 3, 7])  # 2 and 3 pad T = 7 to a multiple
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_loss_and_gradients_equal_the_whole_logits(chunks, smoothing):
  x, matrix, targets = _inputs()
  whole = lambda x, m: loss_sums(output_logits(x, m), targets, smoothing)
  chunked = lambda x, m: projected_loss_sums(x, m, targets, smoothing, jnp.float32, chunks)
  want, have = whole(x, matrix), chunked(x, matrix)
  for key in ("loss", "nll", "correct", "tokens"):
    np.testing.assert_allclose(have[key], want[key], rtol=1e-6, err_msg=key)
  assert float(have["tokens"]) == int((targets != PAD_ID).sum())
  want_grads = jax.grad(lambda x, m: _objective(whole(x, m)), argnums=(0, 1))(x, matrix)
  have_grads = jax.grad(lambda x, m: _objective(chunked(x, m)), argnums=(0, 1))(x, matrix)
  for have_g, want_g in zip(have_grads, want_grads):
    np.testing.assert_allclose(have_g, want_g, rtol=1e-5, atol=1e-6)
  assert not np.any(np.asarray(have_grads[0])[2, 2:])  # padding positions get no gradient


@pytest.mark.parametrize("chunks", [1, 3])
def test_chunked_loss_with_an_output_bias_equals_the_whole_logits_plus_the_bias(chunks):
  """The bias (Marian's final_logits_bias) inside the chunks: its gradient is the logits' summed
  over the tokens, as autodiff of the whole logits gives it."""
  x, matrix, targets = _inputs(seed=2)
  bias = jax.random.normal(jax.random.key(3), (matrix.shape[0],)) * 2.0
  whole = lambda x, m, b: _objective(loss_sums(output_logits(x, m) + b, targets, 0.1))
  chunked = lambda x, m, b: _objective(projected_loss_sums(x, m, targets, 0.1, jnp.float32, chunks,
                                                           b))
  np.testing.assert_allclose(chunked(x, matrix, bias), whole(x, matrix, bias), rtol=1e-6)
  assert abs(float(chunked(x, matrix, bias)) - float(chunked(x, matrix, None))) > 1.0
  for have_g, want_g in zip(jax.grad(chunked, argnums=(0, 1, 2))(x, matrix, bias),
                            jax.grad(whole, argnums=(0, 1, 2))(x, matrix, bias)):
    np.testing.assert_allclose(have_g, want_g, rtol=1e-5, atol=1e-5)


def test_chunked_loss_in_bf16_products_follows_the_whole_logits():
  x, matrix, targets = _inputs(seed=1)
  whole = lambda x, m: _objective(loss_sums(output_logits(x, m, jnp.bfloat16), targets, 0.1))
  chunked = lambda x, m: _objective(projected_loss_sums(x, m, targets, 0.1, jnp.bfloat16, 2))
  np.testing.assert_allclose(chunked(x, matrix), whole(x, matrix), rtol=1e-6)
  for have_g, want_g in zip(jax.grad(chunked, argnums=(0, 1))(x, matrix),
                            jax.grad(whole, argnums=(0, 1))(x, matrix)):
    np.testing.assert_allclose(have_g, want_g, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_a_train_step_with_the_chunked_loss_makes_the_same_update(share_embeddings):
  """The whole step, packed rows and padding, dropout off: chunked (3 chunks of a 16-token row) and
  unchunked give the same sums and the same parameters after one SGD update."""
  import optax
  from helpers import init_params, tiny_model_config

  from transformer.data import batching
  from transformer.model.transformer import Transformer
  from transformer.training.step import TrainState, train_step
  rng = np.random.default_rng(3)
  model = Transformer(tiny_model_config(dropout=0.0, max_len=40, share_embeddings=share_embeddings))
  params = init_params(model, scale=2.0)
  lengths = [(3, 5), (6, 2), (2, 2), (7, 6), (4, 9), (1, 3)]
  source = [np.append(rng.integers(4, 24, a), 1).astype(np.int32) for a, _ in lengths]
  target = [np.append(rng.integers(4, 24, b), 1).astype(np.int32) for _, b in lengths]
  batch = batching.pairs_batch(source, target, [[0, 1, 2], [3, 5], [4]], 16, 3, packed=True)
  state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
  whole, sums_whole = train_step(state, batch, jax.random.key(0), smoothing=0.1)
  chunked, sums_chunked = train_step(state, batch, jax.random.key(0), smoothing=0.1,
                                     loss_chunks=3, product_dtype=jnp.float32)
  for key in ("loss", "nll", "correct", "tokens", "grad_norm"):
    np.testing.assert_allclose(sums_chunked[key], sums_whole[key], rtol=1e-5, err_msg=key)
  for got, want in zip(jax.tree.leaves(chunked.params), jax.tree.leaves(whole.params)):
    np.testing.assert_allclose(got, want, atol=1e-6)
