"""Masked softmax attention: the one function that training, cached decoding and blocked decoding use.

    out = softmax(Q K^T / sqrt(d_k) where mask, else MASKED) V      per head

(plus what a positional encoding adds, positions/base.py: a bias of the scaled logits, and for
relative positions scores and values by the distance between query and key, `Keys`).

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
  furthest position reached are skipped). A positional encoding may add a float32 `bias` to the
  scaled logits (broadcasting like the mask), and may relate queries and keys by one of R
  distances (`distances` [B|1, T|1, S, R], one-hot): each query's float32 `distance_scores`
  [B, H, T, R] are added to the logits of the keys at those distances, and the `value_embeddings`
  [R, V] of its distances to each key's value. Computed per block, so skipped blocks cost nothing."""
  key: jax.Array
  value: jax.Array
  mask: jax.Array | None
  start: int = 0
  bias: jax.Array | None = None
  distances: jax.Array | None = None
  distance_scores: jax.Array | None = None
  value_embeddings: jax.Array | None = None


def by_distance(x: jax.Array, distances: jax.Array, to_keys: bool) -> jax.Array:
  """Per-distance values [B, H, T, R] spread to the keys ([B, H, T, S], `to_keys`), or per-key
  weights [B, H, T, S] summed per distance ([B, H, T, R]); `distances` [B|1, T|1, S, R] one-hot,
  shared by the heads (and by the rows when its batch axis is 1). float32."""
  if distances.shape[0] == 1:  # the same positions in every row: a matmul per query position
    table, spec = jnp.broadcast_to(distances[0], (x.shape[2], *distances.shape[2:])), "tsr"
  elif distances.shape[1] == 1:  # one query position per row (a decoding step)
    table, spec = distances[:, 0], "bsr"
  else:  # packed rows: positions of their own
    table, spec = distances, "btsr"
  spec = f"bhtr,{spec}->bhts" if to_keys else f"bhts,{spec}->bhtr"
  return jnp.einsum(spec, x, table.astype(x.dtype), preferred_element_type=jnp.float32)


def _distance_values(weights: jax.Array, block: Keys, layout: Layout) -> jax.Array | None:
  """What the value embeddings of distances add to the output, in the layout's output axes."""
  if block.value_embeddings is None:
    return None
  per_distance = by_distance(weights.astype(jnp.float32), block.distances, to_keys=False)
  added = jnp.einsum("bhtr,rv->bhtv", per_distance, block.value_embeddings.astype(jnp.float32))
  return added if layout == CACHE else jnp.swapaxes(added, 1, 2)


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
    if block.bias is not None:
      logits = logits + block.bias
    if block.distance_scores is not None:
      logits = logits + by_distance(block.distance_scores, block.distances, to_keys=True)
    return logits if block.mask is None else jnp.where(block.mask, logits, MASKED)

  if len(blocks) == 1:
    (block,) = blocks
    weights = jax.nn.softmax(logits_of(block), axis=-1)
    used = weights if dropout is None else dropout(weights)
    out = jnp.einsum(layout.output, used.astype(block.value.dtype), block.value)
    added = _distance_values(used, block, layout)
    return (out if added is None else out + added.astype(out.dtype)), weights

  def partial(block: Keys) -> tuple[jax.Array, jax.Array, jax.Array]:
    logits = logits_of(block)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - peak)
    if block.mask is not None:
      weights = jnp.where(block.mask, weights, 0.0)
    out = jnp.einsum(layout.output, weights.astype(block.value.dtype), block.value,
                     preferred_element_type=jnp.float32)
    added = _distance_values(weights, block, layout)
    return peak, weights.sum(-1, keepdims=True), out if added is None else out + added

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
