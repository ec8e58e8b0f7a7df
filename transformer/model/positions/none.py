"""No position information at all: the encoder sees a bag of tokens; the decoder's causal mask alone
tells it how far it has written (the floor every other kind is measured against)."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.model.positions.base import PositionalEncoding, register
from transformer.model.positions.sinusoidal import export_tables


@register
class NoPositions(PositionalEncoding):
  kind = "none"

  @classmethod
  def export(cls, config: Any, params: Any, encoder: Any, decoder: Any, rows: int) -> None:
    zeros = np.zeros((rows, config.d_model), np.float32)  # CTranslate2 always adds a table
    export_tables(encoder, decoder, (zeros, zeros))
