"""Three toy positional encodings, one of each shape a kind can take, each written as a new kind's
file would be (only `@register` is left to the tests, so the registry the rest of the suite sees is
the real one): an additive table, a bias of the scores with a config key of its own, and a rotation
of queries and keys."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.positions.base import Drawing, PositionalEncoding, Terms, integer_key, option
from transformer.model.positions.rotary import rotate
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


TOYS = (ScaledSinusoids, NearbyBias, SlowRotation)
