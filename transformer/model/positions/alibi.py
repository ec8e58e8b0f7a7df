"""ALiBi (Press et al., 2022): no embedding; each head's scores fall linearly with the distance to the
key, -m_h |i - j|, with fixed slopes m_h = 2^(-8 h / H) (h = 1..H; other head counts as the paper
interleaves two powers of two). Symmetric in the encoder (|i - j|), causal in the decoder (where
j <= i, the paper's -m_h (i - j)). Made to train short and test long: no length limit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.positions.base import Drawing, PositionalEncoding, Terms, register


def alibi_slopes(heads: int) -> np.ndarray:
  """[heads] the paper's slopes: a geometric sequence from 2^(-8/n) for a power of two n; else
  those of the power of two below and every other one of twice that."""
  def powers(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
  below = 1 << (heads.bit_length() - 1)
  slopes = powers(below) + powers(2 * below)[0::2][:heads - below]
  return np.asarray(slopes, np.float32)


def distance_bias(slopes: np.ndarray, query_positions: jax.Array, key_positions: jax.Array
                  ) -> jax.Array:
  """[B|1, H, T, S] float32: -m_h |i - j|."""
  distance = jnp.abs(query_positions[:, :, None] - key_positions[:, None, :]).astype(jnp.float32)
  return -jnp.asarray(slopes)[None, :, None, None] * distance[:, None]


@register
class ALiBi(PositionalEncoding):
  kind = "alibi"
  not_in_ctranslate2 = "its decoder specification has ALiBi, but its encoder's has none"

  def prepare(self, query_positions: jax.Array, key_positions: jax.Array, causal: bool) -> jax.Array:
    return distance_bias(alibi_slopes(self.config.num_heads), query_positions, key_positions)

  @classmethod
  def attend(cls, module: Any, config: Any, query: jax.Array, key: jax.Array,
             prepared: jax.Array) -> Terms:
    return Terms(query, key, bias=prepared)

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    distances = np.arange(-(rows - 1), rows)
    bias = -alibi_slopes(config.num_heads)[:, None] * np.abs(distances)[None, :]
    return {"alibi (fixed: encoder; the decoder's keys j <= i)": Drawing(
        bias, "head", f"key position - query position ({-(rows - 1)} .. {rows - 1})")}

