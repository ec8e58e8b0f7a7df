"""Training survives SIGTERM, SIGHUP, SIGINT and kill -9 at any moment and ends bit-identical to a run that
was never interrupted; a full disk stops it with the previous checkpoint intact."""

import concurrent.futures
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import REPO, cli_overrides, snapshot, tiny_run_config

from transformer import partitioning
from transformer.data import sources
from transformer.data import vocab as vocab_lib
from transformer.metrics import read_metrics, whole_intervals
from transformer.model.transformer import ModelConfig, Transformer
from transformer.training import checkpoints, preemption
from transformer.training.step import abstract_train_state
from transformer.training.train import train_and_evaluate

STEPS = 60


def run_config(tmp_path):
  """The tiny run, packed into one batch shape (one compilation, so steps take milliseconds), with
  a progress line every step and a checkpoint every 5."""
  cfg = tiny_run_config(tmp_path)
  cfg.data.batching, cfg.data.pack_length = "pack", 40
  cfg.train.update(steps=STEPS, log_every=1, eval_every=1000, checkpoint_every=5,
                   keep_checkpoints=3)
  return cfg


def start_training(cfg, workdir, log_path, limit_file_size=None):
  """`transformer-train` in the background, its log going to `log_path`. With `limit_file_size`
  the kernel refuses writes past that many bytes per file (with SIGXFSZ ignored: "File too large"),
  set by a small launcher that then execs the trainer (no fork of this multithreaded process)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  command = [sys.executable, "-m", "transformer.training.train", "--config=configs/multi30k.py",
             f"--workdir={workdir}", *cli_overrides(cfg)]
  if limit_file_size:
    command = [sys.executable, "-c", LIMITED_LAUNCHER, str(limit_file_size), *command]
  with open(log_path, "w") as log:
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


LIMITED_LAUNCHER = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.argv[2], sys.argv[2:])
"""


def wait_until(proc, condition, timeout=300.0):
  """Polls `condition()` every few milliseconds until it holds (True) or the process ends (False)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if condition():
      return True
    if proc.poll() is not None:
      return condition()
    time.sleep(0.003)
  raise TimeoutError("condition not reached")


def logged(log_path, text):
  return lambda: text in Path(log_path).read_text()


def finish(proc, timeout=300):
  proc.wait(timeout=timeout)
  return proc.returncode


def final_state(workdir, step=STEPS):
  """The checkpoint at `step`, as numpy arrays (parameters, Adam moments and counters, step)."""
  cfg = checkpoints.load_run_config(workdir)
  vocab = vocab_lib.load_run_vocab(workdir, cfg.data)
  model = Transformer(ModelConfig.from_config(cfg.model, vocab.get_piece_size()))
  abstract = abstract_train_state(cfg, model, partitioning.replicated(partitioning.data_mesh()))
  state = checkpoints.restore(checkpoints.manager(workdir, read_only=True), abstract, step)
  return jax.tree.map(np.asarray, (state.step, state.params, state.opt_state))


def assert_identical(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(x, y)  # bit for bit, not approximately


def last_line(log_path):
  return Path(log_path).read_text().strip().splitlines()[-1]


def uninterrupted(cfg, tmp_path):
  workdir = tmp_path / "reference"
  assert finish(start_training(cfg, workdir, tmp_path / "reference.log")) == 0
  return workdir


def stopped_by_signals(cfg, tmp_path):
  """SIGTERM (a preemption notice), SIGHUP (a closed terminal) and SIGINT (Ctrl-C): the step
  finishes, a checkpoint is written at it, the program exits with status 75 and one line; the
  fourth start finishes the run."""
  workdir = tmp_path / "graceful"
  stops = []
  for sig, after in ((signal.SIGTERM, 12), (signal.SIGHUP, 22), (signal.SIGINT, 33)):
    log = tmp_path / f"graceful_{sig.name}.log"
    proc = start_training(cfg, workdir, log)
    assert wait_until(proc, logged(log, f"step {after}/{STEPS}"))
    proc.send_signal(sig)
    assert finish(proc) == preemption.EXIT_INTERRUPTED, Path(log).read_text()[-2000:]
    line = last_line(log)
    assert line.startswith(f"transformer-train: stopped by {sig.name} after step "), line
    stopped = int(line.split(" after step ")[1].split("/")[0])
    assert after <= stopped < STEPS  # after the step it was in when the signal came
    assert line.endswith("Run the same command again to resume")
    assert stopped in checkpoints.manager(workdir, read_only=True).all_steps()
    stops.append(stopped)
  log = tmp_path / "graceful_end.log"
  assert finish(start_training(cfg, workdir, log)) == 0
  assert f"Resumed from the checkpoint at step {stops[-1]}" in Path(log).read_text()
  return workdir


def killed(cfg, tmp_path):
  """kill -9 while a checkpoint is being written (after one is complete), then kill -9 in the
  middle of training: each restart resumes from the latest complete checkpoint; the half-written
  one is never loaded, and its temporary directory is removed."""
  workdir = tmp_path / "hard"
  in_flight = lambda: glob.glob(str(workdir / "checkpoints" / "*.orbax-checkpoint-tmp*"))
  log = tmp_path / "hard_1.log"
  proc = start_training(cfg, workdir, log)
  assert wait_until(proc, lambda: (workdir / "checkpoints" / "5").is_dir() and in_flight())
  proc.kill()
  assert finish(proc) == -signal.SIGKILL
  assert in_flight()  # killed mid-write (the write takes ~0.1 s; the kill comes within ~3 ms)
  complete = max(checkpoints.manager(workdir, read_only=True).all_steps())
  log = tmp_path / "hard_2.log"
  proc = start_training(cfg, workdir, log)
  assert wait_until(proc, logged(log, f"step {complete + 7}/{STEPS}"))
  proc.kill()
  assert finish(proc) == -signal.SIGKILL
  assert f"Resumed from the checkpoint at step {complete}" in Path(log).read_text()
  log = tmp_path / "hard_3.log"
  assert finish(start_training(cfg, workdir, log)) == 0
  assert "Resumed from the checkpoint" in Path(log).read_text()
  assert not in_flight()
  return workdir


@pytest.mark.slow
def test_interrupted_and_killed_runs_end_bit_identical(tmp_path):
  """Four interruptions (SIGTERM, SIGINT, kill -9 during a checkpoint write, kill -9 mid-training)
  in two runs, each ending with exactly the parameters and Adam state of an uninterrupted run."""
  cfg = run_config(tmp_path)
  source = sources.open_split(cfg.data, "train")
  vocab_lib.cached_vocab(cfg.data, source, cfg.seed)  # trained once, not by three runs at a time
  with concurrent.futures.ThreadPoolExecutor(3) as pool:  # three runs side by side
    reference, graceful, hard = [pool.submit(chain, cfg, tmp_path) for chain in
                                 (uninterrupted, stopped_by_signals, killed)]
    expected = final_state(reference.result())
    assert_identical(final_state(graceful.result()), expected)
    assert_identical(final_state(hard.result()), expected)


@pytest.mark.slow
def test_a_full_disk_stops_the_run_and_keeps_the_previous_checkpoint(tmp_path):
  cfg = run_config(tmp_path)
  cfg.train.update(steps=10, log_every=5, checkpoint_every=5)
  workdir = tmp_path / "run"
  train_and_evaluate(cfg, str(workdir))
  kept = snapshot(workdir / "checkpoints")
  cfg.train.steps = 15
  # The resumed run may not write files over 16 kB: its checkpoint at step 15 cannot be written,
  # as on a full disk (the kernel answers "File too large" instead of "No space left on device").
  log = tmp_path / "full.log"
  assert finish(start_training(cfg, workdir, log, limit_file_size=16_000)) == 2
  assert last_line(log).startswith(
      f"transformer-train: error: could not write a checkpoint to {workdir / 'checkpoints'}: File "
      "too large; the latest complete checkpoint is step 10. Free space")
  assert "Traceback" not in Path(log).read_text()
  after = snapshot(workdir / "checkpoints")
  assert {k: v for k, v in after.items() if k in kept} == kept  # checkpoints 5 and 10 intact
  assert all("/15.orbax-checkpoint-tmp/" in k for k in after if k not in kept)
  assert checkpoints.manager(workdir, read_only=True).all_steps() == [5, 10]
  log = tmp_path / "after.log"
  assert finish(start_training(cfg, workdir, log)) == 0  # with space again, it resumes from 10
  assert "Resumed from the checkpoint at step 10" in Path(log).read_text()
  assert checkpoints.manager(workdir, read_only=True).all_steps() == [5, 10, 15]


@pytest.mark.slow
def test_a_stop_and_its_resume_log_the_loss_curve_of_an_uninterrupted_run(tmp_path):
  """A stop mid-interval records the part of the interval it trained, the resume the rest; each
  record says how many steps and tokens it averages, and merged by them they are the records of a
  run that was never stopped."""
  cfg = run_config(tmp_path)
  cfg.train.log_every = 10
  reference = uninterrupted(cfg, tmp_path)
  workdir, log = tmp_path / "stopped", tmp_path / "stopped.log"
  proc = start_training(cfg, workdir, log)
  assert wait_until(proc, logged(log, f"step 20/{STEPS}"))
  proc.send_signal(signal.SIGTERM)
  assert finish(proc) == preemption.EXIT_INTERRUPTED, Path(log).read_text()[-2000:]
  stopped = int(last_line(log).split(" after step ")[1].split("/")[0])
  assert finish(start_training(cfg, workdir, tmp_path / "resumed.log")) == 0
  records = read_metrics(workdir, "train")
  if stopped % 10:  # the stop split an interval: its two parts are records of their own
    parts = [r for r in records if r["step"] in (stopped, stopped - stopped % 10 + 10)]
    assert [r["steps"] for r in parts] == [stopped % 10, 10 - stopped % 10]
  expected = read_metrics(reference, "train")
  merged = whole_intervals(records, 10)
  assert [(r["step"], r["steps"]) for r in merged] == [(r["step"], r["steps"]) for r in expected]
  for mine, theirs in zip(merged, expected):
    for key in ("loss", "nll", "accuracy"):
      assert mine[key] == pytest.approx(theirs[key], rel=1e-6)


@pytest.mark.slow
def test_a_run_continued_to_more_steps_ends_as_one_trained_there_at_once(tmp_path):
  """With a schedule that has no end (no cool-down), training to step 30 and then, with
  train.steps raised, on to 60 is the same run as training to 60 at once (grids continue a run
  this way): the same parameters and Adam state, bit for bit."""
  cfg = run_config(tmp_path)
  cfg.train.log_every = 30
  at_once, continued = tmp_path / "at_once", tmp_path / "continued"
  train_and_evaluate(cfg, str(at_once))
  shorter = cfg.copy_and_resolve_references()
  shorter.train.steps = STEPS // 2
  train_and_evaluate(shorter, str(continued))
  assert max(checkpoints.manager(continued, read_only=True).all_steps()) == STEPS // 2
  train_and_evaluate(cfg, str(continued))
  assert_identical(final_state(continued), final_state(at_once))
