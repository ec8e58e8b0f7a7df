"""Shared fixtures (helpers: tests/helpers.py), and one compilation cache for the whole session.

Most of the suite's time is XLA compiling the same tiny models again: in every test that trains, and
in every program a test runs as its own process. JAX's persistent compilation cache, in a fresh
directory per session (set here, before anything imports JAX, and inherited by those processes),
compiles each distinct computation once per session and loads the same executable after that.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest

XLA_CACHE = tempfile.mkdtemp(prefix="transformer-tests-xla-cache-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = XLA_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# CPU only, even where JAX's CUDA plugin is installed (to compile for GPUs without one: it
# initialises without a GPU only on a CPU-only JAX).
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture
def rng():
  return np.random.default_rng(0)


def mounted_tmpfs(mount, size: str, read_only_dirs=None):
  """A real filesystem of `size` (a tmpfs) mounted at `mount`, made read-only after creating
  `read_only_dirs` in it where those are given; yields it, unmounts it. Needs root: skipped
  elsewhere."""
  import subprocess
  mount.mkdir()
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                        capture_output=True)
  if done.returncode:
    pytest.skip(f"cannot mount a filesystem here: {done.stderr.decode().strip()}")
  if read_only_dirs is not None:
    for name in read_only_dirs:
      (mount / name).mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
  yield mount
  subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def small_filesystem(tmp_path):
  """A real 2 MB filesystem mounted in tmp_path (root only, else skipped)."""
  yield from mounted_tmpfs(tmp_path / "small", "2m")


@pytest.fixture
def read_only_filesystem(tmp_path):
  """A read-only filesystem mounted in tmp_path, holding an empty directory 'existing'."""
  yield from mounted_tmpfs(tmp_path / "ro", "1m", read_only_dirs=["existing"])


@pytest.fixture(scope="session")
def small_vocab(tmp_path_factory):
  """(a 500-piece BPE SentencePiece model of the bundled Multi30k's first 2,000 pairs, its path)."""
  from transformer.config import base_config
  from transformer.data import sources
  from transformer.data import vocab as vocab_lib
  text = sources.load_split(base_config().data, "train")
  path = tmp_path_factory.mktemp("vocab") / vocab_lib.VOCAB_FILE
  return vocab_lib.train_vocab(text.source[:2000] + text.target[:2000], path, 500), path


@pytest.fixture(scope="session")
def two_step_run(tmp_path_factory):
  """A tiny run (helpers.tiny_run_config) trained for 2 steps, one checkpoint: for the tests that
  only read a run (export it, load it); none may change it."""
  from helpers import tiny_run_config

  from transformer.training.train import train_and_evaluate
  tmp = tmp_path_factory.mktemp("two_step_run")
  cfg = tiny_run_config(tmp)
  cfg.train.steps, cfg.train.eval_every, cfg.train.checkpoint_every = 2, 2, 2
  train_and_evaluate(cfg, str(tmp / "run"))
  return tmp / "run"


def pytest_unconfigure(config):
  shutil.rmtree(XLA_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  """A mark expression that does not name 'slow' (pytest -m core) still leaves the slow tests out."""
  expression = config.getoption("markexpr") or ""
  if "slow" in expression:
    return
  kept = [item for item in items if item.get_closest_marker("slow") is None]
  if len(kept) < len(items):
    config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("slow")])
    items[:] = kept
