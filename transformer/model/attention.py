"""Masked softmax attention: the one function that training, cached decoding and blocked decoding use.

    out = softmax(Q K^T / sqrt(d_k) where mask, else MASKED) V      per head

The callers differ only in the keys they pass: training gives one block of keys for the whole
sequence; a decoding step gives the cached keys of the source (one block) or of its own earlier
positions (several blocks of the self-attention cache, kv_cache.py), and blocks that no query has
reached yet are skipped. Logits and softmax are float32 whatever the activation dtype.

Two layouts, given as einsum subscripts (both are plain batched matmuls; XLA fuses no transpose):
SEQUENCE for full sequences ([B,T,H,K] queries, [B,S,H,K] keys, [B,S,H,V] values, [B,T,H,V] out)
and CACHE for the decoder's cache ([B,H,G,K] queries, keys stored transposed [B,H,K,N], values
heads-first [B,H,N,V], out [B,H,G,V]): keys in [B,H,N,K] made the first product 4x slower on CPU.

`attention_kernel` picks who computes full-sequence attention in the model: this function
('reference') or `jax.nn.dot_product_attention` (XLA's path, or cuDNN's flash attention on GPUs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

MASKED = jnp.finfo(jnp.float32).min  # the logit of a key a query may not attend to


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the axes lie: einsum subscripts for Q K^T (-> [.., queries, keys]) and weights V."""
  logits: str
  output: str


SEQUENCE = Layout("bthk,bshk->bhts", "bhts,bshv->bthv")
CACHE = Layout("bhgk,bhkn->bhgn", "bhgn,bhnv->bhgv")


class Keys(NamedTuple):
  """One block of keys and values, the mask of what each query may read in it (broadcasting to the
  logits' shape; None = everything), and the first position it holds (blocks starting after the
  furthest position reached are skipped)."""
  key: jax.Array
  value: jax.Array
  mask: jax.Array | None
  start: int = 0


def attention(query: jax.Array, blocks: Sequence[Keys], layout: Layout = SEQUENCE,
              dropout: Callable[[jax.Array], jax.Array] | None = None,
              reached: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
  """Attention of `query` over the keys of all `blocks`; returns (output, float32 weights).

  One block: the softmax itself, weights returned (for dropout and attention maps). Several blocks:
  each one's partial maximum, sum and weighted values, combined as flash attention does (weights
  None); a block with `start` > `reached` (the furthest query position) is not computed.
  """
  def logits_of(block: Keys) -> jax.Array:
    logits = jnp.einsum(layout.logits, query, block.key, preferred_element_type=jnp.float32)
    logits = logits / math.sqrt(query.shape[-1])
    return logits if block.mask is None else jnp.where(block.mask, logits, MASKED)

  if len(blocks) == 1:
    (block,) = blocks
    weights = jax.nn.softmax(logits_of(block), axis=-1)
    used = weights if dropout is None else dropout(weights)
    return jnp.einsum(layout.output, used.astype(block.value.dtype), block.value), weights

  def partial(block: Keys) -> tuple[jax.Array, jax.Array, jax.Array]:
    logits = logits_of(block)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - peak)
    if block.mask is not None:
      weights = jnp.where(block.mask, weights, 0.0)
    return (peak, weights.sum(-1, keepdims=True),
            jnp.einsum(layout.output, weights.astype(block.value.dtype), block.value,
                       preferred_element_type=jnp.float32))

  parts = []
  for block in blocks:
    if block.start == 0 or reached is None:
      parts.append(partial(block))
      continue
    compute = functools.partial(partial, block)
    shapes = jax.eval_shape(compute)
    skip = functools.partial(_nothing_attended, shapes)
    parts.append(jax.lax.cond(reached >= block.start, compute, skip))
  peak = functools.reduce(jnp.maximum, [p for p, _, _ in parts])
  total = sum(jnp.exp(p - peak) * t for p, t, _ in parts)
  out = sum(jnp.exp(p - peak) * o for p, _, o in parts) / total
  return out.astype(blocks[0].value.dtype), None


def _nothing_attended(shapes: tuple) -> tuple[jax.Array, ...]:
  """A skipped block's (peak, sum, weighted values): MASKED, 0 and 0, so the merge ignores it."""
  return tuple(jnp.full(x.shape, MASKED if i == 0 else 0.0, x.dtype) for i, x in enumerate(shapes))


def attention_kernel(config: Any, with_dropout: bool) -> str:
  """Which implementation computes full-sequence attention: 'reference' (`attention` above), 'xla'
  or 'cudnn' (both through `jax.nn.dot_product_attention`, whose logits and softmax are float32 too).

  'auto' picks cuDNN's fused flash attention on a GPU for bf16/fp16 heads of equal width (a multiple
  of 8, at most 128), XLA's path elsewhere, and the reference wherever the fused kernels cannot follow
  the config (attention dropout in training, d_k != d_v). `config`: a model.ModelConfig.
  """
  if config.attention == "reference" or with_dropout or config.key_dim != config.value_dim:
    return "reference"
  if config.attention != "auto":
    return config.attention
  cudnn_ok = (jax.default_backend() == "gpu" and config.dtype in (jnp.bfloat16, jnp.float16)
              and config.key_dim % 8 == 0 and config.key_dim <= 128)
  return "cudnn" if cudnn_ok else "xla"
