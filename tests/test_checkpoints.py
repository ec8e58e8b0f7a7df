"""Orbax round trips, the run's config record, and clear errors for missing or mismatched checkpoints."""

import json

import jax
import numpy as np
import pytest
from helpers import init_params, tiny_model_config

from transformer import partitioning
from transformer.config import ConfigError, base_config
from transformer.model.transformer import Transformer
from transformer.training import checkpoints
from transformer.training.step import TrainState, abstract_train_state, make_optimizer


def make_state(d_model=16, seed=0):
  cfg = base_config()
  cfg.model.d_model = d_model
  model = Transformer(tiny_model_config(d_model=d_model))
  state = TrainState.create(apply_fn=model.apply, params=init_params(model, seed),
                            tx=make_optimizer(cfg))
  return cfg, model, state


def test_save_restore_round_trip(tmp_path):
  cfg, model, state = make_state()
  state = state.replace(step=state.step + 7)
  mngr = checkpoints.manager(tmp_path, keep=2)
  checkpoints.save(mngr, 7, state, {"epoch": 1, "window": 2, "batch": 3})
  mngr.wait_until_finished()
  sharding = partitioning.replicated(partitioning.data_mesh())
  reader = checkpoints.manager(tmp_path, read_only=True)
  restored, data = checkpoints.restore(reader, abstract_train_state(cfg, model, sharding),
                                      with_data=True)
  assert int(restored.step) == 7
  assert data == {"epoch": 1, "window": 2, "batch": 3}
  for a, b in zip(jax.tree.leaves(state.params) + jax.tree.leaves(state.opt_state),
                  jax.tree.leaves(restored.params) + jax.tree.leaves(restored.opt_state)):
    np.testing.assert_array_equal(a, b)


def test_keeps_the_last_n(tmp_path):
  _, _, state = make_state()
  mngr = checkpoints.manager(tmp_path, keep=2)
  for step in (1, 2, 3):
    checkpoints.save(mngr, step, state, {})
  mngr.wait_until_finished()
  assert mngr.all_steps() == [2, 3]


def test_missing_and_mismatched_checkpoints_are_clear_errors(tmp_path):
  cfg, model, state = make_state()
  sharding = partitioning.replicated(partitioning.data_mesh())
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoint in"):
    checkpoints.restore(checkpoints.manager(tmp_path, keep=2),
                        abstract_train_state(cfg, model, sharding))
  mngr = checkpoints.manager(tmp_path, keep=2)
  checkpoints.save(mngr, 3, state, {})
  mngr.wait_until_finished()
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoint for step 5.*available steps: 3"):
    checkpoints.restore(mngr, abstract_train_state(cfg, model, sharding), step=5)
  wide_cfg, wide_model, _ = make_state(d_model=32)
  with pytest.raises(checkpoints.CheckpointError, match="does not match this model"):
    checkpoints.restore(mngr, abstract_train_state(wide_cfg, wide_model, sharding))


def test_a_run_of_one_positional_kind_is_never_resumed_as_another(tmp_path):
  """Even with --allow_config_change: rotary and sinusoidal models have the same parameters, so
  the checkpoint would restore without complaint into a model that reads them differently."""
  cfg = base_config()
  checkpoints.write_run_config(tmp_path, cfg)
  cfg.model.positional = "rotary"
  with pytest.raises(ConfigError, match="holds a run with positional='sinusoidal', not 'rotary'.* "
                                        "even with --allow_config_change"):
    checkpoints.check_run_config(tmp_path, cfg, allow_changes=True)


def test_run_config_record(tmp_path):
  cfg = base_config()
  assert checkpoints.check_run_config(tmp_path, cfg) == []  # a new workdir
  checkpoints.write_run_config(tmp_path, cfg)
  assert checkpoints.load_run_config(tmp_path).model.d_model == 512
  cfg.train.steps = 5  # training longer, or with other batches, is a resume, not a different run
  cfg.data.tokens_per_batch = 100
  assert checkpoints.check_run_config(tmp_path, cfg) == []
  cfg.model.d_model = 256
  cfg.data.vocab_size = 100
  with pytest.raises(ConfigError, match=r"different config \(model.d_model: 512 -> 256, "
                                       r"data.vocab_size: 37000 -> 100\); .*--allow_config_change"):
    checkpoints.check_run_config(tmp_path, cfg)
  # Allowed, the changes are listed; the new config replaces the old, which is kept.
  assert checkpoints.check_run_config(tmp_path, cfg, allow_changes=True) == [
      "model.d_model: 512 -> 256", "data.vocab_size: 37000 -> 100"]
  checkpoints.write_run_config(tmp_path, cfg, previous_step=7)
  assert checkpoints.load_run_config(tmp_path).model.d_model == 256
  kept = json.loads((tmp_path / "config.until_step7.json").read_text())
  assert kept["model"]["d_model"] == 512 and kept["train"]["steps"] == 100_000
  with pytest.raises(checkpoints.CheckpointError, match="not a training workdir"):
    checkpoints.load_run_config(tmp_path / "elsewhere")


def test_average_of_checkpoints_is_the_arithmetic_mean(tmp_path):
  cfg, model, state = make_state()
  mngr = checkpoints.manager(tmp_path, keep=5)
  saved = {}
  for step, seed in ((1, 0), (2, 1), (3, 2), (4, 3)):
    s = state.replace(params=init_params(model, seed), step=step)
    saved[step] = s.params
    checkpoints.save(mngr, step, s, {})
  mngr.wait_until_finished()
  abstract = abstract_train_state(cfg, model, partitioning.replicated(partitioning.data_mesh()))
  steps = checkpoints.last_steps(mngr, 3)
  assert steps == [2, 3, 4]
  mean = checkpoints.average_params(mngr, abstract, steps, lambda state: state.params)
  for got, *parts in zip(jax.tree.leaves(mean), *(jax.tree.leaves(saved[s]) for s in steps)):
    np.testing.assert_allclose(got, np.mean(np.stack(parts), axis=0), rtol=1e-6, atol=1e-7)
  assert checkpoints.last_steps(mngr, 2, up_to=3) == [2, 3]
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"cannot average the last 5 checkpoints: .* has 4 \(steps 1, 2, 3, 4\)"):
    checkpoints.last_steps(mngr, 5)
  with pytest.raises(checkpoints.CheckpointError, match="has 2 up to step 2"):
    checkpoints.last_steps(mngr, 3, up_to=2)


def test_a_run_config_with_retired_keys_loads_without_them(tmp_path):
  """A workdir written before the token cache kept data.shuffle_window; it still loads."""
  stored = json.loads(base_config().to_json_best_effort())
  stored["data"]["shuffle_window"] = 200_000
  (tmp_path / checkpoints.CONFIG_FILE).write_text(json.dumps(stored))
  cfg = checkpoints.load_run_config(tmp_path)
  assert "shuffle_window" not in cfg.data and cfg.data.loader_workers == 0
  assert checkpoints.check_run_config(tmp_path, base_config()) == []
