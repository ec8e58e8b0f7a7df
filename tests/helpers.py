"""What the tests share: a tiny model and a tiny run config that compile and train in seconds on a
CPU, running a program as a user would, and snapshots of files that must not change."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax

from transformer.config import base_config
from transformer.decoding import textbook
from transformer.model.transformer import (
  EOS_ID,
  ModelConfig,
  Transformer,
  initial_params,
  shift_right,
)

REPO = Path(__file__).parent.parent


def model_config(vocab_size: int, **overrides) -> ModelConfig:
  """The model of config.base_config() (the paper's base) for `vocab_size` words, with `overrides`."""
  return dataclasses.replace(ModelConfig.from_config(base_config().model, vocab_size), **overrides)


def tiny_model_config(**overrides) -> ModelConfig:
  values = dict(vocab_size=24, num_layers=2, d_model=16, d_ff=32, num_heads=4, dropout=0.0,
                max_len=32)
  values.update(overrides)
  return model_config(**values)


def init_params(model: Transformer, seed: int = 0, scale: float = 1.0):
  """Random parameters; `scale` > 1 sharpens the output distributions (more decisive decoding)."""
  params = initial_params(model, jax.random.key(seed))
  return jax.tree.map(lambda x: x * scale, params)


def random_tokens(rng: np.random.Generator, batch: int, length: int, vocab: int,
                  lengths=None) -> np.ndarray:
  """Token ids >= 4 (no specials), EOS at each row's end, padding after it."""
  tokens = rng.integers(4, vocab, (batch, length)).astype(np.int32)
  lengths = lengths if lengths is not None else [length] * batch
  for row, n in enumerate(lengths):
    tokens[row, n - 1] = EOS_ID
    tokens[row, n:] = 0
  return tokens


def copy_task_model(vocab: int = 24):
  """A small model trained in seconds to write its source backwards: it ends its outputs with EOS
  by itself, as a trained translation model does."""
  config = tiny_model_config(vocab_size=vocab, d_model=32, d_ff=64)
  model, optimizer = Transformer(config), optax.adam(3e-3)
  params = init_params(model, seed=1)
  rng = np.random.default_rng(0)

  def batch():
    lengths = rng.integers(2, 9, 64)
    src = random_tokens(rng, 64, 8, vocab, lengths=lengths)
    tgt = src.copy()
    for row, n in enumerate(lengths):
      tgt[row, :n - 1] = src[row, :n - 1][::-1]
    return src, tgt

  @jax.jit
  def step(params, opt_state, src, tgt):
    def loss(p):
      sums = textbook.loss_sums(model.apply({"params": p}, src, shift_right(tgt)), tgt, 0.1)
      return sums["loss"] / sums["tokens"]
    updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for _ in range(300):
    params, opt_state = step(params, opt_state, *batch())
  return config, model, params, batch()[0][:16]


def tiny_run_config(tmp_path, train_lines: int = 300, eval_lines: int = 40):
  """A run config on slices of the bundled Multi30k, written as plain text files under tmp_path."""
  from transformer.data import sources, text_files
  c = base_config()
  for split, n in (("train", train_lines), ("val", eval_lines)):
    for lang in ("en", "de"):
      lines = text_files.read_lines(sources.BUNDLED_DIR / f"{split}.{lang}.gz")[:n]
      (tmp_path / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
  c.data.source = "files"
  c.data.train_src, c.data.train_tgt = str(tmp_path / "train.en"), str(tmp_path / "train.de")
  c.data.eval_src, c.data.eval_tgt = str(tmp_path / "val.en"), str(tmp_path / "val.de")
  c.data.vocab_size = 300
  c.data.vocab_cache_dir = str(tmp_path / "vocab_cache")
  c.data.token_cache_dir = str(tmp_path / "token_cache")
  c.data.max_len = 40
  c.data.tokens_per_batch = 512
  c.model.num_layers = 1
  c.model.d_model = 32
  c.model.d_ff = 64
  c.model.num_heads = 4
  c.model.max_len = 64
  c.train.steps = 6
  c.train.warmup_steps = 4
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.checkpoint_every = 3
  c.train.keep_checkpoints = 2
  c.decode.max_extra_len = 5
  return c


def cli_overrides(cfg, **changes):
  """`--config.section.key=value` flags that reproduce the tiny run config on the command line."""
  values = {f"{section}.{key}": cfg[section][key] for section in ("model", "data", "train", "decode")
            for key in cfg[section] if not isinstance(cfg[section][key], str) or cfg[section][key]}
  values.update(changes)
  return [f"--config.{k}={v}" for k, v in values.items()]


def run_cli(module, *args, devices=1, input_text=None, input_bytes=None):
  """Runs `python -m module args` from the repository root, as a user would; returns the result."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  if input_bytes is not None:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          input=input_bytes, capture_output=True, timeout=600)
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, input=input_text,
                        capture_output=True, text=True, timeout=600)


def snapshot(*paths) -> dict[str, bytes | None]:
  """Every file under `paths` with its bytes (None for a path that does not exist): compare two
  snapshots to check that nothing was written, overwritten or deleted."""
  files = {}
  for path in map(Path, paths):
    if not path.exists():
      files[str(path)] = None
    for p in sorted(path.rglob("*")) if path.is_dir() else [path] if path.exists() else []:
      if p.is_file():
        files[str(p)] = p.read_bytes()
  return files


def live_processes(parent: int | None = None, group: int | None = None) -> set[int]:
  """The live (not zombie) processes whose parent is `parent` or whose process group is `group`,
  from Linux's /proc."""
  found = set()
  for stat in Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()  # state, parent, process group, ...
    except OSError:
      continue
    if fields[0] != "Z" and (int(fields[1]) == parent or int(fields[2]) == group):
      found.add(int(stat.parent.name))
  return found
