"""The projection onto the vocabulary, with its backward pass written out.

The decoder's last matrix product ([tokens x D] times the [V x D] embedding) is the largest in the
model at a small d_model; on XLA's CPU backend, autodiff's gradient for the matrix made it copy the
[tokens x V] gradient transposed (65 MB for the default batch) before multiplying. The backward pass
here keeps the vocabulary the minor dimension of both products. Same math: tests/test_model.py
checks it against autodiff (the matrix gradient's sums may round differently in the last bit).

With bfloat16 activations the float32 gradient of the logits is rounded to bfloat16 before the two
backward products, as the forward product's inputs are (autodiff would multiply float32 by
bfloat16, which runs as a float32 product: on an H200 those two products took 12% of base's step).
"""

import jax
import jax.numpy as jnp


@jax.custom_vjp
def output_logits(x: jax.Array, matrix: jax.Array) -> jax.Array:
  """[B, T, D] x [V, D] -> float32 [B, T, V]: logits over the vocabulary."""
  with jax.named_scope("output_logits"):  # profiles find the projection by this name
    return jnp.einsum("btd,vd->btv", x, matrix, preferred_element_type=jnp.float32)


def _output_logits_fwd(x, matrix):
  return output_logits(x, matrix), (x, matrix)


def _output_logits_bwd(residuals, d_logits):
  x, matrix = residuals
  with jax.named_scope("output_logits_grad"):
    d_logits = d_logits.astype(x.dtype)  # bf16 training: both products in bf16 (float32 sums)
    d_x = jnp.einsum("btv,vd->btd", d_logits, matrix, preferred_element_type=jnp.float32)
    # [tokens, D]^T x [tokens, V] as a 2-D product: XLA's CPU backend runs no bf16 product with two
    # contracting dimensions (b, t) and float32 sums ("Unsupported element type for DotThunk").
    d_matrix = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), d_logits.reshape(-1, d_logits.shape[-1]),
                                   (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32).T
  return d_x.astype(x.dtype), d_matrix.astype(matrix.dtype)


output_logits.defvjp(_output_logits_fwd, _output_logits_bwd)
