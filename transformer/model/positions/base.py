"""The contract of a positional encoding, and the registry of kinds."""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from transformer.errors import ConfigError

_KINDS: dict[str, type[PositionalEncoding]] = {}


class PositionalEncoding(nn.Module):
  """Adds position information to embeddings x [B, L, D] at `positions` [B, L].

  The model creates it as the submodule `positions` of each stack, so its parameters (if any) live
  under encoder/positions/ and decoder/positions/.
  """
  config: Any  # model.transformer.ModelConfig
  kind: ClassVar[str]

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    return x + self.encoding(positions).astype(x.dtype)

  def encoding(self, positions: jax.Array) -> jax.Array:
    """[B, L, D] what is added at `positions`."""
    raise NotImplementedError

  @classmethod
  def table(cls, config: Any, stack_params: dict[str, Any], rows: int) -> np.ndarray:
    """[rows, D] what the trained stack (`stack_params`: its parameters) adds at 0 .. rows-1: the
    table an inference engine is given and the attention-map figures draw."""
    raise NotImplementedError

  @classmethod
  def longest(cls, config: Any) -> int | None:
    """The most positions it can encode (a learned table's rows), None if unbounded."""
    return None

  @classmethod
  def param_count(cls, config: Any) -> int:
    """Parameters it adds to one stack."""
    return 0

  @classmethod
  def check(cls, cfg: ml_collections.ConfigDict) -> None:
    """Raises ConfigError where a run config cannot work with this kind."""


def register(cls: type[PositionalEncoding]) -> type[PositionalEncoding]:
  """Class decorator: makes `cls` the kind named `cls.kind`."""
  if cls.kind in _KINDS:
    raise ValueError(f"positional encoding {cls.kind!r} is registered twice")
  _KINDS[cls.kind] = cls
  return cls


def kinds() -> tuple[str, ...]:
  return tuple(_KINDS)


def get(kind: str) -> type[PositionalEncoding]:
  """The registered kind; an unknown name is an error, never a silent default."""
  if kind not in _KINDS:
    raise ConfigError(f"config.model.positional must be one of {', '.join(map(repr, _KINDS))}; "
                      f"got {kind!r}")
  return _KINDS[kind]
