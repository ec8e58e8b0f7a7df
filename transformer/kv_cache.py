"""Decoding-time attention: the keys and values of earlier positions, cached and read back.

At decoding step t each of a sentence's G hypotheses adds one query; its self-attention reads the
keys and values of positions 0..t from a cache the decoder fills as it goes, and its attention over
the source reads the encoder output's keys and values, projected once. model.MultiHeadAttention calls
`self_attention` and `cross_attention` with itself, so the cache is its own Flax 'cache' collection
(created by the first, shape-only call that decode.py makes).

Layout: keys are stored transposed ([B, H, K, N]) and values heads-first ([B, H, N, V]), so both
products are plain batched matmuls over (B, H) that read the cache once and copy nothing. The
self-attention cache holds `decode_len` positions x G slots (slot = position * G + hypothesis) in
blocks of 16, 16, 32, 64, ... positions (`cache_blocks`), and blocks no hypothesis has reached are
skipped.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def cached_attention(query: jax.Array, key_t: jax.Array, value: jax.Array, mask: jax.Array
                     ) -> jax.Array:
  """Decoding-time attention of G query hypotheses per sentence over a cache laid out for it.

  [B,G,H,K] x [B,H,K,N] x [B,H,N,V] -> [B,G,H,V]; `mask` broadcasts to [B,H,G,N]. Keys are stored
  transposed and values heads-first, so both products are plain batched matmuls over (B, H) that
  read the cache once and copy nothing (keys in [B,H,N,K] made the first product 4x slower on CPU).
  """
  query = jnp.swapaxes(query, 1, 2)  # [B, H, G, K]
  logits = jnp.einsum("bhgk,bhkn->bhgn", query, key_t, preferred_element_type=jnp.float32)
  logits = jnp.where(mask, logits / math.sqrt(query.shape[-1]), jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  return jnp.swapaxes(jnp.einsum("bhgn,bhnv->bhgv", weights, value), 1, 2)


def cache_blocks(decode_len: int, first: int = 16) -> list[tuple[int, int]]:
  """(start, positions) of the self-attention cache's blocks: 16, 16, 32, 64, ... positions, so
  the blocks in use at step t never hold more than about 2t positions."""
  blocks, start = [], 0
  while start < decode_len:
    size = min(max(first, start), decode_len - start)
    blocks.append((start, size))
    start += size
  return blocks


def blocked_attention(query: jax.Array, keys_t: list[jax.Array], values: list[jax.Array],
                      starts: list[int], mask: jax.Array, step: jax.Array) -> jax.Array:
  """`cached_attention` over a self-attention cache kept as blocks of positions, skipping the blocks
  that no hypothesis has reached yet (none holds a position <= max(step)).

  The cache is preallocated for the longest output, but at step t only t + 1 positions hold keys:
  reading all of them made each step cost as much as the last one. Each block in use gives the
  softmax's partial maximum, sum and weighted values; they are combined as flash attention does.
  """
  query = jnp.swapaxes(query, 1, 2)  # [B, H, G, K]
  group = query.shape[2]
  scale = 1.0 / math.sqrt(query.shape[-1])
  lowest = jnp.finfo(jnp.float32).min
  reached = jnp.max(step)
  parts = []
  for key_t, value, start in zip(keys_t, values, starts):
    block_mask = mask[..., start * group:start * group + key_t.shape[-1]]

    def attend(key_t=key_t, value=value, block_mask=block_mask):
      logits = jnp.einsum("bhgk,bhkn->bhgn", query, key_t, preferred_element_type=jnp.float32)
      logits = jnp.where(block_mask, logits * scale, lowest)
      peak = jnp.max(logits, axis=-1, keepdims=True)
      weights = jnp.where(block_mask, jnp.exp(logits - peak), 0.0)
      return (peak, weights.sum(-1, keepdims=True),
              jnp.einsum("bhgn,bhnv->bhgv", weights.astype(value.dtype), value,
                         preferred_element_type=jnp.float32))

    if start == 0:
      parts.append(attend())
    else:
      shapes = jax.eval_shape(attend)
      parts.append(jax.lax.cond(reached >= start, attend, lambda shapes=shapes: tuple(
          jnp.full(x.shape, lowest if i == 0 else 0.0, x.dtype) for i, x in enumerate(shapes))))
  peak = functools.reduce(jnp.maximum, [p for p, _, _ in parts])
  total = sum(jnp.exp(p - peak) * t for p, t, _ in parts)
  out = sum(jnp.exp(p - peak) * o for p, _, o in parts) / total
  return jnp.swapaxes(out.astype(values[0].dtype), 1, 2)


def cross_attention(module: nn.Module, query: jax.Array, key_proj: Callable, value_proj: Callable,
                    encoded: jax.Array, mask: jax.Array) -> jax.Array:
  """Attention over the source: its keys and values projected on the first call, then reused."""
  keys_last = lambda x: jnp.transpose(x, (0, 2, 3, 1))  # [B, S, H, K] -> [B, H, K, S]
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, S, H, V] -> [B, H, S, V]
  key = module.variable("cache", "cached_key", lambda: keys_last(key_proj(encoded))).value
  value = module.variable("cache", "cached_value", lambda: heads_first(value_proj(encoded))).value
  return cached_attention(query, key, value, mask)


def self_attention(module: nn.Module, query: jax.Array, new_key: jax.Array, new_value: jax.Array,
                   mask: jax.Array, step: jax.Array, decode_len: int) -> jax.Array:
  """Writes the G hypotheses' new keys and values [B, G, H, d] at position `step` (one for all, or
  [B]) and attends over the cache; `mask` [B, 1, G, decode_len * G] says which slots each reads."""
  (batch, group, heads), key_dim, value_dim = new_key.shape[:3], new_key.shape[3], new_value.shape[3]
  steps = jnp.broadcast_to(step, (batch,))
  rows, hypotheses = jnp.arange(batch)[:, None], jnp.arange(group)
  keys_t, values, starts = [], [], []
  for i, (start, size) in enumerate(cache_blocks(decode_len)):
    key_var = module.variable("cache", f"cached_key_{i}", jnp.zeros,
                              (batch, heads, key_dim, size * group), new_key.dtype)
    value_var = module.variable("cache", f"cached_value_{i}", jnp.zeros,
                                (batch, heads, size * group, value_dim), new_value.dtype)
    # Each sentence writes at its own position, into the block that holds it (others drop it).
    local = steps - start
    slot = jnp.where((local >= 0) & (local < size), local, size)[:, None] * group + hypotheses
    key_var.value = key_var.value.at[rows, :, :, slot].set(new_key, mode="drop")
    value_var.value = value_var.value.at[rows, :, slot].set(new_value, mode="drop")
    keys_t.append(key_var.value)
    values.append(value_var.value)
    starts.append(start)
  return blocked_attention(query, keys_t, values, starts, mask, steps)
