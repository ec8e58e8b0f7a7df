"""The projection onto the vocabulary, with its backward pass written out.

The decoder's last matrix product ([tokens x D] times the [V x D] embedding) is the largest in the
model at a small d_model; on XLA's CPU backend, autodiff's gradient for the matrix made it copy the
[tokens x V] gradient transposed (65 MB for the default batch) before multiplying. The backward pass
here keeps the vocabulary the minor dimension of both products. Same math: tests/test_model.py
checks it against autodiff (the matrix gradient's sums may round differently in the last bit).

With bfloat16 activations the float32 gradient of the logits is rounded to bfloat16 before the two
backward products, as the forward product's inputs are (autodiff would multiply float32 by
bfloat16, which runs as a float32 product: on an H200 those two products took 12% of base's step).
With float32 activations and `model.matmul_dtype` bf16 (low_precision.py) the logits and the input's
gradient take bf16 operands and the matrix's gradient stays a float32 product.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def output_logits(x: jax.Array, matrix: jax.Array, matmul_dtype: Any = None) -> jax.Array:
  """[B, T, D] x [V, D] -> float32 [B, T, V]: logits over the vocabulary. With `matmul_dtype`
  (model.matmul_dtype) the operands are rounded to it for the product."""
  dtype = matmul_dtype or x.dtype
  with jax.named_scope("output_logits"):  # profiles find the projection by this name
    return jnp.einsum("btd,vd->btv", x.astype(dtype), matrix.astype(dtype),
                      preferred_element_type=jnp.float32)


def _output_logits_fwd(x, matrix, matmul_dtype):
  return output_logits(x, matrix, matmul_dtype), (x, matrix)


def _output_logits_bwd(matmul_dtype, residuals, d_logits):
  x, matrix = residuals
  with jax.named_scope("output_logits_grad"):
    # bf16 training: the input's gradient in bf16 (float32 sums); with bf16 activations the matrix's
    # too, with matmul_dtype in x's float32 (XLA's CPU backend runs this product over the tokens
    # in bf16 slower than in float32: low_precision.py)
    d_low = d_logits.astype(matmul_dtype or x.dtype)
    d_x = jnp.einsum("btv,vd->btd", d_low, matrix.astype(d_low.dtype),
                     preferred_element_type=jnp.float32)
    # [tokens, D]^T x [tokens, V] as a 2-D product: XLA's CPU backend runs no bf16 product with two
    # contracting dimensions (b, t) and float32 sums ("Unsupported element type for DotThunk").
    d_matrix = jax.lax.dot_general(x.reshape(-1, x.shape[-1]),
                                   d_logits.astype(x.dtype).reshape(-1, d_logits.shape[-1]),
                                   (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32).T
  return d_x.astype(x.dtype), d_matrix.astype(matrix.dtype)


output_logits.defvjp(_output_logits_fwd, _output_logits_bwd)


SEARCH_MATRIX = "output_matrix_dv"  # the decoder's param a search may add (translator.search_params)


def search_logits(x: jax.Array, matrix_dv: jax.Array, matmul_dtype: Any = None) -> jax.Array:
  """[B, T, D] x [D, V] -> float32 [B, T, V]: `output_logits` from the matrix stored transposed.

  For searches on CPUs: XLA's CPU product with the vocabulary the minor dimension of the stored
  matrix runs 1.4-2.2x the [V, D] one at the 8-32 rows a decoding step multiplies per device
  (experiments/analyses/cpu_kernels.py).
  """
  dtype = matmul_dtype or x.dtype
  with jax.named_scope("output_logits"):
    return jnp.einsum("btd,dv->btv", x.astype(dtype), matrix_dv.astype(dtype),
                      preferred_element_type=jnp.float32)
