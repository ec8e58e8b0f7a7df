"""Decoding-time attention: the keys and values of earlier positions, cached and read back.

At decoding step t each of a sentence's `beam_size` hypotheses (G) adds one query; its
self-attention reads the keys and values of positions 0..t from a cache the decoder fills as it goes,
and its attention over the source reads the encoder output's keys and values, projected once.
model.MultiHeadAttention calls `self_attention` and `cross_attention` with itself, so each cache is
a Flax collection of its own: SELF ('cache', written every step) and SOURCE ('source_cache', written
once per sentence). Decoding code tells them apart by collection, never by module names.

Layout (attention.CACHE): keys are stored transposed ([B, H, K, N]) and values heads-first
([B, H, N, V]), so both products are plain batched matmuls over (B, H) that read the cache once and
copy nothing. The self-attention cache holds `decode_len` positions x G slots (slot = position * G +
hypothesis) in blocks of 16, 16, 32, 64, ... positions (`cache_blocks`); attention skips the blocks
no hypothesis has reached.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model.attention import CACHE, Keys, attention
from transformer.model.positions import Terms

SELF, SOURCE = "cache", "source_cache"  # the two Flax collections of a decoding step's caches


def _heads_first(query: jax.Array) -> jax.Array:
  return jnp.swapaxes(query, 1, 2)  # [B, G, H, K] <-> [B, H, G, K]


def cache_blocks(decode_len: int, first: int = 16) -> list[tuple[int, int]]:
  """(start, positions) of the self-attention cache's blocks: 16, 16, 32, 64, ... positions, so
  the blocks in use at step t never hold more than about 2t positions."""
  blocks, start = [], 0
  while start < decode_len:
    size = min(max(first, start), decode_len - start)
    blocks.append((start, size))
    start += size
  return blocks


def cross_attention(module: nn.Module, query: jax.Array, key_proj: Callable, value_proj: Callable,
                    encoded: jax.Array, mask: jax.Array) -> jax.Array:
  """Attention over the source: its keys and values projected on the first call, then reused."""
  keys_last = lambda x: jnp.transpose(x, (0, 2, 3, 1))  # [B, S, H, K] -> [B, H, K, S]
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, S, H, V] -> [B, H, S, V]
  key = module.variable(SOURCE, "cached_key", lambda: keys_last(key_proj(encoded))).value
  value = module.variable(SOURCE, "cached_value", lambda: heads_first(value_proj(encoded))).value
  out, _ = attention(_heads_first(query), [Keys(key, value, mask)], CACHE)
  return _heads_first(out)


def self_attention(module: nn.Module, query: jax.Array, new_key: jax.Array, new_value: jax.Array,
                   mask: jax.Array, step: jax.Array, decode_len: int, terms: Terms) -> jax.Array:
  """Writes the G hypotheses' new keys and values [B, G, H, d] at position `step` (one for all, or
  [B]) and attends over the cache; `mask` [B, 1, G, decode_len * G] says which slots each reads, and
  the positional encoding's `terms` bias them or add value embeddings (their slot axis sliced like
  the mask's; query and keys as `terms` gives them, rotated or not)."""
  (batch, beam_size, heads), key_dim, value_dim = new_key.shape[:3], new_key.shape[3], new_value.shape[3]
  steps = jnp.broadcast_to(step, (batch,))
  rows, hypotheses = jnp.arange(batch)[:, None], jnp.arange(beam_size)
  blocks = []
  for i, (start, size) in enumerate(cache_blocks(decode_len)):
    key_var = module.variable(SELF, f"cached_key_{i}", jnp.zeros,
                              (batch, heads, key_dim, size * beam_size), new_key.dtype)
    value_var = module.variable(SELF, f"cached_value_{i}", jnp.zeros,
                                (batch, heads, size * beam_size, value_dim), new_value.dtype)
    # Each sentence writes at its own position, into the block that holds it (others drop it).
    local = steps - start
    slot = jnp.where((local >= 0) & (local < size), local, size)[:, None] * beam_size + hypotheses
    key_var.value = key_var.value.at[rows, :, :, slot].set(new_key, mode="drop")
    value_var.value = value_var.value.at[rows, :, slot].set(new_value, mode="drop")
    slots = slice(start * beam_size, (start + size) * beam_size)
    blocks.append(Keys(key_var.value, value_var.value, mask[..., slots], start,
                       None if terms.bias is None else terms.bias[..., slots],
                       None if terms.distances is None else terms.distances[..., slots, :],
                       terms.distance_scores, terms.value_embeddings))
  out, _ = attention(_heads_first(query), blocks, CACHE, reached=jnp.max(steps))
  return _heads_first(out)
