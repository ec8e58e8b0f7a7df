"""Positional encodings behind one registry: a kind registered here (a toy) is used by the model,
training, decoding, the export and the parameter count, and an unknown kind is an error everywhere."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer.config import base_config, validate
from transformer.decoding import Greedy, decode, textbook, translator
from transformer.errors import ConfigError
from transformer.evaluation import export
from transformer.model import positions
from transformer.model.positions import base as registry
from transformer.model.positions.sinusoidal import sinusoidal_encoding
from transformer.model.size import analytic_param_count, param_counts
from transformer.model.transformer import Transformer
from transformer.training.step import TrainState, train_step

LONGEST = 7


class ScaledSinusoids(positions.PositionalEncoding):
  """The sinusoids times a learned scalar per stack, defined up to LONGEST positions."""
  kind = "toy_scaled"

  def encoding(self, at: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.constant(3.0), ())
    return scale * sinusoidal_encoding(at, self.config.d_model)

  @classmethod
  def table(cls, config, stack_params, rows):
    return float(stack_params["positions"]["scale"]) * np.asarray(
        sinusoidal_encoding(jnp.arange(rows), config.d_model))

  @classmethod
  def longest(cls, config):
    return LONGEST

  @classmethod
  def param_count(cls, config):
    return 1


@pytest.fixture
def toy(monkeypatch):
  monkeypatch.setitem(registry._KINDS, ScaledSinusoids.kind, ScaledSinusoids)
  model = Transformer(tiny_model_config(positional=ScaledSinusoids.kind))
  return model, init_params(model)


def test_the_model_adds_the_registered_kind(toy):
  model, params = toy
  assert float(params["encoder"]["positions"]["scale"]) == 3.0
  count = sum(leaf.size for leaf in jax.tree.leaves(params))
  assert analytic_param_count(model.config) == count == sum(
      v for k, v in param_counts(model.config).items() if "/" not in k)
  doubled = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 2 if "scale" in jax.tree_util.keystr(path) else x, params)
  src = random_tokens(np.random.default_rng(0), 2, 5, 24)
  assert not np.allclose(model.apply({"params": params}, src, method=model.encode),
                         model.apply({"params": doubled}, src, method=model.encode))


def test_training_updates_the_kinds_parameters(toy):
  model, params = toy
  state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
  rng = np.random.default_rng(1)
  batch = {"src": random_tokens(rng, 3, 5, 24), "tgt": random_tokens(rng, 3, 6, 24)}
  new_state, _ = train_step(state, batch, jax.random.key(0), smoothing=0.1)
  for stack in ("encoder", "decoder"):
    assert float(new_state.params[stack]["positions"]["scale"]) != 3.0


def test_decoding_uses_the_kind_and_its_length_limit(toy):
  model, params = toy
  settings = translator.SearchSettings(max_extra_len=50)
  assert translator.decode_length([model], 5, settings) == LONGEST
  assert textbook.padded_shape(model, 6, 1)[1] == LONGEST
  src = jnp.asarray(random_tokens(np.random.default_rng(2), 2, 5, 24))
  limits = np.array([LONGEST, 4])
  result = decode(Greedy(), model, params, src, jnp.asarray(limits), LONGEST)
  for row in range(2):  # the cached search = full forward passes of the model with the toy kind
    seq, _ = textbook.greedy_search(model, params, np.asarray(src[row]), int(limits[row]))
    assert tuple(int(t) for t in np.asarray(result.tokens[row, 0]) if t) == seq


def test_export_writes_the_kinds_table_and_respects_its_length(toy):
  model, params = toy
  table = export.position_table(model.config, params["decoder"], 5)
  np.testing.assert_allclose(table, 3.0 * np.asarray(sinusoidal_encoding(jnp.arange(5), 16)),
                             rtol=1e-6)


def test_an_unknown_kind_is_an_error_everywhere():
  cfg = base_config()
  cfg.model.positional = "rotary"
  with pytest.raises(ConfigError, match="config.model.positional must be one of 'sinusoidal', "
                                        "'learned'; got 'rotary'"):
    validate(cfg)
  model = Transformer(tiny_model_config(positional="rotary"))
  with pytest.raises(ConfigError, match="got 'rotary'"):
    init_params(model)
  with pytest.raises(ConfigError, match="got 'rotary'"):
    translator.decode_length([model], 5, translator.SearchSettings())


def test_every_file_in_the_folder_is_a_registered_kind():
  assert set(positions.kinds()) >= {"sinusoidal", "learned"}
