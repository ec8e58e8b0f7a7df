"""Non-finite losses stop training with the evidence saved (or are skipped and counted); a broken
latest checkpoint is skipped for the one before, by training and by evaluation."""

import functools
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import init_params, random_tokens, tiny_model_config, tiny_run_config

from transformer import partitioning
from transformer.data import vocab as vocab_lib
from transformer.evaluation.evaluate import evaluate
from transformer.metrics import read_metrics
from transformer.model.transformer import ModelConfig, Transformer
from transformer.training import checkpoints
from transformer.training import nonfinite as faults
from transformer.training.step import TrainState, abstract_train_state, train_step
from transformer.training.train import train_and_evaluate


def poisoned_state(rng):
  """A state whose last LayerNorm scale is infinite: every loss is NaN."""
  model = Transformer(tiny_model_config())
  params = init_params(model)
  norm = params["decoder"]["layer_1"]["ffn_norm"]
  norm["scale"] = norm["scale"].at[0].set(jnp.inf)
  schedule = lambda count: 1e-3 / (1.0 + count)  # a schedule, so the state counts updates
  state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(schedule))
  batch = {"src": random_tokens(rng, 2, 5, 24), "tgt": random_tokens(rng, 2, 6, 24)}
  return model, state, batch


def assert_same_tree(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_non_finite_update_is_never_applied(rng):
  model, state, batch = poisoned_state(rng)
  key = jax.random.key(0)
  step = jax.jit(functools.partial(train_step, smoothing=0.1))
  # 'stop': nothing changes, not even the step; the health flag goes false ...
  stopped, sums = step(state, batch, key, jnp.asarray(True))
  assert float(sums["finite"]) == 0 and not bool(sums["healthy"])
  assert int(stopped.step) == 0
  assert_same_tree(stopped.params, state.params)
  assert_same_tree(stopped.opt_state, state.opt_state)
  # ... and a false flag makes a later, finite step a no-op as well.
  healthy_state = state.replace(params=init_params(model))
  after, sums = step(healthy_state, batch, key, jnp.asarray(False))
  assert float(sums["finite"]) == 1 and not bool(sums["healthy"])
  assert_same_tree(after.params, healthy_state.params) and int(after.step) == 0
  applied, sums = step(healthy_state, batch, key, jnp.asarray(True))
  assert bool(sums["healthy"]) and int(applied.step) == 1
  assert not np.array_equal(applied.params["decoder"]["layer_1"]["ffn_norm"]["scale"],
                            healthy_state.params["decoder"]["layer_1"]["ffn_norm"]["scale"])
  # 'skip': the batch is passed over (the step counts), the parameters and Adam's moments stay, and
  # the optimizer's counters follow the step, so the learning rate does not fall behind the schedule.
  skipped, sums = jax.jit(functools.partial(train_step, smoothing=0.1, skip_nonfinite=True))(
      state, batch, key)
  assert float(sums["finite"]) == 0 and bool(sums["healthy"])
  assert int(skipped.step) == 1
  assert_same_tree(skipped.params, state.params)
  adam, schedule = skipped.opt_state[0], skipped.opt_state[-1]
  assert_same_tree((adam.mu, adam.nu), (state.opt_state[0].mu, state.opt_state[0].nu))
  assert int(adam.count) == int(schedule.count) == int(skipped.step) == 1


def diverging_config(tmp_path, **train):
  """A learning rate of 1e30: the first update is finite, the parameters then overflow."""
  cfg = tiny_run_config(tmp_path)
  cfg.data.batching, cfg.data.pack_length = "pack", 40
  cfg.train.update(dict(dict(learning_rate=1e30, steps=8, log_every=4, eval_every=100,
                             checkpoint_every=100, keep_checkpoints=10), **train))
  return cfg


def test_a_non_finite_loss_stops_training_with_the_last_good_state_and_the_batch(tmp_path):
  cfg = diverging_config(tmp_path)
  workdir = tmp_path / "run"
  with pytest.raises(faults.NonFiniteError) as error:
    train_and_evaluate(cfg, str(workdir))
  message = str(error.value)
  bad = int(message.split("non-finite loss or gradient at step ")[1].split(" ")[0])
  assert bad >= 2  # step 1 starts from finite parameters
  assert (f"the last good state is the checkpoint at step {bad - 1} in {workdir / 'checkpoints'} "
          f"and the batch is in {workdir / 'nonfinite' / f'step{bad}.npz'}") in message
  assert message.endswith("or set train.on_nonfinite=skip to skip such updates")

  # The checkpoint holds the finite state from before the bad step, and resumes at that batch.
  mngr = checkpoints.manager(workdir, read_only=True)
  assert mngr.all_steps() == [bad - 1]
  restored = mngr.restore(bad - 1)
  assert int(restored.state["step"]) == bad - 1
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(restored.state["params"]))
  assert restored.data["batch"] == bad - 1  # the pipeline position before the bad batch

  # The batch as it was fed, and its sentences.
  arrays = np.load(workdir / "nonfinite" / f"step{bad}.npz")
  assert {"src", "tgt", "src_segments", "tgt_segments"} <= set(arrays.files)
  assert arrays["src"].shape == (12, 40)
  vocab = vocab_lib.load_vocab(workdir / "vocab.model")
  rows = [json.loads(line) for line in (workdir / "nonfinite" / f"step{bad}.jsonl").read_text()
          .splitlines()]
  assert len(rows) == int((arrays["src"] != 0).any(axis=1).sum())  # one per non-padding row
  row, sentence = rows[0]["row"], rows[0]["source"][0]
  ids = vocab.encode(sentence)
  assert arrays["src"][row][:len(ids)].tolist() == ids  # the row's first pair, detokenized
  assert read_metrics(workdir, "nonfinite")[0]["step"] == bad


def test_skipped_non_finite_updates_are_counted(tmp_path):
  cfg = diverging_config(tmp_path, on_nonfinite="skip", checkpoint_every=1)
  workdir = tmp_path / "run"
  summary = train_and_evaluate(cfg, str(workdir))
  assert summary["skipped_updates"] == 7  # every update after the first
  mngr = checkpoints.manager(workdir, read_only=True)
  assert_same_tree(mngr.restore(8).state["params"], mngr.restore(1).state["params"])
  assert [r["skipped_updates"] for r in read_metrics(workdir, "train")] == [3, 7]


# ----------------------------------------------------------------------------- broken checkpoints

def damage(checkpoint_dir):
  """Truncates the largest array file of a checkpoint, as a crash of the disk or the copy would."""
  files = [os.path.join(root, f) for root, _, names in os.walk(checkpoint_dir / "state")
           for f in names]
  with open(max(files, key=os.path.getsize), "r+b") as f:
    f.truncate(100)


def test_a_broken_latest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
  cfg = tiny_run_config(tmp_path)  # checkpoints at steps 3 and 6
  cfg.data.batching, cfg.data.pack_length = "pack", 40  # one batch shape: one compilation
  workdir = tmp_path / "run"
  train_and_evaluate(cfg, str(workdir))
  damage(workdir / "checkpoints" / "6")
  caplog.set_level(logging.WARNING, logger="transformer")

  report = evaluate(str(workdir), beam_size=1)
  assert report["checkpoint_step"] == 3
  assert f"checkpoint 6 in {workdir / 'checkpoints'} cannot be restored" in caplog.text
  assert "restored checkpoint 3 instead of the broken step 6" in caplog.text

  caplog.clear()
  cfg.train.steps = 9
  summary = train_and_evaluate(cfg, str(workdir))
  assert summary["resumed_from"] == 3
  assert "checkpoint 6 in" in caplog.text and "Moved the broken checkpoint(s) 6" in caplog.text
  assert (workdir / "broken_checkpoints" / "6" / "state").is_dir()  # kept for a post-mortem
  assert checkpoints.manager(workdir, read_only=True).all_steps() == [6, 9]  # 6 written anew

  # A missing item is as broken as a damaged file.
  shutil.rmtree(workdir / "checkpoints" / "9" / "data")
  caplog.clear()
  model = Transformer(ModelConfig.from_config(cfg.model, cfg.data.vocab_size))
  abstract = abstract_train_state(cfg, model, partitioning.replicated(partitioning.data_mesh()))
  state, data = checkpoints.restore(checkpoints.manager(workdir, read_only=True), abstract,
                                    with_data=True)
  assert int(state.step) == 6 and "checkpoint 9 in" in caplog.text
