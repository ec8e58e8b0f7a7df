"""A learned table of `model.max_len` rows per stack, added to the embeddings (Table 3, row E)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from transformer.model.positions.base import Drawing, PositionalEncoding, register
from transformer.model.positions.sinusoidal import additive_drawing


def _table(params: Any, stack: str, rows: int) -> np.ndarray:
  return np.asarray(params[stack]["positions"]["learned"]["embedding"])[:rows]


@register
class Learned(PositionalEncoding):
  kind = "learned"

  def setup(self):
    cfg = self.config
    init = nn.with_logical_partitioning(nn.initializers.normal(0.02), ("position", "embed"))
    self.learned = nn.Embed(cfg.max_len, cfg.d_model, embedding_init=init)

  def embed(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    return x + self.learned(positions).astype(x.dtype)

  @classmethod
  def longest(cls, config: Any) -> int:
    return config.max_len

  @classmethod
  def param_count(cls, config: Any) -> int:
    return 2 * config.max_len * config.d_model

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    return {f"learned ({stack})": additive_drawing(_table(params, stack, rows))
            for stack in ("encoder", "decoder")}

  @classmethod
  def added_tables(cls, config: Any, params: Any, rows: int) -> tuple[np.ndarray, np.ndarray]:
    return _table(params, "encoder", rows), _table(params, "decoder", rows)
