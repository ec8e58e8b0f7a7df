"""The mesh, the logical rules and every sharding strategy, on 8 fake CPU devices.

Each strategy must train exactly like one device (to float tolerance) and really shard what the rules
say: batch rows over data x fsdp, parameters and Adam moments along d_model over fsdp and along
heads / d_ff / vocabulary over tensor.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from transformer import partitioning
from transformer.config import ConfigError, base_config, validate


def mesh_config(data, fsdp, tensor):
  cfg = base_config()
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = data, fsdp, tensor
  return cfg


@pytest.mark.parametrize("axes, devices, expected", [
    ((-1, 1, 1), 8, (8, 1, 1)),
    ((1, -1, 1), 8, (1, 8, 1)),
    ((-1, 2, 2), 8, (2, 2, 2)),
    ((2, 1, -1), 8, (2, 1, 4)),
    ((-1, 1, 1), 1, (1, 1, 1)),
])
def test_mesh_shape_gives_the_rest_to_the_minus_one_axis(axes, devices, expected):
  assert partitioning.mesh_shape(mesh_config(*axes).mesh, devices) == expected


def test_mesh_shape_errors_name_the_devices():
  with pytest.raises(ConfigError, match="8 is not divisible by 3"):
    partitioning.mesh_shape(mesh_config(-1, 3, 1).mesh, 8)
  with pytest.raises(ConfigError, match=r"2 x 2 x 1 = 4, but there are 8 devices"):
    partitioning.mesh_shape(mesh_config(2, 2, 1).mesh, 8)
  with pytest.raises(ConfigError, match="only one of config.mesh"):
    validate(mesh_config(-1, -1, 1))
  with pytest.raises(ConfigError, match="config.mesh.tensor must be a positive number"):
    validate(mesh_config(-1, 1, 0))


def test_sharded_dimensions_must_divide():
  cfg = base_config()  # d_model 512, 8 heads, d_ff 2048
  partitioning.check_divisible(cfg, (1, 8, 8), vocab_size=37000)
  with pytest.raises(ConfigError, match=r"model.num_heads \(8\) must be divisible by config.mesh.tensor \(3\)"):
    partitioning.check_divisible(cfg, (1, 1, 3), vocab_size=37000)
  with pytest.raises(ConfigError, match=r"model.d_model \(512\) must be divisible by config.mesh.fsdp \(3\)"):
    partitioning.check_divisible(cfg, (1, 3, 1), vocab_size=37000)
  with pytest.raises(ConfigError, match=r"vocabulary size \(37001\)"):
    partitioning.check_divisible(cfg, (1, 1, 2), vocab_size=37001)


STRATEGIES = textwrap.dedent("""
    import json, sys, jax, numpy as np
    from helpers import random_tokens
    from transformer import partitioning
    from transformer.config import base_config
    from transformer.model.transformer import ModelConfig, Transformer
    from transformer.training.step import jit_train_fns
    assert jax.device_count() == 8
    cfg = base_config()
    cfg.model.num_layers, cfg.model.d_model, cfg.model.d_ff, cfg.model.num_heads = 1, 16, 32, 4
    cfg.model.dropout = 0.1
    cfg.train.grad_accum_steps = 2
    rng = np.random.default_rng(0)
    batch = {"src": random_tokens(rng, 16, 6, 32, lengths=[6, 5, 4, 3, 6, 2, 5, 1] * 2),
             "tgt": random_tokens(rng, 16, 7, 32, lengths=[7, 3, 4, 5, 2, 6, 1, 7] * 2)}

    def shard(x):  # the shape of one device's piece
      return list(x.addressable_shards[0].data.shape)

    out = {}
    for shape in [(1, 1, 1)] + [tuple(s) for s in json.loads(sys.argv[1])]:
      c = cfg.copy_and_resolve_references()
      c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
      devices = jax.devices()[:int(np.prod(shape))]
      mesh = partitioning.make_mesh(c, 32, devices)
      fns = jit_train_fns(c, Transformer(ModelConfig.from_config(c.model, 32)), mesh)
      state = fns.init(jax.random.key(0))
      sharded_batch = partitioning.shard_batch(batch, mesh)
      for _ in range(3):
        state, sums = fns.step(state, sharded_batch, jax.random.key(1))
      layer = state.params["encoder"]["layer_0"]
      mu = state.opt_state[0].mu["encoder"]["layer_0"]
      out[str(shape)] = {
          "loss": float(sums["loss"] / sums["tokens"]),
          "params": [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(state.params)],
          "shards": {"embed": shard(state.params["embed"]["embedding"]),
                     "query": shard(layer["self_attention"]["query"]["kernel"]),
                     "out": shard(layer["self_attention"]["out"]["kernel"]),
                     "wi": shard(layer["ffn"]["wi"]["kernel"]),
                     "wo": shard(layer["ffn"]["wo"]["kernel"]),
                     "norm": shard(layer["ffn_norm"]["scale"]),
                     "mu_wi": shard(mu["ffn"]["wi"]["kernel"]),
                     "batch": shard(sharded_batch["src"])},
          "devices": len(state.params["embed"]["embedding"].sharding.device_set)}
    cfg.train.rdrop_alpha = 5.0  # R-Drop's two passes: each row twice, side by side
    for shape in [(1, 1, 1), (2, 2, 2)] if sys.argv[2] == "rdrop" else []:  # every axis at once
      c = cfg.copy_and_resolve_references()
      c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
      mesh = partitioning.make_mesh(c, 32, jax.devices()[:int(np.prod(shape))])
      fns = jit_train_fns(c, Transformer(ModelConfig.from_config(c.model, 32)), mesh)
      state = fns.init(jax.random.key(0))
      for _ in range(3):
        state, sums = fns.step(state, partitioning.shard_batch(batch, mesh), jax.random.key(1))
      out["rdrop " + str(shape)] = {
          "loss": float(sums["loss"] / sums["tokens"]), "kl": float(sums["rdrop_kl"]),
          "params": [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(state.params)]}
    print(json.dumps(out))
""")


def train_strategies(shapes, rdrop):
  """One device and each mesh of `shapes` trained 3 steps on 8 fake devices (R-Drop's too, on one
  device and (2, 2, 2), if `rdrop`), in a process of its own: shape -> losses, parameters, shards."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
  out = subprocess.run([sys.executable, "-c", STRATEGIES, json.dumps(shapes),
                        "rdrop" if rdrop else ""],
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def strategies():
  """(2, 2, 2) shards every axis at once: the fast suite's strategy."""
  return train_strategies([(2, 2, 2)], rdrop=True)


@pytest.fixture(scope="module")
def one_axis_strategies():
  """Each axis alone, over all 8 devices or with another (slow: three more compilations)."""
  return train_strategies([(8, 1, 1), (1, 8, 1), (2, 1, 4)], rdrop=False)


def strategy(request, shape):
  return request.getfixturevalue("strategies" if shape == "(2, 2, 2)" else "one_axis_strategies")


ONE_AXIS = [pytest.param(shape, marks=pytest.mark.slow)
            for shape in ["(8, 1, 1)", "(1, 8, 1)", "(2, 1, 4)"]]


@pytest.mark.parametrize("shape", [*ONE_AXIS, "(2, 2, 2)"])
def test_every_strategy_trains_like_one_device(request, shape):
  trained = strategy(request, shape)
  one, many = trained["(1, 1, 1)"], trained[shape]
  assert many["devices"] == 8
  assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
  for a, b in zip(one["params"], many["params"], strict=True):
    np.testing.assert_allclose(b, a, atol=2e-5)


def test_rdrop_trains_on_every_axis_like_one_device(strategies):
  one, many = strategies["rdrop (1, 1, 1)"], strategies["rdrop (2, 2, 2)"]
  assert one["kl"] > 0
  assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
  assert many["kl"] == pytest.approx(one["kl"], rel=1e-4)
  for a, b in zip(one["params"], many["params"], strict=True):
    np.testing.assert_allclose(b, a, atol=2e-5)


# d_model 16, 4 heads of 4, d_ff 32, vocabulary 32; 16 rows of 6 source tokens.
EXPECTED_SHARDS = {
    "(8, 1, 1)": {"embed": [32, 16], "query": [16, 4, 4], "out": [4, 4, 16], "wi": [16, 32],
                  "wo": [32, 16], "norm": [16], "mu_wi": [16, 32], "batch": [2, 6]},
    "(1, 8, 1)": {"embed": [32, 2], "query": [2, 4, 4], "out": [4, 4, 2], "wi": [2, 32],
                  "wo": [32, 2], "norm": [2], "mu_wi": [2, 32], "batch": [2, 6]},
    "(2, 1, 4)": {"embed": [8, 16], "query": [16, 1, 4], "out": [1, 4, 16], "wi": [16, 8],
                  "wo": [8, 16], "norm": [16], "mu_wi": [16, 8], "batch": [8, 6]},
    "(2, 2, 2)": {"embed": [16, 8], "query": [8, 2, 4], "out": [2, 4, 8], "wi": [8, 16],
                  "wo": [16, 8], "norm": [8], "mu_wi": [8, 16], "batch": [4, 6]},
}


@pytest.mark.parametrize("shape", [*ONE_AXIS, "(2, 2, 2)"])
def test_parameters_and_adam_state_are_sharded_as_the_rules_say(request, shape):
  assert strategy(request, shape)[shape]["shards"] == EXPECTED_SHARDS[shape]
