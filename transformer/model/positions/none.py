"""No position information at all: the encoder sees a bag of tokens; the decoder's causal mask alone
tells it how far it has written (the floor every other kind is measured against)."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.model.positions.base import PositionalEncoding, register


@register
class NoPositions(PositionalEncoding):
  kind = "none"

  @classmethod
  def added_tables(cls, config: Any, params: Any, rows: int) -> tuple[np.ndarray, np.ndarray]:
    zeros = np.zeros((rows, config.d_model), np.float32)  # engines with a table always add it
    return zeros, zeros
