"""Schedule, loss and train step against hand computations; the data-parallel step on 8 devices."""

import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import init_params, random_tokens, tiny_model_config
from transformer.config import base_config
from transformer.model import Transformer
from transformer.train import (TrainState, learning_rate_schedule, loss_sums, make_optimizer,
                               train_step)


@pytest.mark.parametrize("step,expected", [
    (1, 512 ** -0.5 * 1 * 4000 ** -1.5),
    (2000, 512 ** -0.5 * 2000 * 4000 ** -1.5),
    (4000, 512 ** -0.5 * 4000 ** -0.5),
    (16000, 512 ** -0.5 * 16000 ** -0.5),
])
def test_learning_rate_schedule(step, expected):
  schedule = learning_rate_schedule(512, 4000)
  assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)  # optax counts from 0


def test_peak_learning_rate_is_at_warmup():
  schedule = learning_rate_schedule(512, 4000, scale=2.0)
  counts = list(range(3900, 4100))
  rates = [float(schedule(c)) for c in counts]
  assert counts[int(np.argmax(rates))] == 3999  # update count 3999 is step 4000, 1-based
  assert max(rates) == pytest.approx(2.0 * 512 ** -0.5 * 4000 ** -0.5, rel=1e-5)


def test_label_smoothed_loss_against_hand_computation():
  logits = np.array([[[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0], [9.0, 9.0, 9.0, 9.0]]])
  targets = np.array([[2, 3, 0]])  # the last position is padding
  smoothing = 0.1
  expected_loss, expected_nll = 0.0, 0.0
  for t in range(2):
    p = np.exp(logits[0, t]) / np.exp(logits[0, t]).sum()
    q = np.full(4, smoothing / 3)
    q[targets[0, t]] = 1 - smoothing
    expected_loss += -(q * np.log(p)).sum()
    expected_nll += -math.log(p[targets[0, t]])
  sums = loss_sums(jnp.asarray(logits), jnp.asarray(targets), smoothing)
  assert float(sums["loss"]) == pytest.approx(expected_loss, rel=1e-6)
  assert float(sums["nll"]) == pytest.approx(expected_nll, rel=1e-6)
  assert float(sums["tokens"]) == 2
  assert float(sums["correct"]) == 0  # argmaxes are 3 and 2; targets 2 and 3


def test_train_step_is_one_adam_update_on_the_mean_token_loss(rng):
  cfg = base_config()
  cfg.model.d_model = 16
  model = Transformer(tiny_model_config())
  params = init_params(model)
  state = TrainState.create(apply_fn=model.apply, params=params, tx=make_optimizer(cfg))
  batch = {"src": random_tokens(rng, 3, 5, 24, lengths=[5, 3, 2]),
           "tgt": random_tokens(rng, 3, 6, 24, lengths=[6, 4, 1])}
  new_state, sums = train_step(state, batch, jax.random.PRNGKey(0), smoothing=0.1)
  assert int(new_state.step) == 1
  assert float(sums["tokens"]) == 11

  def loss(p):  # the same objective written directly
    from transformer.model import shift_right
    s = loss_sums(model.apply({"params": p}, batch["src"], shift_right(batch["tgt"])), batch["tgt"], 0.1)
    return s["loss"] / s["tokens"]
  grads = jax.grad(loss)(params)
  updates, _ = make_optimizer(cfg).update(grads, make_optimizer(cfg).init(params), params)
  expected = optax.apply_updates(params, updates)
  for got, want in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, atol=1e-6)


EIGHT_DEVICES = textwrap.dedent("""
    import functools, json, jax, numpy as np
    from jax.sharding import Mesh
    from conftest import init_params, random_tokens, tiny_model_config
    from transformer import partitioning
    from transformer.config import base_config
    from transformer.model import Transformer
    from transformer.train import TrainState, make_optimizer, train_step
    assert jax.device_count() == 8
    model = Transformer(tiny_model_config(dropout=0.1))
    cfg = base_config(); cfg.model.d_model = 16
    rng = np.random.default_rng(0)
    batch = {"src": random_tokens(rng, 8, 6, 24, lengths=[6, 5, 4, 3, 6, 2, 5, 1]),
             "tgt": random_tokens(rng, 8, 7, 24, lengths=[7, 3, 4, 5, 2, 6, 1, 7])}
    results = {}
    for name, devices in (("one", jax.devices()[:1]), ("eight", jax.devices())):
      mesh = Mesh(np.array(devices), ("data",))
      rep = partitioning.replicated(mesh)
      state = jax.device_put(TrainState.create(apply_fn=model.apply, params=init_params(model),
                                               tx=make_optimizer(cfg)), rep)
      step = jax.jit(functools.partial(train_step, smoothing=0.1), out_shardings=(rep, rep))
      sharded = partitioning.shard_batch(batch, mesh)
      assert len(sharded["src"].sharding.device_set) == len(devices)
      for _ in range(3):
        state, sums = step(state, sharded, jax.random.PRNGKey(1))
      results[name] = (float(sums["loss"]), jax.tree.leaves(state.params))
    loss_diff = abs(results["one"][0] - results["eight"][0])
    param_diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(results["one"][1], results["eight"][1]))
    print(json.dumps({"loss_diff": loss_diff, "param_diff": param_diff, "loss": results["one"][0]}))
""")


def test_data_parallel_step_on_eight_devices_equals_one_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  tests_dir = os.path.dirname(__file__)
  env["PYTHONPATH"] = os.pathsep.join([tests_dir, env.get("PYTHONPATH", "")])
  out = subprocess.run([sys.executable, "-c", EIGHT_DEVICES], env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["loss_diff"] < 1e-4 * result["loss"]
  assert result["param_diff"] < 1e-5
