"""Positional encodings behind one registry: a toy kind of each shape (tests/toy_positions.py:
additive, a bias of the scores, a rotation), registered alone, is used by the config, the model,
training, decoding, the export and the counts; an unknown kind is an error everywhere."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import init_params, random_tokens, tiny_model_config
from toy_positions import LONGEST, TOYS, NearbyBias, ScaledSinusoids

from transformer.config import base_config, validate
from transformer.decoding import Greedy, decode, textbook, translator
from transformer.errors import ConfigError
from transformer.evaluation import export
from transformer.model import positions
from transformer.model.positions import base as registry
from transformer.model.size import analytic_param_count, param_counts
from transformer.model.transformer import Transformer
from transformer.training.step import TrainState, train_step


@pytest.fixture(params=TOYS, ids=lambda toy: toy.kind)
def toy(request, monkeypatch):
  monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
  registry.register(request.param)
  model = Transformer(tiny_model_config(positional=request.param.kind))
  return model, init_params(model)


def test_the_model_uses_the_registered_kind_and_counts_its_parameters(toy):
  model, params = toy
  count = sum(leaf.size for leaf in jax.tree.leaves(params))
  assert analytic_param_count(model.config) == count == sum(
      v for k, v in param_counts(model.config).items() if "/" not in k)
  src = random_tokens(np.random.default_rng(0), 2, 5, 24)
  plain = Transformer(tiny_model_config(positional="none"))
  assert not np.allclose(model.apply({"params": params}, src, method=model.encode),
                         plain.apply({"params": init_params(plain)}, src, method=plain.encode))


def test_training_updates_the_kinds_parameters(toy):
  model, params = toy
  state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1.0))
  rng = np.random.default_rng(1)
  batch = {"src": random_tokens(rng, 3, 5, 24), "tgt": random_tokens(rng, 3, 6, 24)}
  new_state, _ = train_step(state, batch, jax.random.key(0), smoothing=0.1)
  for stack in ("encoder", "decoder"):
    for old, new in zip(jax.tree.leaves(params[stack].get("positions", {})),
                        jax.tree.leaves(new_state.params[stack].get("positions", {}))):
      assert not np.allclose(old, new)


@pytest.mark.slow  # every real kind's cached search runs in test_position_kinds.py
def test_decoding_uses_the_kind_and_its_length_limit(toy):
  model, params = toy
  longest = positions.get(model.config.positional).longest(model.config)
  settings = translator.SearchSettings(max_extra_len=50)
  assert translator.decode_length([model], 5, settings) == (longest or 55)
  src = jnp.asarray(random_tokens(np.random.default_rng(2), 2, 5, 24))
  limits = np.array([LONGEST, 4])
  result = decode(Greedy(), model, params, src, jnp.asarray(limits), LONGEST)
  for row in range(2):  # the cached search = full forward passes of the model with the toy kind
    seq, _ = textbook.greedy_search(model, params, np.asarray(src[row]), int(limits[row]))
    assert tuple(int(t) for t in np.asarray(result.tokens[row, 0]) if t) == seq


def test_the_config_holds_the_kinds_keys_and_checks_them(toy):
  model, _ = toy
  kind = positions.get(model.config.positional)
  cfg = base_config()
  cfg.model.positional = kind.kind
  cfg.model.max_len = cfg.data.max_len = LONGEST
  validate(cfg)
  if kind is NearbyBias:
    assert cfg.model.toy_reach == 3
    cfg.model.toy_reach = 0
    with pytest.raises(ConfigError, match="config.model.toy_reach must be an integer >= 1, got 0"):
      validate(cfg)
  else:
    cfg.model.relative_clip = 5
    with pytest.raises(ConfigError, match="config.model.relative_clip is a hyper-parameter of "
                                          f"positional='relative', but this run's positional is "
                                          f"'{kind.kind}'"):
      validate(cfg)


def test_a_kinds_length_limit_below_max_len_is_an_error(monkeypatch):
  monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
  registry.register(ScaledSinusoids)
  cfg = base_config()
  cfg.model.positional = ScaledSinusoids.kind
  with pytest.raises(ConfigError, match=f"'toy_scaled' positions reach {LONGEST} positions .*below "
                                        "config.data.max_len \\(256\\)"):
    validate(cfg)


def test_the_export_refuses_a_kind_it_cannot_hold(toy):
  model, params = toy
  pytest.importorskip("ctranslate2")
  with pytest.raises(ConfigError, match=f"CTranslate2 cannot hold '{model.config.positional}'"):
    export.ctranslate2_spec(model.config, params, [f"p{i}" for i in range(24)], 5)


def test_an_unknown_kind_is_an_error_everywhere():
  cfg = base_config()
  cfg.model.positional = "fourier"
  listed = ", ".join(repr(kind) for kind in positions.kinds())  # the registry's, in its order
  with pytest.raises(ConfigError, match=f"config.model.positional must be one of {listed}; "
                                        "got 'fourier'"):
    validate(cfg)
  model = Transformer(tiny_model_config(positional="fourier"))
  with pytest.raises(ConfigError, match="got 'fourier'"):
    init_params(model)
  with pytest.raises(ConfigError, match="got 'fourier'"):
    translator.decode_length([model], 5, translator.SearchSettings())


def test_kinds_share_a_key_by_declaring_the_same_one_and_are_refused_one_declared_otherwise(
    monkeypatch):
  monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
  (clip,) = registry.get("relative").keys
  sharing = type("Sharing", (positions.PositionalEncoding,), {"kind": "sharing", "keys": (clip,)})
  registry.register(sharing)  # the same Key: one setting of both kinds
  assert [k.name for k in positions.all_keys()].count("relative_clip") == 1
  assert registry.owners("relative_clip") == ["relative", "sharing"]
  cfg = base_config()
  cfg.model.positional, cfg.model.relative_clip = "sharing", 5
  validate(cfg)  # its own key now: no error
  cfg.model.positional = "t5"
  with pytest.raises(ConfigError, match="config.model.relative_clip is a hyper-parameter of "
                                        "positional='relative' or 'sharing', but this run's "
                                        "positional is 't5'"):
    validate(cfg)
  other = type("Clash", (positions.PositionalEncoding,), {
      "kind": "clash", "keys": (positions.Key("relative_clip", 4, "another clip"),)})
  with pytest.raises(ValueError, match="config key model.relative_clip of 'clash' is declared "
                                       "otherwise by 'relative': share its Key"):
    registry.register(other)
  variant = clip.variant("clash_clip", default=4)
  assert (variant.name, variant.default, variant.help) == ("clash_clip", 4, clip.help)
  with pytest.raises(ConfigError, match="config.model.clash_clip must be an integer >= 1, got 0"):
    variant.check("model", 0)


def test_a_positive_parameter_starts_at_its_value_and_stays_positive(rng):
  class Scale(nn.Module):
    @nn.compact
    def __call__(self):
      return positions.positive_param(self, "rate", 0.5, (3,), axes=("heads",))
  params = Scale().init(jax.random.key(0))["params"]
  np.testing.assert_allclose(Scale().apply({"params": params}), [0.5] * 3, rtol=1e-6)
  # A step far past zero in the stored value still gives a positive, finite rate, and a gradient.
  pushed = jax.tree.map(lambda x: x - 40.0, nn.unbox(params))
  value = Scale().apply({"params": pushed})
  assert bool((value > 0).all() and jnp.isfinite(value).all())
  grad = jax.grad(lambda p: Scale().apply({"params": p}).sum())(nn.unbox(params))
  assert bool((jax.tree.leaves(grad)[0] > 0).all())
