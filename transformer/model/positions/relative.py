"""Relative positions of Shaw et al. (2018), as tensor2tensor ships them: no embedding; every
self-attention layer learns key and value embeddings of the key's offset from the query, clipped to
+-`relative_clip` (16 in tensor2tensor's WMT models), shared by the heads:

    e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_k),    z_i = sum_j softmax(e)_ij (v_j + a^V_ij)

Computed without a [B, H, T, S, d] tensor: the queries meet the 2c+1 key embeddings once
([B, H, T, 2c+1]) and each score picks its offset's column; each head's weights are summed per offset
([B, H, T, 2c+1]) before meeting the value embeddings (attention.by_distance, per block of the
decoding cache, so the blocks no query has reached cost nothing). No length limit."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.config import layer_params
from transformer.model.positions.base import (
  Drawing,
  PositionalEncoding,
  Terms,
  ctranslate2_layers,
  integer_key,
  option,
  register,
)


def clipped_offsets(query_positions: jax.Array, key_positions: jax.Array, clip: int) -> jax.Array:
  """[B|1, T, S, 2 clip + 1] float32 one-hot of each key's offset from its query, clipped."""
  offset = jnp.clip(key_positions[:, None, :] - query_positions[:, :, None], -clip, clip)
  return jax.nn.one_hot(offset + clip, 2 * clip + 1, dtype=jnp.float32)


def _self_attention(params: Any, stack: str, layer: int) -> Any:
  return layer_params(params[stack], layer)["self_attention"]


@register
class Relative(PositionalEncoding):
  kind = "relative"
  keys = (integer_key("relative_clip", 16, "relative positions: offsets are clipped to +- this"),)

  def prepare(self, query_positions: jax.Array, key_positions: jax.Array, causal: bool) -> jax.Array:
    return clipped_offsets(query_positions, key_positions, option(self.config, "relative_clip"))

  @classmethod
  def attend(cls, module: nn.Module, config: Any, query: jax.Array, key: jax.Array,
             prepared: jax.Array) -> Terms:
    distances = 2 * option(config, "relative_clip") + 1
    init = lambda *axes: nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes)
    key_table = module.param("relative_keys", init("relative_distances", "kv"),
                             (distances, config.key_dim))
    value_table = module.param("relative_values", init("relative_distances", "kv"),
                               (distances, config.value_dim))
    by_offset = jnp.einsum("bthk,rk->bhtr", query, key_table.astype(query.dtype),
                           preferred_element_type=jnp.float32)  # [B, H, T, 2c+1]
    return Terms(query, key, distances=prepared,
                 distance_scores=by_offset / math.sqrt(config.key_dim),
                 value_embeddings=value_table)

  @classmethod
  def param_count(cls, config: Any) -> int:
    layers = config.num_layers + config.num_decoder_layers
    return layers * (2 * option(config, "relative_clip") + 1) * (config.key_dim + config.value_dim)

  @classmethod
  def flops_per_target_token(cls, config: Any, src_len: int, tgt_len: int) -> float:
    r, h = 2 * option(config, "relative_clip") + 1, config.num_heads
    per_query = lambda keys: 2 * h * r * (config.key_dim + config.value_dim + 2 * keys)
    return (config.num_layers * per_query(src_len) * src_len / tgt_len
            + config.num_decoder_layers * per_query(tgt_len))

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    clip = option(config, "relative_clip")
    return {f"relative ({stack}, layer 1, {part})": Drawing(
                np.asarray(_self_attention(params, stack, 0)[f"relative_{part}"]),
                f"key position - query position (-{clip} .. {clip})", "dimension")
            for stack in ("encoder", "decoder") for part in ("keys", "values")}

  @classmethod
  def export_options(cls, config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"relative_position": True}, {"relative_position": True}

  @classmethod
  def export(cls, config: Any, params: Any, encoder: Any, decoder: Any, rows: int) -> None:
    for stack, i, layer in ctranslate2_layers(encoder, decoder):
      attention = _self_attention(params, stack, i)
      layer.self_attention.relative_position_keys = np.asarray(attention["relative_keys"])
      layer.self_attention.relative_position_values = np.asarray(attention["relative_values"])
