"""The steps compiled before the loop for every batch shape the data fills (training/compiled.py):
the same training as jit's compile-when-met, one program per shape, none compiled inside the loop,
a shape missing from the set compiled when met, and a resumed run with other shapes."""

import contextlib
import json
import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_run_config

from transformer.training import checkpoints, compiled
from transformer.training.train import train_and_evaluate
from transformer.training.workdir import load_run


def summary(workdir):
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r for r in records if r["event"] == "summary"][-1], [
      (r["step"], r["loss"]) for r in records if r["event"] == "train"]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
  """The tiny bucketed run trained the default way (steps compiled ahead, batches placed ahead by
  the feed's thread) and the old way (jit's compile-when-met, each batch placed when its step
  comes): (config, workdir) of each."""
  tmp = tmp_path_factory.mktemp("compile_ahead")
  runs = {}
  for ahead in (True, False):
    cfg = tiny_run_config(tmp)
    cfg.train.steps, cfg.train.compile_ahead = 12, ahead
    cfg.train.device_prefetch = 2 if ahead else 0
    train_and_evaluate(cfg, str(tmp / f"ahead_{ahead}"))
    runs[ahead] = cfg, tmp / f"ahead_{ahead}"
  return runs


def test_compiling_and_placing_ahead_train_bit_identically_to_the_old_loop(both_ways):
  ahead, when_met = (load_run(both_ways[k][1]) for k in (True, False))
  assert ahead.steps == when_met.steps == [12]
  for a, b in zip(jax.tree.leaves(ahead.raw_params), jax.tree.leaves(when_met.raw_params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert summary(both_ways[True][1])[1] == summary(both_ways[False][1])[1]  # every logged loss


def test_one_program_a_shape_the_data_fills_and_none_compiled_in_the_loop(both_ways):
  from transformer.data import pipeline
  cfg, workdir = both_ways[True]
  _, train, eval_batches = pipeline.training_inputs(cfg, workdir, num_devices=1)
  shapes = train.batch_shapes()
  assert len(shapes) >= 3  # the tiny corpus fills several length buckets
  eval_shapes = {b["src"].shape for b in eval_batches}
  ahead, _ = summary(workdir)
  assert ahead["shapes_compiled"] == len(shapes) + len(eval_shapes)
  assert ahead["compiled_in_loop"] == 0
  when_met, _ = summary(both_ways[False][1])
  assert when_met["shapes_compiled"] == 0 and when_met["compiled_in_loop"] >= len(shapes)


def test_a_shape_missing_from_the_set_is_compiled_when_met_and_said_once(caplog):
  fn = jax.jit(lambda scale, batch: scale * batch["x"].sum(axis=1))
  per_shape = compiled.PerShape(fn, "toy step")
  abstract = {"x": jax.ShapeDtypeStruct((2, 4), jnp.float32)}
  compiled.compile_all(per_shape.lower_all([(2.0, abstract)]))
  assert per_shape.shapes == 1
  known, other = {"x": jnp.ones((2, 4))}, {"x": jnp.ones((3, 5))}
  with caplog.at_level(logging.INFO, logger="transformer"):
    np.testing.assert_array_equal(per_shape(2.0, known), fn(2.0, known))
    for _ in range(2):
      np.testing.assert_array_equal(per_shape(2.0, other), fn(2.0, other))
  assert per_shape.late == 1 and per_shape.shapes == 2
  assert caplog.text.count("meets a batch shape it was not compiled for (x 3x5)") == 1


def test_a_resumed_run_with_other_batch_shapes_compiles_them_ahead(both_ways, tmp_path):
  cfg, workdir = both_ways[True]
  shutil.copytree(workdir, tmp_path / "run")
  cfg = cfg.copy_and_resolve_references()
  cfg.train.steps, cfg.data.tokens_per_batch = 15, 640  # other rows per bucket from here on
  train_and_evaluate(cfg, str(tmp_path / "run"), allow_config_change=True)
  resumed, _ = summary(tmp_path / "run")
  assert resumed["resumed_from"] == 12 and resumed["compiled_in_loop"] == 0
  with contextlib.closing(checkpoints.manager(tmp_path / "run", read_only=True)) as mngr:
    assert 15 in mngr.all_steps()
