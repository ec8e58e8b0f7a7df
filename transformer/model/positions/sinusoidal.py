"""The paper's sinusoids (section 3.5): fixed, defined at every position, added to the embeddings."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.positions.base import Drawing, PositionalEncoding, register


def sinusoidal_encoding(positions: jax.Array, d_model: int) -> jax.Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)); [..., D] float32."""
  i = jnp.arange(d_model // 2, dtype=jnp.float32)
  angles = positions[..., None].astype(jnp.float32) / jnp.power(10000.0, 2.0 * i / d_model)
  return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)


def additive_drawing(table: np.ndarray) -> Drawing:
  """An added table as the figure draws it: position x dimension, and its rows' similarity."""
  return Drawing(table, "position", "dimension", similarity=True)


@register
class Sinusoidal(PositionalEncoding):
  kind = "sinusoidal"

  def embed(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    return x + sinusoidal_encoding(positions, self.config.d_model).astype(x.dtype)

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    table = np.asarray(sinusoidal_encoding(jnp.arange(rows), config.d_model))
    return {"sinusoidal (encoder and decoder)": additive_drawing(table)}

  @classmethod
  def added_tables(cls, config: Any, params: Any, rows: int) -> tuple[np.ndarray, np.ndarray]:
    table = np.asarray(sinusoidal_encoding(jnp.arange(rows), config.d_model))
    return table, table
