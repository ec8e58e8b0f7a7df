"""T5's relative position biases (Raffel et al., 2020): no embedding; one learned scalar per head and
bucket of the key's offset from the query, shared by every self-attention layer of a stack. Offsets
below half the buckets get one bucket each, longer ones logarithmic buckets up to `t5_max_distance`,
past which all share the last: the encoder's buckets split between keys before and after the query,
the decoder's all look back. Added to the scaled scores (T5 itself folds the 1/sqrt(d_k) into its
initialisation); no length limit."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer.errors import ConfigError
from transformer.model.positions.base import (
  Drawing,
  PositionalEncoding,
  Terms,
  ctranslate2_layers,
  integer_key,
  option,
  register,
)


def relative_bucket(offset: jax.Array, bidirectional: bool, buckets: int, max_distance: int
                    ) -> jax.Array:
  """T5's bucket of each key offset (key position - query position), int32 in [0, buckets)."""
  distance = -offset
  bucket = jnp.zeros_like(offset)
  if bidirectional:
    buckets //= 2
    bucket = jnp.where(distance < 0, buckets, 0)
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  exact = buckets // 2
  scaled = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / exact)
            / math.log(max_distance / exact) * (buckets - exact))
  far = jnp.minimum(exact + scaled.astype(offset.dtype), buckets - 1)
  return bucket + jnp.where(distance < exact, distance, far)


def _table(params: Any, stack: str) -> np.ndarray:
  return np.asarray(params[stack]["positions"]["relative_attention_bias"])


@register
class T5Bias(PositionalEncoding):
  kind = "t5"
  keys = (integer_key("t5_buckets", 32, "T5 positions: buckets of key offsets per stack", least=4),
          integer_key("t5_max_distance", 128, "T5 positions: offsets from here on share the last "
                      "bucket", least=2))

  def setup(self):
    init = nn.with_logical_partitioning(nn.initializers.normal(self.config.d_model ** -0.5),
                                        ("relative_buckets", "heads"))
    self.relative_attention_bias = self.param(
        "relative_attention_bias", init, (option(self.config, "t5_buckets"), self.config.num_heads))

  def prepare(self, query_positions: jax.Array, key_positions: jax.Array, causal: bool) -> jax.Array:
    offset = key_positions[:, None, :] - query_positions[:, :, None]  # [B|1, T, S]
    bucket = relative_bucket(offset, not causal, option(self.config, "t5_buckets"),
                             option(self.config, "t5_max_distance"))
    bias = jnp.take(self.relative_attention_bias, bucket, axis=0)  # [B|1, T, S, H]
    return jnp.moveaxis(bias, -1, 1).astype(jnp.float32)

  @classmethod
  def attend(cls, module: Any, config: Any, query: jax.Array, key: jax.Array,
             prepared: jax.Array) -> Terms:
    return Terms(query, key, bias=prepared)

  @classmethod
  def param_count(cls, config: Any) -> int:
    return 2 * option(config, "t5_buckets") * config.num_heads

  @classmethod
  def check(cls, cfg: ml_collections.ConfigDict) -> None:
    buckets, distance = cfg.model.t5_buckets, cfg.model.t5_max_distance
    if buckets % 2:
      raise ConfigError(f"config.model.t5_buckets must be even (the encoder's split between keys "
                        f"before and after the query), got {buckets}")
    if distance <= buckets // 2:  # the logarithmic buckets span exact .. max_distance
      raise ConfigError(f"config.model.t5_max_distance ({distance}) must be more than "
                        f"config.model.t5_buckets / 2 ({buckets // 2}), where the decoder's exact "
                        f"buckets end (the encoder's at t5_buckets / 4): at or below it, far "
                        f"offsets fall outside the buckets")

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    offsets = jnp.arange(-(rows - 1), rows)
    drawn = {}
    for stack, causal in (("encoder", False), ("decoder", True)):
      bucket = relative_bucket(offsets, not causal, option(config, "t5_buckets"),
                               option(config, "t5_max_distance"))
      bias = _table(params, stack)[np.asarray(bucket)].T  # [H, offsets]
      if causal:
        bias = np.where(np.asarray(offsets)[None, :] <= 0, bias, np.nan)
      drawn[f"t5 ({stack})"] = Drawing(bias, "head", f"key position - query position "
                                                     f"({-(rows - 1)} .. {rows - 1})")
    return drawn

  @classmethod
  def export_options(cls, config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"relative_attention_bias": True}, {"relative_attention_bias": True}

  @classmethod
  def export(cls, config: Any, params: Any, encoder: Any, decoder: Any, rows: int) -> None:
    for stack, _, layer in ctranslate2_layers(encoder, decoder):  # the stack's one table
      layer.self_attention.relative_attention_bias = _table(params, stack)
      layer.self_attention.relative_attention_max_distance = np.int32(
          option(config, "t5_max_distance"))
