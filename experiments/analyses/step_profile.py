"""Where a training step's time goes: a jax.profiler trace of the step, its ops summed by the model
code they come from.

    python -m experiments.analyses.step_profile [--config=configs/multi30k.py --rows=128 --seq_len=16]
        [--config.model.dropout=0.0 ...]

Times the jit-compiled step training runs (step.jit_train_fns) on transformer-benchmark's synthetic
batch (random ids, each row ending in EOS, no padding), traces three more steps, maps each executed
XLA op to the JAX operation it was compiled from (the `op_name` metadata of the compiled HLO) and
sums the op time by category: matmuls (the output projection over the vocabulary apart), dropout,
the loss, LayerNorm, attention's other operations, the optimizer and the rest; on a GPU, cuBLAS and
cuDNN kernels run inside a CUDA graph are named by the kernel. `--trace_dir=DIR` keeps the trace and
the compiled program, and `--read_trace=DIR` reads them again (anywhere, no accelerator needed).
Op time is summed over XLA's threads, so it adds up to more than the step's wall time; read the
shares, and time the step itself for speed-ups. The timed steps' page faults and kernel time show
what the host's memory allocation costs (transformer/host_memory.py; `TRANSFORMER_MALLOC_DEFAULTS=1`
runs with malloc as glibc sets it).

    python -m experiments.analyses.step_profile --versus=train.dropout_rng=unsafe_rbg [--rounds=8]

times the step of the config and of the config with the overrides alternately, in one process (a
change worth a few percent is below what separate processes on a shared VM can resolve).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import resource
import time
from typing import Any

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from transformer import partitioning
from transformer.accelerators.benchmark import synthetic_tokens
from transformer.accelerators.op_trace import (
  LIBRARY_KERNEL,
  op_times,
  print_breakdown,
  trace_events,
  traced_ops,
  xla_ops,
)
from transformer.cli import run_program
from transformer.config import validate
from transformer.model.transformer import ModelConfig, Transformer
from transformer.training.step import dropout_key, jit_train_fns

FLAGS = flags.FLAGS
HLO_FILE = "train_step.hlo.txt"  # the compiled program, kept beside a --trace_dir trace


def category(op: str) -> str:
  """The part of the step an op belongs to, from its JAX op name (or a GPU library's kernel name)."""
  if op.startswith(LIBRARY_KERNEL):
    if re.search(r"sdpa|flash|fmha|cudnn", op):
      return "attention: cuDNN kernels"
    if re.search(r"gemm|nvjet|cublas|cutlass", op):
      return "matmul: cuBLAS kernels (layers and vocabulary)"
  if "dot_general" in op:
    # vocab_projection.py's scopes, or its einsums where the scope is lost (the CPU programs of JAX 0.10)
    vocabulary = re.search(r"output_logits|btd,vd->btv|btv,vd->btd", op)
    return "matmul: output projection (vocabulary)" if vocabulary else "matmul: layers"
  if "Dropout" in op or "rng_bit_generator" in op or "random_bits" in op:
    return "dropout (masks and scaling)"
  if "token_losses" in op or "log_softmax" in op or op.startswith(("jvp()/", "transpose(jvp())")):
    return "loss (softmax over the vocabulary)"
  if "_norm" in op:
    return "LayerNorm"
  if "attention" in op:
    return "attention: softmax, masks, reshapes"
  if "adam" in op.lower() or "apply_gradients" in op or "ema" in op:
    return "optimizer update"
  return "other (embeddings, residual adds, ReLU, transfers)"


@dataclasses.dataclass
class PreparedStep:
  """The jit-compiled step training runs for a config, on benchmark.synthetic_tokens batches."""
  fns: Any
  mesh: Any
  batch: dict
  rng: Any
  state: Any
  tokens_per_step: int

  @classmethod
  def build(cls, cfg) -> PreparedStep:
    """Compiled and warmed up (3 steps)."""
    vocab_size = cfg.data.vocab_size
    model = Transformer(ModelConfig.from_config(cfg.model, vocab_size))
    mesh = partitioning.make_mesh(cfg, vocab_size)
    fns = jit_train_fns(cfg, model, mesh)
    batch = partitioning.shard_batch(
        {"src": synthetic_tokens(FLAGS.rows, FLAGS.seq_len, vocab_size, 0),
         "tgt": synthetic_tokens(FLAGS.rows, FLAGS.seq_len, vocab_size, 1)}, mesh)
    prepared = cls(fns, mesh, batch, dropout_key(cfg), fns.init(jax.random.key(cfg.seed)),
                   FLAGS.rows * FLAGS.seq_len)
    for _ in range(3):
      prepared.run()
    return prepared

  def run(self) -> None:
    """One step, waited for."""
    self.state, sums = self.fns.step(self.state, self.batch, self.rng)
    jax.block_until_ready(sums)


def overridden(cfg, overrides: list[str]):
  """A copy of `cfg` with KEY=VALUE overrides (values read as Python literals, else as strings)."""
  cfg = copy.deepcopy(cfg)
  for item in overrides:
    key, _, text = item.partition("=")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    section, name = key.removeprefix("config.").split(".")
    cfg[section][name] = value
  return validate(cfg)


def compare(cfg, overrides: list[str]) -> None:
  """The step with and without `overrides`, alternating, in one process."""
  steps = {"config": PreparedStep.build(cfg),
           " ".join(overrides): PreparedStep.build(overridden(cfg, overrides))}
  times: dict[str, list[float]] = {name: [] for name in steps}
  for _ in range(FLAGS.rounds):
    for name, step in steps.items():
      for _ in range(3):
        t = time.perf_counter()
        step.run()
        times[name].append(time.perf_counter() - t)
  medians = {name: float(np.median(t)) for name, t in times.items()}
  for name, t in times.items():
    print(f"{name}: step {medians[name]:.3f} s median (p10-p90 {np.percentile(t, 10):.3f}-"
          f"{np.percentile(t, 90):.3f}) over {len(t)} steps")
  first, second = medians.values()
  print(f"ratio (overridden / config): {second / first:.3f}")


def read_trace(trace_dir: str) -> None:
  """The breakdown of a kept trace of three steps (--trace_dir), from its files alone."""
  with open(f"{trace_dir}/{HLO_FILE}") as f:
    hlo = f.read()
  print_breakdown(op_times(xla_ops(trace_events(trace_dir), hlo), 3), category, "step", FLAGS.top)


def main(argv: list[str]) -> None:
  cfg = FLAGS.config
  if FLAGS.read_trace:
    read_trace(FLAGS.read_trace)
    return
  if FLAGS.versus:
    compare(cfg, FLAGS.versus)
    return
  prepared = PreparedStep.build(cfg)
  times = []
  usage = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(FLAGS.steps):
    t = time.perf_counter()
    prepared.run()
    times.append(time.perf_counter() - t)
  after = resource.getrusage(resource.RUSAGE_SELF)
  fns, mesh, state, batch, rng = (prepared.fns, prepared.mesh, prepared.state, prepared.batch,
                                  prepared.rng)
  step = float(np.median(times))
  print(f"step {step:.3f} s median (p10-p90 {np.percentile(times, 10):.3f}-"
        f"{np.percentile(times, 90):.3f}), {prepared.tokens_per_step / step:.0f} target tokens/s; per step "
        f"{(after.ru_minflt - usage.ru_minflt) / FLAGS.steps:,.0f} page faults, "
        f"{(after.ru_stime - usage.ru_stime) / FLAGS.steps:.3f} s in the kernel")

  with jax.set_mesh(mesh):  # fns.step wraps the jitted function (partitioning.with_mesh)
    hlo = fns.step.__wrapped__.lower(state, batch, rng).compile().as_text()

  def three_steps():
    nonlocal state
    for _ in range(3):
      state, sums = fns.step(state, batch, rng)
    jax.block_until_ready(sums)

  ops = traced_ops(three_steps, hlo, FLAGS.trace_dir)
  if FLAGS.trace_dir:  # with the program, the trace can be read again offline (op_trace.xla_ops)
    with open(f"{FLAGS.trace_dir}/{HLO_FILE}", "w") as f:
      f.write(hlo)
  print_breakdown(op_times(ops, 3), category, "step", FLAGS.top)


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  config_flags.DEFINE_config_file("config", "configs/multi30k.py", "Run config to profile.")
  flags.DEFINE_integer("rows", 128, "Sentences per batch.")
  flags.DEFINE_integer("seq_len", 16, "Tokens per sentence (source and target).")
  flags.DEFINE_integer("steps", 8, "Timed steps.")
  flags.DEFINE_string("trace_dir", None, "Keep the profiled steps' trace in this directory (for "
                      "TensorBoard or Perfetto; default: a temporary directory, removed).")
  flags.DEFINE_string("read_trace", None, "Instead of profiling, read again a trace kept with "
                      "--trace_dir (its trace and train_step.hlo.txt; e.g. one taken on a GPU).")
  flags.DEFINE_integer("top", 15, "Also list this many single operations with the most time.")
  flags.DEFINE_list("versus", [], "KEY=VALUE config overrides: instead of profiling, time the config's "
                    "step and the overridden config's step alternately in one process (--rounds of 3 "
                    "steps each) and print both and their ratio.")
  flags.DEFINE_integer("rounds", 8, "With --versus: alternating rounds.")
  run_program("experiments.analyses.step_profile", main)


if __name__ == "__main__":
  run()
