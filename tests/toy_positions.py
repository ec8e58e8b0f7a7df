"""Toy positional encodings of each shape a kind can take, each written as a new kind's file would
be, following docs/architecture.md's "Adding one" (only `@register` is left to the tests, so the
registry the rest of the suite sees is the real one): an additive table, a bias of the scores with
a config key of its own, a rotation of queries and keys, and two written as outsiders wrote them:
KERPLE's logarithmic bias, whose two per-head parameters must stay positive, and rotary positions
on half of each head's dimensions, sharing the rotary kind's `rotary_base` key."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.positions.base import (
  Drawing,
  PositionalEncoding,
  Terms,
  integer_key,
  option,
  positive_param,
)
from transformer.model.positions.rotary import Rotary, rotate, rotation_angles
from transformer.model.positions.sinusoidal import sinusoidal_encoding

LONGEST = 7


class ScaledSinusoids(PositionalEncoding):
  """Additive: the sinusoids times a learned scalar per stack, defined up to LONGEST positions."""
  kind = "toy_scaled"

  def setup(self):
    self.scale = self.param("scale", nn.initializers.constant(3.0), ())

  def embed(self, x, positions):
    return x + self.scale * sinusoidal_encoding(positions, self.config.d_model)

  @classmethod
  def longest(cls, config):
    return LONGEST

  @classmethod
  def param_count(cls, config):
    return 2

  @classmethod
  def drawings(cls, config, params, rows):
    return {"toy": Drawing(float(params["encoder"]["positions"]["scale"])
                           * np.asarray(sinusoidal_encoding(jnp.arange(rows), config.d_model)),
                           "position", "dimension", similarity=True)}


class NearbyBias(PositionalEncoding):
  """Bias: a learned per-head weight times -min(|i - j|, toy_reach), shared by the stack's layers."""
  kind = "toy_nearby"
  keys = (integer_key("toy_reach", 3, "toy bias: offsets farther than this are penalised alike"),)

  def setup(self):
    self.weight = self.param("weight", nn.initializers.ones_init(), (self.config.num_heads,))

  def prepare(self, query_positions, key_positions, causal):
    distance = jnp.abs(query_positions[:, :, None] - key_positions[:, None, :])
    distance = jnp.minimum(distance, option(self.config, "toy_reach")).astype(jnp.float32)
    return -self.weight[None, :, None, None] * distance[:, None]

  @classmethod
  def attend(cls, module, config, query, key, prepared):
    return Terms(query, key, bias=prepared)

  @classmethod
  def param_count(cls, config):
    return 2 * config.num_heads


class SlowRotation(PositionalEncoding):
  """Rotation: queries and keys turned by position / 100 radians per pair, in every layer."""
  kind = "toy_turn"

  def prepare(self, query_positions, key_positions, causal):
    pairs = self.config.key_dim // 2
    return jnp.broadcast_to(query_positions[..., None] / 100.0, (*query_positions.shape, pairs))

  @classmethod
  def attend(cls, module, config, query, key, prepared: jax.Array):
    return Terms(rotate(query, prepared), rotate(key, prepared))


class LogBias(PositionalEncoding):
  """KERPLE's logarithmic bias (Chi et al., 2022): -r1 * log(1 + r2 |i - j|) per head, r1, r2 > 0,
  learned, shared by the stack's layers."""
  kind = "toy_kerple"

  def setup(self):
    heads = (self.config.num_heads,)
    self.r1 = positive_param(self, "r1", 1.0, heads, axes=("heads",))
    self.r2 = positive_param(self, "r2", 0.5, heads, axes=("heads",))

  def prepare(self, query_positions, key_positions, causal):
    distance = jnp.abs(query_positions[:, :, None] - key_positions[:, None, :]).astype(jnp.float32)
    return -self.r1[None, :, None, None] * jnp.log1p(self.r2[None, :, None, None] * distance[:, None])

  @classmethod
  def attend(cls, module, config, query, key, prepared):
    return Terms(query, key, bias=prepared)

  @classmethod
  def param_count(cls, config):
    return 2 * 2 * config.num_heads


class HalfRotary(PositionalEncoding):
  """Rotary positions on the first half of each head's query/key dimensions (the rest unturned),
  with the rotary kind's own `rotary_base` setting."""
  kind = "toy_half_rotary"
  keys = Rotary.keys

  def prepare(self, query_positions, key_positions, causal):
    half = self.config.key_dim // 2
    angles = rotation_angles(query_positions, half, option(self.config, "rotary_base"))
    return jnp.concatenate([angles, jnp.zeros((*angles.shape[:-1], half // 2))], axis=-1)

  @classmethod
  def attend(cls, module, config, query, key, prepared: jax.Array):
    return Terms(rotate(query, prepared), rotate(key, prepared))


TOYS = (ScaledSinusoids, NearbyBias, SlowRotation, LogBias, HalfRotary)
