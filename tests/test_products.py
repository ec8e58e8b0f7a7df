"""bf16 products with float32 sums (model.matmul_dtype): forward and backward against numpy."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer.decoding import translator
from transformer.model.low_precision import low_precision_dot_general
from transformer.model.transformer import Transformer
from transformer.model.vocab_projection import output_logits

pytestmark = pytest.mark.core

DENSE = (((2,), (0,)), ((), ()))          # [B, T, K] x [K, N]: nn.Dense
HEADS_OUT = (((2, 3), (0, 1)), ((), ()))  # [B, T, H, d] x [H, d, N]: the attention's output
HEADS_IN = (((2,), (0,)), ((), ()))       # [B, T, K] x [K, H, d]: query, key, value


def bf16(x) -> np.ndarray:
  """x rounded to bf16, as float64."""
  return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


@pytest.mark.parametrize("x_shape, kernel_shape, dimensions", [
    ((2, 3, 8), (8, 5), DENSE), ((2, 3, 4, 2), (4, 2, 6), HEADS_OUT), ((2, 3, 6), (6, 4, 2), HEADS_IN)])
def test_product_and_gradients_match_numpy(rng, x_shape, kernel_shape, dimensions):
  """Forward: the float32 sum of bf16-rounded operands. Backward: the input's gradient multiplies
  the bf16-rounded output gradient by the bf16 kernel; the kernel's gradient is the float32
  input times the float32 output gradient (not rounded)."""
  x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=kernel_shape), jnp.float32)
  out, pullback = jax.vjp(lambda a, b: low_precision_dot_general(a, b, dimensions, jnp.bfloat16),
                          x, kernel)
  n = len(dimensions[0][1])
  depth = int(np.prod(kernel_shape[:n]))
  x2, k2 = np.float64(x).reshape(-1, depth), np.float64(kernel).reshape(depth, -1)
  want = (bf16(x2) @ bf16(k2)).reshape(out.shape)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  # The primal (evaluation, decoding) computes the same product without the 2-D reshape.
  primal = low_precision_dot_general(x, kernel, dimensions, jnp.bfloat16)
  np.testing.assert_allclose(primal, want, rtol=1e-5, atol=1e-5)

  grad = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
  d_x, d_kernel = pullback(grad)
  g2 = np.float64(grad).reshape(x2.shape[0], -1)
  assert d_x.dtype == d_kernel.dtype == jnp.float32
  assert d_x.shape == x.shape and d_kernel.shape == kernel.shape
  np.testing.assert_allclose(d_x, (bf16(g2) @ bf16(k2).T).reshape(x_shape), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_kernel, (x2.T @ g2).reshape(kernel_shape), rtol=1e-5, atol=1e-5)


def test_backward_multiplies_the_input_gradient_in_bf16_and_the_kernel_gradient_in_float32(rng):
  x = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
  _, pullback = jax.vjp(lambda a, b: low_precision_dot_general(a, b, (((1,), (0,)), ((), ())),
                                                               jnp.bfloat16), x, kernel)
  jaxpr = jax.make_jaxpr(pullback)(jnp.ones((4, 3), jnp.float32))
  operands = sorted(tuple(str(v.aval.dtype) for v in e.invars) for e in jaxpr.eqns
                    if e.primitive.name == "dot_general")
  assert operands == [("bfloat16", "bfloat16"), ("float32", "float32")]


def test_unsupported_dimensions_are_refused():
  x, kernel = jnp.ones((3, 4)), jnp.ones((3, 5))
  with pytest.raises(ValueError, match="contracts x's last axes with the kernel's first ones"):
    low_precision_dot_general(x, kernel, (((0,), (0,)), ((), ())), jnp.bfloat16)


def test_output_projection_with_matmul_dtype_matches_numpy(rng):
  """bf16 operands for the logits and the input's gradient; the matrix's gradient in float32."""
  x = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
  matrix = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
  logits, pullback = jax.vjp(lambda a, m: output_logits(a, m, jnp.bfloat16), x, matrix)
  x2 = np.float64(x).reshape(6, 8)
  np.testing.assert_allclose(logits, (bf16(x2) @ bf16(matrix).T).reshape(2, 3, 16), rtol=1e-5,
                             atol=1e-5)
  d_logits = rng.normal(size=(2, 3, 16))
  d_x, d_matrix = pullback(jnp.asarray(d_logits, jnp.float32))
  d2 = d_logits.reshape(6, 16)
  np.testing.assert_allclose(d_x, (bf16(d2) @ bf16(matrix)).reshape(2, 3, 8), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_matrix, d2.T @ x2, rtol=1e-5, atol=1e-5)
  assert d_x.dtype == d_matrix.dtype == jnp.float32


@pytest.mark.slow
def test_a_model_with_bf16_products_has_the_float32_models_loss_and_gradients(rng):
  """The same parameters, float32 throughout: the loss within bf16 rounding, every gradient
  pointing the same way."""
  config = tiny_model_config(dropout=0.0)
  full, half = Transformer(config), Transformer(dataclasses.replace(config, matmul_dtype=jnp.bfloat16))
  params = init_params(full)
  src, tgt = random_tokens(rng, 4, 7, 24), random_tokens(rng, 4, 6, 24)

  def loss(model):
    def fn(p):
      logits = model.apply({"params": p}, src, tgt)
      return -jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1).mean()
    return jax.value_and_grad(fn)(params)
  (loss_full, grads_full), (loss_half, grads_half) = loss(full), loss(half)
  assert abs(float(loss_full) - float(loss_half)) < 0.01 * float(loss_full)
  assert float(loss_full) != float(loss_half)  # the products did round
  for a, b in zip(jax.tree.leaves(grads_full), jax.tree.leaves(grads_half)):
    a, b = np.ravel(a), np.ravel(b)
    assert a.dtype == b.dtype == np.float32
    cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)
    assert cosine > 0.99 or np.linalg.norm(a) < 1e-6, cosine


def test_bf16_vocabulary_projection_rounds_that_product_only(rng):
  """decode.matmul_dtype='bfloat16_vocab': the logits are the float32 decoder's last hidden states
  and the float32 embedding, both rounded to bf16, multiplied with float32 sums (numpy); the
  parameters stay float32, so the token embeddings the layers read are exact."""
  model = Transformer(tiny_model_config())
  params = init_params(model, scale=3.0)
  models, cast = translator.with_matmul_dtype([model], [params], "bfloat16_vocab")
  assert models[0].config.matmul_dtype is None
  assert models[0].config.vocab_matmul_dtype == jnp.bfloat16
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(cast[0]))
  src, tgt = random_tokens(rng, 3, 7, 24), random_tokens(rng, 3, 6, 24)
  exact, hidden = model.apply({"params": params}, src, tgt, capture_intermediates=True,
                              mutable=["intermediates"])
  layers = hidden["intermediates"]["decoder"]
  last = max((k for k in layers if k.startswith("layer")), key=lambda k: int(k.split("_")[-1]))
  h = np.float64(layers[last]["__call__"][0])
  table = np.float64(params["embed"]["embedding"])
  np.testing.assert_allclose(exact, h @ table.T, rtol=1e-4, atol=1e-4)  # the last layer found
  rounded = models[0].apply({"params": cast[0]}, src, tgt)
  np.testing.assert_allclose(rounded, bf16(h) @ bf16(table).T, rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(rounded) - np.asarray(exact)).max() > 1e-4  # the product did round


def test_float32_decoding_of_a_model_trained_with_bf16_products_uses_float32_products():
  config = tiny_model_config(matmul_dtype=jnp.bfloat16)
  models, _ = translator.with_matmul_dtype([Transformer(config)], [{}], "float32")
  assert models[0].config.matmul_dtype is None
  models, _ = translator.with_matmul_dtype([Transformer(config)], [{}], "bfloat16")
  assert models[0].config.matmul_dtype == jnp.bfloat16
