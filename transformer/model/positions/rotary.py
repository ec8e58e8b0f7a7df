"""Rotary positions (RoPE; Su et al., 2021, "RoFormer"): no embedding; each self-attention layer
rotates every pair of query and key dimensions (2i, 2i+1) by the angle p * base^(-2i/d_k) of its
position p, so a score depends on the two positions only through their offset. Pairs interleaved as
in the paper (and CTranslate2's default); the rotation in float32, its result in the activations'
dtype. Cached keys are stored rotated (by their own positions). No length limit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer.errors import ConfigError
from transformer.model.positions.base import (
  Drawing,
  PositionalEncoding,
  Terms,
  option,
  positive_number_key,
  register,
)


def rotation_angles(positions: jax.Array, dim: int, base: float) -> jax.Array:
  """[..., dim / 2] float32 angles p * base^(-2i/dim)."""
  inverse = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  return positions[..., None].astype(jnp.float32) * jnp.asarray(inverse, jnp.float32)


def rotate(x: jax.Array, angles: jax.Array) -> jax.Array:
  """x [B, L, H, K] rotated pairwise by angles [B|1, L|1, K/2] (broadcast over heads)."""
  cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]
  pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
  even, odd = pairs[..., 0], pairs[..., 1]
  turned = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  return turned.reshape(x.shape).astype(x.dtype)


@register
class Rotary(PositionalEncoding):
  kind = "rotary"
  keys = (positive_number_key("rotary_base", 10000.0, "rotary positions: the angles' base"),)

  def prepare(self, query_positions: jax.Array, key_positions: jax.Array, causal: bool) -> jax.Array:
    return rotation_angles(query_positions, self.config.key_dim, option(self.config, "rotary_base"))

  @classmethod
  def attend(cls, module: Any, config: Any, query: jax.Array, key: jax.Array,
             prepared: jax.Array) -> Terms:
    return Terms(rotate(query, prepared), rotate(key, prepared))

  @classmethod
  def check(cls, cfg: ml_collections.ConfigDict) -> None:
    width = cfg.model.d_k or cfg.model.d_model // cfg.model.num_heads
    if width % 2:
      raise ConfigError(f"rotary positions rotate pairs of query/key dimensions; d_k ({width}) "
                        "must be even")

  @classmethod
  def flops_per_target_token(cls, config: Any, src_len: int, tgt_len: int) -> float:
    per_token = 2 * 3 * config.num_heads * config.key_dim  # queries and keys: 3 FLOPs a value
    return (config.num_layers * per_token * src_len / tgt_len
            + config.num_decoder_layers * per_token)

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    angles = np.asarray(rotation_angles(jnp.arange(rows), config.key_dim,
                                        option(config, "rotary_base")))
    return {"rotary (cos of each pair's angle; encoder and decoder)": Drawing(
        np.cos(angles), "position", "pair of query/key dimensions")}

  @classmethod
  def export_options(cls, config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    rotary = {"rotary_dim": 0, "rotary_interleave": True,
              "rotary_base": float(option(config, "rotary_base"))}
    return rotary, rotary

  @classmethod
  def export(cls, config: Any, params: Any, encoder: Any, decoder: Any, rows: int) -> None:
    # CTranslate2's encoder adds a table even when it rotates: give it zeros.
    encoder.position_encodings.encodings = np.zeros((rows, config.d_model), np.float32)
