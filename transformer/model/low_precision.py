"""The layers' matrix products with bf16 operands and float32 sums, with their backward pass.

`model.matmul_dtype = "bfloat16"` rounds the inputs of every layer's matrix product (dense kernels
and their activations) to bf16 and keeps the sums, activations, LayerNorm, softmax, parameters and
optimizer state in float32: what a TPU's default precision does to float32 products. On a CPU with
AMX or AVX512-BF16, XLA runs such a product at several times the float32 rate when it is a plain
[M, K] x [K, N] or [M, K] x [N, K] product, but runs the weight gradient's product (contracting over
the tokens, the major axis of both operands) as float32 after converting its operands, which is
slower than float32 alone. So the backward pass is written out: the input's gradient multiplies the
gradient rounded to bf16 by the bf16 kernel, and the kernel's gradient multiplies the float32
input by the float32 gradient. tests/test_products.py checks both against numpy.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

_ROWS_BY_COLUMNS = (((1,), (0,)), ((), ()))   # [M, K] x [K, N]
_ROWS_BY_ROWS = (((1,), (1,)), ((), ()))      # [M, K] x [N, K]
_OVER_ROWS = (((0,), (0,)), ((), ()))         # [M, K]^T x [M, N]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def low_precision_dot_general(x: jax.Array, kernel: jax.Array, dimensions: Any,
                              dtype: Any) -> jax.Array:
  """lax.dot_general of `x` [..., K...] and `kernel` [K..., N...] (x's trailing axes contracted
  with the kernel's leading ones, as flax's Dense and DenseGeneral do) with both operands in
  `dtype` and the sums in x's dtype."""
  _contracted_axes(x, kernel, dimensions)
  return jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), dimensions,
                             preferred_element_type=x.dtype)


def _contracted_axes(x: jax.Array, kernel: jax.Array, dimensions: Any) -> int:
  (x_axes, kernel_axes), batch = dimensions
  n = len(kernel_axes)
  if batch != ((), ()) or tuple(kernel_axes) != tuple(range(n)) or (
      tuple(x_axes) != tuple(range(x.ndim - n, x.ndim))):
    raise ValueError(f"low_precision_dot_general contracts x's last axes with the kernel's first "
                     f"ones, got dimensions {dimensions}")
  return n


def _forward(x, kernel, dimensions, dtype):
  """In training the product is one 2-D [tokens, K] x [K, N] (XLA's CPU backend has no bf16 kernel
  for some of flax's shapes, e.g. the attention output's two contracted axes)."""
  n = _contracted_axes(x, kernel, dimensions)
  depth = math.prod(kernel.shape[:n])
  x2 = x.reshape(-1, depth)
  out = jax.lax.dot_general(x2.astype(dtype), kernel.reshape(depth, -1).astype(dtype),
                            _ROWS_BY_COLUMNS, preferred_element_type=x.dtype)
  return out.reshape(*x.shape[:x.ndim - n], *kernel.shape[n:]), (x2, kernel)


def _backward(dimensions, dtype, residuals, grad):
  x2, kernel = residuals
  n = len(dimensions[0][1])
  depth, width = math.prod(kernel.shape[:n]), math.prod(kernel.shape[n:])
  grad2 = grad.reshape(-1, width)
  d_x = jax.lax.dot_general(grad2.astype(dtype), kernel.reshape(depth, width).astype(dtype),
                            _ROWS_BY_ROWS, preferred_element_type=jnp.float32)
  d_kernel = jax.lax.dot_general(x2, grad2, _OVER_ROWS, preferred_element_type=jnp.float32)
  leading = grad.shape[:grad.ndim - (kernel.ndim - n)]  # x's axes that are not contracted
  return (d_x.reshape(*leading, *kernel.shape[:n]).astype(grad.dtype),
          d_kernel.reshape(kernel.shape).astype(kernel.dtype))


low_precision_dot_general.defvjp(_forward, _backward)
