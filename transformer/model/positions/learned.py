"""A learned table of `model.max_len` rows per stack (the paper's Table 3, row E)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from transformer.errors import ConfigError
from transformer.model.positions.base import PositionalEncoding, register


@register
class Learned(PositionalEncoding):
  kind = "learned"

  def encoding(self, positions: jax.Array) -> jax.Array:
    cfg = self.config
    init = nn.with_logical_partitioning(nn.initializers.normal(0.02), ("position", "embed"))
    return nn.Embed(cfg.max_len, cfg.d_model, name="learned", embedding_init=init)(positions)

  @classmethod
  def table(cls, config: Any, stack_params: dict[str, Any], rows: int) -> np.ndarray:
    return np.asarray(stack_params["positions"]["learned"]["embedding"])[:rows]

  @classmethod
  def longest(cls, config: Any) -> int:
    return config.max_len

  @classmethod
  def param_count(cls, config: Any) -> int:
    return config.max_len * config.d_model

  @classmethod
  def check(cls, cfg: ml_collections.ConfigDict) -> None:
    if cfg.model.max_len < cfg.data.max_len:
      raise ConfigError(f"config.model.max_len ({cfg.model.max_len}) must be >= config.data.max_len "
                        f"({cfg.data.max_len}) for learned positions")
