"""Training-step throughput on the current backend, and input-pipeline throughput on the host.

    python -m transformer.benchmark --config=configs/wmt14_ende.py:base --batch_tokens=25000
    python -m transformer.benchmark --config=configs/multi30k.py --input_pipeline --batches=200

Compiles the real train step once, then times `--steps` steps (after `--warmup` untimed ones) on a
batch of `--batch_tokens` target tokens (rows of `--seq_len` tokens, no padding; the same number of
source tokens), and prints one JSON object: target tokens/s, step time (median, min, max) and the
analytic training TFLOP/s (info.training_flops_per_target_token). With --input_pipeline it instead
runs the config's real training input pipeline (read, tokenize, filter, batch; no device work) for
`--batches` batches and reports the tokens per second it can produce, to compare with what the train
step consumes. Timings live here, never in tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from transformer import partitioning
from transformer.cli import run_program
from transformer.config import validate
from transformer.info import training_flops_per_target_token
from transformer.model import EOS_ID, ModelConfig, Transformer
from transformer.train import jit_train_fns, prepare_data

FLAGS = flags.FLAGS


def benchmark(cfg, batch_tokens: int, seq_len: int, steps: int, warmup: int) -> dict:
  validate(cfg)
  mesh = partitioning.data_mesh()
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  model = Transformer(config)
  init, step_fn = jit_train_fns(cfg, model, mesh)
  state = init(jax.random.PRNGKey(0))
  rows = max(mesh.size, batch_tokens // seq_len // mesh.size * mesh.size)
  rng = np.random.default_rng(0)
  tokens = rng.integers(4, config.vocab_size, (2, rows, seq_len)).astype(np.int32)
  tokens[:, :, -1] = EOS_ID
  batch = partitioning.shard_batch({"src": tokens[0], "tgt": tokens[1]}, mesh)
  dropout_rng = jax.random.key(1, impl=cfg.train.dropout_rng)
  t = time.perf_counter()
  state, sums = step_fn(state, batch, dropout_rng)
  jax.block_until_ready(sums)
  compile_sec = time.perf_counter() - t
  for _ in range(warmup):
    state, sums = step_fn(state, batch, dropout_rng)
  jax.block_until_ready(sums)
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    state, sums = step_fn(state, batch, dropout_rng)
    jax.block_until_ready(sums)
    times.append(time.perf_counter() - t)
  median = statistics.median(times)
  flops = training_flops_per_target_token(config, seq_len, seq_len) * rows * seq_len
  return {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
          "devices": mesh.size, "dtype": cfg.model.dtype, "rows": rows, "seq_len": seq_len,
          "target_tokens_per_step": rows * seq_len, "compile_sec": round(compile_sec, 2),
          "step_sec_median": median, "step_sec_min": min(times), "step_sec_max": max(times),
          "target_tokens_per_sec": rows * seq_len / median,
          "analytic_tflops_per_sec": flops / median / 1e12,
          "loss": float(sums["loss"] / sums["tokens"])}


def benchmark_input(cfg, batches: int) -> dict:
  """Tokens/s the training input pipeline produces on this host (vocabulary from the cache)."""
  validate(cfg)
  with tempfile.TemporaryDirectory() as workdir:
    _, pipeline, _ = prepare_data(cfg, Path(workdir), num_devices=jax.device_count())
    real = {"src": 0, "tgt": 0}
    padded = 0
    t = time.perf_counter()
    with contextlib.closing(pipeline.batches()) as stream:
      for i, (batch, _) in enumerate(stream):
        for side in real:
          real[side] += int((batch[side] != 0).sum())
        padded += batch["tgt"].size
        if i + 1 == batches:
          break
    seconds = time.perf_counter() - t
  return {"mode": cfg.data.batching, "tokens_per_batch": cfg.data.tokens_per_batch,
          "batches": batches, "seconds": seconds, "cpu_count": os.cpu_count(),
          "target_tokens_per_sec": real["tgt"] / seconds,
          "source_tokens_per_sec": real["src"] / seconds,
          "target_padding_fraction": 1 - real["tgt"] / padded}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.config is None:
    raise app.UsageError("pass --config=configs/wmt14_ende.py:base (or another config)")
  if FLAGS.input_pipeline:
    print(json.dumps(benchmark_input(FLAGS.config, FLAGS.batches)))
  else:
    print(json.dumps(benchmark(FLAGS.config, FLAGS.batch_tokens, FLAGS.seq_len, FLAGS.steps,
                               FLAGS.warmup)))


def run() -> None:
  """Console-script entry point."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.")
  flags.DEFINE_integer("batch_tokens", 25000, "Target tokens per step (as many source tokens).")
  flags.DEFINE_integer("seq_len", 32, "Tokens per sentence of the synthetic batch.")
  flags.DEFINE_integer("steps", 20, "Timed steps.")
  flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
  flags.DEFINE_bool("input_pipeline", False, "Time the config's input pipeline instead.")
  flags.DEFINE_integer("batches", 200, "Batches to draw with --input_pipeline.")
  run_program("transformer-benchmark", main)


if __name__ == "__main__":
  run()
