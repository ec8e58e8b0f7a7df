"""The paper's sinusoids (section 3.5): fixed, defined at every position."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.positions.base import PositionalEncoding, register


def sinusoidal_encoding(positions: jax.Array, d_model: int) -> jax.Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)); [..., D] float32."""
  i = jnp.arange(d_model // 2, dtype=jnp.float32)
  angles = positions[..., None].astype(jnp.float32) / jnp.power(10000.0, 2.0 * i / d_model)
  return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)


@register
class Sinusoidal(PositionalEncoding):
  kind = "sinusoidal"

  def encoding(self, positions: jax.Array) -> jax.Array:
    return sinusoidal_encoding(positions, self.config.d_model)

  @classmethod
  def table(cls, config: Any, stack_params: dict[str, Any], rows: int) -> np.ndarray:
    return np.asarray(sinusoidal_encoding(jnp.arange(rows), config.d_model))
