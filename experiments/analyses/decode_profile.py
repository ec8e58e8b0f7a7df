"""Where decoding's time goes: a jax.profiler trace of the evaluation program's search, its ops
summed by the code they come from.

    python -m experiments.analyses.decode_profile --config=configs/multi30k.py \
        --config.model.num_layers=3 [--beam_size=4] [--top=25]
    python -m experiments.analyses.decode_profile --workdir=RUN [--beam_size=4]

Decodes transformer-benchmark's synthetic workload (1,000 sources of 8-24 tokens, each to its own
length; untrained parameters) through translator.search_ids as transformer-eval does; or, with
`--workdir`, what a user runs: a trained run's moving average translating its validation sentences
text to text with the run's own search (stopping at EOS; translator.translate). Once to compile,
once timed, once traced; maps each executed XLA op to the JAX operation it was compiled from
(op_trace.traced_ops) and sums op time by part of the search. Op time is summed over XLA's
threads; read the shares, and the wall time during which no op or one op ran (the cores idle or
alone).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
from absl import flags
from ml_collections import config_flags

from transformer.accelerators.decode_benchmark import synthetic_workload
from transformer.accelerators.op_trace import concurrency, op_times, print_breakdown, traced_ops
from transformer.cli import run_program
from transformer.data import sources
from transformer.decoding import translator
from transformer.model.transformer import ModelConfig, Transformer, initial_params
from transformer.training.workdir import load_run

FLAGS = flags.FLAGS

PARTS = (  # (part, substrings of the JAX op name), first match wins
    # XLA fuses the projection with log-softmax's maximum: the fusion carries the latter's name.
    ("output projection (vocabulary) and log-softmax", ("btd,vd->btv", "log_softmax")),
    ("matmul: layers", ("dot_general",)),
    ("forbidden tokens (allowed)", ("allowed",)),
    ("beam: top-k over candidates", ("top_k",)),
    ("beam: sequences, origin, finished (gathers, writes)", ("beam.py", "BeamSearch", "gather")),
    ("attention: softmax, masks, cache", ("attention", "kv_cache", "history_mask")),
    ("LayerNorm", ("_norm",)),
    ("slot loop: refill, write-out", ("loop.py", "_refill", "while")),
)


def part(op: str) -> str:
  for name, keys in PARTS:
    if any(k in op for k in keys):
      return name
  return "other (embeddings, residual adds, ReLU, copies)"


def recorded_call(compiled: Callable, index: int, calls: list[int], *args: Any) -> Any:
  """Runs a compiled program, appending its index to `calls`."""
  calls.append(index)
  return compiled(*args)


def synthetic_decode(cache: dict) -> tuple[Callable[[], Any], str]:
  """--config's model, untrained, decoding the synthetic workload to its lengths."""
  cfg = FLAGS.config
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  model = Transformer(config)
  params = initial_params(model, jax.random.key(0))
  src, lengths, origin = synthetic_workload(1000, 16, config.vocab_size)
  settings = translator.SearchSettings.from_config(cfg, beam_size=FLAGS.beam_size)
  decode = lambda: translator.search_ids(model, params, src, settings, cfg.data.max_len, cache,
                                         lengths)[1]
  return decode, origin


def trained_decode(cache: dict) -> tuple[Callable[[], Any], str]:
  """The --workdir run's moving average translating its validation sentences, text to text."""
  run = load_run(FLAGS.workdir)
  cfg = run.config
  split = sources.load_split(cfg.data, cfg.data.eval_split)
  settings = translator.SearchSettings.from_config(cfg, beam_size=FLAGS.beam_size)
  decode = lambda: translator.translate(run.model, run.params(True), run.vocab, split.source,
                                        settings, cfg.data.max_len, cache).stats
  return decode, f"{cfg.data.eval_split} sentences of {FLAGS.workdir} (stopping at EOS)"


def main(argv: list[str]) -> None:
  cache: dict = {}
  decode, origin = trained_decode(cache) if FLAGS.workdir else synthetic_decode(cache)
  decode()  # compile
  t = time.perf_counter()
  stats = decode()
  seconds = time.perf_counter() - t
  print(f"{origin}, beam {FLAGS.beam_size}: {stats['sentences']} sentences in {seconds:.2f} s, "
        f"{stats['sentences'] / seconds:,.0f} sentences/s, "
        f"{stats['target_tokens'] / seconds:,.0f} target tokens/s")
  # One compiled program per length bucket, their instruction names overlapping: each call's
  # program is recorded so that each traced op is read against the program that ran it.
  programs = list(cache.values())
  calls: list[int] = []
  for i, key in enumerate(cache):
    cache[key] = functools.partial(recorded_call, programs[i], i, calls)
  ops = traced_ops(decode, [compiled.as_text() for compiled in programs], calls=calls)
  per_op = op_times(ops, 1)
  running = concurrency(ops)
  print("wall time with n ops running: " + ", ".join(
      f"{n}: {s:.2f} s ({s / sum(running.values()):.0%})" for n, s in running.items()))
  print_breakdown(per_op, part, "search", FLAGS.top)


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  config_flags.DEFINE_config_file("config", "configs/multi30k.py", "Run config to profile.")
  flags.DEFINE_integer("beam_size", 4, "Beam size (1 = greedy).")
  flags.DEFINE_string("workdir", None, "Profile this trained run (its moving average, validation "
                      "sentences, its search settings) instead of --config's synthetic workload.")
  flags.DEFINE_integer("top", 20, "Also list this many single operations with the most time.")
  run_program("experiments.analyses.decode_profile", main)


if __name__ == "__main__":
  run()
