"""The contract of a positional encoding, and the registry of kinds.

A kind tells the model where tokens are in one or more of three places, each a method with a
do-nothing default, so a kind overrides only what it does:

  embed     adds to the token embeddings, once per stack (the paper's sinusoids, a learned table);
  prepare   computes, once per stack, what every self-attention layer of the stack is given
            (a per-head bias of the scores from query and key positions: T5's buckets, ALiBi);
  attend    acts in each self-attention layer on its queries and keys: rotates them (rotary), or
            biases the scores by the query and adds to the values (Shaw et al.'s relative keys
            and values, with per-layer parameters).

Self-attention only: the encoder's is bidirectional (`causal` False), the decoder's causal; the
decoder's attention over the source is untouched. In a decoding step the queries are the G new
positions of each sentence and the keys are the cache's slots (slot = position * G + hypothesis), so a
kind written against positions is exact with the cache too; packed rows pass per-pair positions and
attention never crosses pairs, so nothing leaks between segments.

A kind also declares its config keys (`keys`: `config.model.<name>`, with defaults and checks), the
parameters and FLOPs it adds, its length limit, its exports (`added_tables`: the position table
an engine adds to the embeddings; `export`: CTranslate2's spec, evaluation/export.py) and what the
positional-encoding figure draws (`drawings`); config.py, the size counts, the searches and
the tests ask the registry, so nothing else names a kind.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from transformer.errors import ConfigError
from transformer.keys import Key, integer_key, positive_number_key  # noqa: F401  (kinds' keys)
from transformer.model.config import ModelConfig

_KINDS: dict[str, type[PositionalEncoding]] = {}


class Terms(NamedTuple):
  """What a kind does to one self-attention layer: its queries and keys (rotated or not), a float32
  bias of the scores (broadcasting to [B, H, T, S], added after the 1/sqrt(d_k) scaling), and
  terms by distance (attention.Keys): `distances` [B|1, T|1, S, R] one-hot, each query's float32
  `distance_scores` [B, H, T, R] added to the scaled logits of the keys at those distances, and
  `value_embeddings` [R, d_v] added to their values."""
  query: jax.Array
  key: jax.Array
  bias: jax.Array | None = None
  distances: jax.Array | None = None
  distance_scores: jax.Array | None = None
  value_embeddings: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Drawing:
  """A 2-D array the positional-encoding figure draws, with its axes' names; `similarity`: also
  draw the cosine similarity of its rows (positions of an additive table)."""
  values: np.ndarray
  rows: str
  columns: str
  similarity: bool = False


class PositionalEncoding(nn.Module):
  """A stack's `positions` submodule: its parameters (made in `setup`) live under encoder/positions/
  and decoder/positions/; per-layer parameters (`attend`) under each layer's self_attention/."""
  config: Any  # model.transformer.ModelConfig
  kind: ClassVar[str]
  keys: ClassVar[tuple[Key, ...]] = ()
  # Why CTranslate2 cannot hold the kind, for the export's refusal (kinds it holds define `export`).
  not_in_ctranslate2: ClassVar[str] = "its model specification has no such kind"

  def embed(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """x [B, L, D], the token embeddings at `positions` [B, L], with position added (or not)."""
    return x

  def prepare(self, query_positions: jax.Array, key_positions: jax.Array, causal: bool) -> Any:
    """What each self-attention layer of the stack gets (a pytree of arrays, or None), from the
    positions of its queries [B, T] and keys [B|1, S]."""
    return None

  @classmethod
  def attend(cls, module: nn.Module, config: Any, query: jax.Array, key: jax.Array,
             prepared: Any) -> Terms:
    """One self-attention layer's terms; `module` is the layer's attention (for parameters of its
    own), query [B, T, H, K] and key [B, S, H, K] (in a decoding step the new keys, at the query
    positions), `prepared` what `prepare` gave."""
    return Terms(query, key)

  @classmethod
  def longest(cls, config: Any) -> int | None:
    """The most positions it can encode (a learned table's rows), None if unbounded."""
    return None

  @classmethod
  def param_count(cls, config: Any) -> int:
    """Parameters it adds to the model (both stacks, every layer)."""
    return 0

  @classmethod
  def flops_per_target_token(cls, config: Any, src_len: int, tgt_len: int) -> float:
    """Forward FLOPs it adds per target token (multiply-adds of its products, 2 each)."""
    return 0.0

  @classmethod
  def drawings(cls, config: Any, params: Any, rows: int) -> dict[str, Drawing]:
    """What the positional-encoding figure draws of a trained model (`params`: all of them)."""
    return {}

  @classmethod
  def added_tables(cls, config: Any, params: Any, rows: int
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """The `rows` x D float32 tables it adds to the encoder's and the decoder's scaled embeddings,
    as engines with one position table per stack store it (CTranslate2, Hugging Face's Marian);
    None where the kind acts elsewhere (inside attention)."""
    return None

  @classmethod
  def export(cls, config: Any, params: Any, encoder: Any, decoder: Any, rows: int) -> None:
    """Writes the kind into CTranslate2's encoder and decoder specs (made by `export_options`): its
    `added_tables` as their position encodings, or what a kind acting in attention overrides."""
    tables = cls.added_tables(config, params, rows)
    if tables is None:
      raise ConfigError(ctranslate2_refusal(cls.kind))
    encoder.position_encodings.encodings, decoder.position_encodings.encodings = tables

  @classmethod
  def export_options(cls, config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments of CTranslate2's TransformerEncoderSpec and TransformerDecoderSpec."""
    return {}, {}

  @classmethod
  def check(cls, cfg: ml_collections.ConfigDict) -> None:
    """Raises ConfigError where a run config cannot work with this kind (beyond its keys' checks)."""


def positive_param(module: nn.Module, name: str, value: float, shape: tuple[int, ...] = (),
                   axes: tuple[str, ...] = ()) -> jax.Array:
  """A learned parameter that stays positive whatever the updates do (a slope, a rate, a scale):
  stored as `name` = softplus⁻¹(value) and returned as softplus of what is stored, so no update
  takes it to zero or below (float32 rounds it to 0 only once the stored value is below about
  -87) and no clamp in the forward pass cuts its gradient. `axes`: the logical
  axis names of `shape` (partitioning.py), as a kind's other parameters have."""
  init = nn.initializers.constant(math.log(math.expm1(value)))
  stored = module.param(name, nn.with_logical_partitioning(init, axes) if axes else init, shape)
  return jax.nn.softplus(stored)


def adds_tables(kind: str) -> bool:
  """Whether the kind is a position table added to the embeddings (it defines `added_tables`)."""
  return get(kind).added_tables.__func__ is not PositionalEncoding.added_tables.__func__


def in_ctranslate2(kind: str) -> bool:
  """Whether CTranslate2 can hold the kind: a table it adds, or an `export` of its own."""
  return adds_tables(kind) or get(kind).export.__func__ is not PositionalEncoding.export.__func__


def ctranslate2_refusal(kind: str) -> str:
  """Why a kind CTranslate2 cannot hold is refused, and what to do instead."""
  return (f"CTranslate2 cannot hold {kind!r} positions ({get(kind).not_in_ctranslate2}); "
          "translate with transformer-translate instead")


def ctranslate2_layers(encoder: Any, decoder: Any) -> Iterator[tuple[str, int, Any]]:
  """(stack, layer number, layer spec) of every layer of CTranslate2's encoder and decoder specs:
  what a kind that acts in each self-attention layer fills in (`export`)."""
  for spec, stack in ((encoder, "encoder"), (decoder, "decoder")):
    for i, layer in enumerate(spec.layer):
      yield stack, i, layer


def register(cls: type[PositionalEncoding]) -> type[PositionalEncoding]:
  """Class decorator: makes `cls` the kind named `cls.kind`."""
  if cls.kind in _KINDS:
    raise ValueError(f"positional encoding {cls.kind!r} is registered twice")
  taken: dict[str, tuple[str, Key]] = {}
  for kind, other in _KINDS.items():
    for key in other.keys:
      taken.setdefault(key.name, (kind, key))
  for key in cls.keys:
    if key.name in taken and taken[key.name][1] != key:  # the same Key is a shared setting
      raise ValueError(f"config key model.{key.name} of {cls.kind!r} is declared otherwise by "
                       f"{taken[key.name][0]!r}: share its Key (import it) or make one of your "
                       f"own with its .variant(name=...)")
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


def all_keys() -> tuple[Key, ...]:
  """Every kind's config keys, once each (a key two kinds share is one), in registration order
  (config.base_config adds them all)."""
  keys: dict[str, Key] = {}
  for cls in _KINDS.values():
    for key in cls.keys:
      keys.setdefault(key.name, key)
  return tuple(keys.values())


def owners(name: str) -> list[str]:
  """The kinds that declare the key `name`."""
  return [kind for kind, cls in _KINDS.items() if any(key.name == name for key in cls.keys)]


def option(config: Any, name: str) -> Any:
  """The value of a kind's key `name` in a model.ModelConfig (its default where not set)."""
  values = dict(config.position_options)
  if name in values:
    return values[name]
  (key,) = [key for key in all_keys() if key.name == name]
  return key.default


def check_config(cfg: ml_collections.ConfigDict) -> None:
  """The run's kind exists, its keys are valid, no other kind's key is set, and its length limit
  reaches data.max_len: each a ConfigError naming the key."""
  kind = get(cfg.model.positional)
  for key in all_keys():
    key.check("model", cfg.model.get(key.name, key.default))
  mine = {key.name for key in kind.keys}
  for key in all_keys():
    if key.name not in mine and key.name in cfg.model and cfg.model[key.name] != key.default:
      others = owners(key.name)
      raise ConfigError(
          f"config.model.{key.name} is a hyper-parameter of positional="
          f"{' or '.join(map(repr, others))}, but this run's positional is {kind.kind!r}; drop "
          f"the override or set --config.model.positional={others[0]}")
  kind.check(cfg)
  longest = kind.longest(ModelConfig.from_config(cfg.model, cfg.data.vocab_size))
  if longest is not None and longest < cfg.data.max_len:
    raise ConfigError(f"{kind.kind!r} positions reach {longest} positions (config.model.max_len), "
                      f"below config.data.max_len ({cfg.data.max_len}); raise "
                      f"config.model.max_len to at least {cfg.data.max_len}")
