"""Training and decoding speed on the current backend, and input-pipeline throughput on the host.

    transformer-benchmark --config=configs/wmt14_ende.py:base --batch_tokens=25000 --output=b.json
    transformer-benchmark --config=configs/multi30k.py --input_pipeline --batches=200

Compiles the real train step once (the one training runs, on the config's mesh), then times `--steps`
steps (after `--warmup` untimed ones) on a synthetic batch of `--batch_tokens` target tokens (rows
of `--seq_len` tokens, no padding; as many source tokens; default: the config's batch size), times
greedy and beam search as the evaluation program runs them (`decode.*` settings) on
`--decode_sentences` real evaluation sentences (or synthetic ones) decoded to their references'
lengths, and `--checkpoint_saves` asynchronous checkpoint saves (how long each stops training).
With `--reference=N` it checks N of the beam search's hypotheses against decoding/textbook.py's plain
search. With `--real_batches=N` it also times N steps on the config's own training batches (bucket padding
and all) and reports real target tokens/s: the figure the training log prints.
Prints one JSON object (and writes it to `--output`): target tokens/s, step time (median, spread),
analytic training FLOPs per step (model.size.training_flops_per_target_token), MFU against the device's
peak (hardware.PEAK_TFLOPS, `--peak_tflops`, or a measured matmul with `--measure_peak`), decode
sentences/s and target tokens/s for beam 1 and the config's beam, and peak device memory where the
backend reports it. Progress goes to the log as it runs. With --input_pipeline it instead times the
config's training loader on this host (no device work; transformer/data/input_benchmark.py): tokens
per second per Grain worker count, padding, time to the first batch and to resume, memory, and a
stand-in training loop's waits. Timings live here, never in tests. docs/performance.md and
docs/data.md hold the figures measured with it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from transformer import partitioning
from transformer.accelerators.decode_benchmark import benchmark_decode
from transformer.accelerators.loader_benchmark import benchmark_input
from transformer.cli import (
  define_distributed_flags,
  initialize_distributed,
  run_program,
)
from transformer.config import validate
from transformer.data import batching
from transformer.data.pipeline import training_inputs
from transformer.data.sources import DataError
from transformer.files import writable_directory, writable_file
from transformer.hardware import table_peak
from transformer.model.size import training_flops_per_target_token
from transformer.model.transformer import EOS_ID, PAD_ID, ModelConfig, Transformer
from transformer.training import checkpoints
from transformer.training.step import dropout_key, jit_train_fns

FLAGS = flags.FLAGS
log = logging.getLogger("transformer")

def measure_peak_tflops(dtype: Any) -> float:
  """TFLOP/s of a large square matmul of random operands in `dtype` on one device: an achievable
  peak. On an accelerator, twenty 8192-wide products are queued back to back per timing: one
  4096-wide product is ~0.2 ms there, and timed alone the launch and the host clock outweighed it
  (254-485 TFLOP/s on an H200 whose long loop reaches ~700). On a CPU one 4096-wide product is a
  second or so, timed alone."""
  on_cpu = jax.default_backend() == "cpu"
  size, launches, repeats = (4096, 1, 10) if on_cpu else (8192, 20, 5)
  a, b = (jax.random.normal(k, (size, size), dtype) for k in jax.random.split(jax.random.key(0)))
  matmul = jax.jit(jnp.matmul)
  run = lambda: [matmul(a, b) for _ in range(launches)][-1]
  timed(run, 1)  # compile and warm up
  return 2 * size ** 3 * launches / statistics.median(timed(run, repeats)) / 1e12


def peak_memory_bytes() -> int | None:
  """The most device memory in use at any time, summed over local devices (None on CPU)."""
  stats = [d.memory_stats() for d in jax.local_devices()]
  if any(s is None or "peak_bytes_in_use" not in s for s in stats):
    return None
  return sum(s["peak_bytes_in_use"] for s in stats)


def timed(fn, repeats: int) -> list[float]:
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return times


def spread(times: list[float]) -> dict[str, float]:
  """Median, extremes, 10th/90th percentiles and the relative p10-p90 spread of step times."""
  p10, p90 = np.percentile(times, [10, 90])
  median = statistics.median(times)
  return {"median": median, "min": min(times), "max": max(times), "p10": float(p10),
          "p90": float(p90), "spread_pct": 100 * float(p90 - p10) / median}


def synthetic_tokens(rows: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """Full-length rows of random non-special ids ending in EOS."""
  tokens = np.random.default_rng(seed).integers(4, vocab_size, (rows, length)).astype(np.int32)
  tokens[:, -1] = EOS_ID
  return tokens


def device_peak(flag: float | None, measure: bool, dtype, device_kind: str
                ) -> tuple[float | None, str]:
  """The peak TFLOP/s per device for MFU, and where it came from: --peak_tflops, else a matmul
  measured in the model's dtype (--measure_peak), else the table by device kind (None off it)."""
  if flag is not None:
    return flag, "--peak_tflops"
  if measure:
    return measure_peak_tflops(dtype), f"measured {jnp.dtype(dtype).name} matmul"
  return table_peak(device_kind), f"table ({device_kind}, bf16 dense)"


def benchmark(cfg: ml_collections.ConfigDict, batch_tokens: int | None, seq_len: int, steps: int,
              warmup: int, decode_sentences: int = 0, peak_tflops: float | None = None,
              measure_peak: bool = False, checkpoint_saves: int = 0,
              checkpoint_dir: str | None = None, real_batches: int = 0,
              reference_sentences: int = 0, shapes: list[int] | None = None,
              mix: np.ndarray | None = None) -> dict[str, Any]:
  """Times training steps (on batches of `batch_tokens`, default the config's
  data.tokens_per_batch), then `real_batches` steps on the config's own training batches if asked,
  decoding if `decode_sentences` (-1: the whole evaluation split; `reference_sentences` of them
  checked against the reference search) and checkpoint saves if `checkpoint_saves`; returns the
  figures as a dict."""
  validate(cfg)
  batch_tokens = batch_tokens or cfg.data.tokens_per_batch
  mesh = partitioning.make_mesh(cfg, cfg.data.vocab_size)
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  model = Transformer(config)
  fns = jit_train_fns(cfg, model, mesh)
  state = fns.init(jax.random.key(0))
  rows = batching.rows_per_batch(batch_tokens, seq_len, mesh.size * cfg.train.grad_accum_steps)
  batch = partitioning.shard_batch({"src": synthetic_tokens(rows, seq_len, config.vocab_size, 0),
                                    "tgt": synthetic_tokens(rows, seq_len, config.vocab_size, 1)},
                                   mesh)
  dropout_rng = dropout_key(cfg)
  holder = {"state": state}

  def one_step():
    holder["state"], sums = fns.step(holder["state"], batch, dropout_rng)
    holder["sums"] = sums
    return sums

  log.info("Compiling the train step (%d rows x %d tokens, %s)", rows, seq_len,
           f"{mesh.size} device(s)")
  compile_sec = timed(one_step, 1)[0]  # compilation and the first step
  timed(one_step, warmup)
  log.info("Timing %d training steps", steps)
  times = spread(timed(one_step, steps))
  sums = jax.device_get(holder["sums"])
  params = holder["state"].params
  result = step_figures(cfg, config, mesh, params, rows, seq_len, compile_sec, times,
                        float(sums["loss"] / sums["tokens"]), peak_tflops, measure_peak)
  if shapes:
    result.update(benchmark_shapes(cfg, fns, holder, mesh, config, batch_tokens, shapes, steps,
                                   warmup, result["peak_tflops_per_device"], mix))
  if real_batches:
    result.update(benchmark_real_batches(cfg, fns, holder, mesh, real_batches))
  if decode_sentences:
    result.update(benchmark_decode(cfg, model, holder["state"].params, seq_len, decode_sentences,
                                   sorted({1, cfg.decode.beam_size}), reference_sentences))
  if checkpoint_saves:
    result.update(benchmark_checkpoint(holder, one_step, checkpoint_saves, checkpoint_dir))
  result["peak_memory_bytes"] = peak_memory_bytes()
  return result


def shape_lengths(cfg: ml_collections.ConfigDict, spec: str) -> list[int]:
  """--shapes: 'buckets' (every length bucket of data.max_len, as the loader pads), 'packed' (rows
  of data.pack_length), or row lengths ('8,16,32')."""
  if spec == "buckets":
    return batching.bucket_boundaries(cfg.data.max_len)
  if spec == "packed":
    return [cfg.data.pack_length]
  try:
    return sorted({int(n) for n in spec.split(",")})
  except ValueError:
    raise app.UsageError(f"--shapes takes 'buckets', 'packed' or row lengths like 8,16,32; got {spec!r}") from None


def length_mix(path: str) -> np.ndarray:
  """[pairs, 2] (source, target) lengths in tokens, EOS included: a token cache's lengths.npy, or a
  JSON histogram {"lengths": [[source, target, pairs], ...]} such as the stand-in corpus's record."""
  path = Path(path)
  if path.is_dir():
    return np.asarray(np.load(path / "lengths.npy", mmap_mode="r"), np.int64)
  if path.suffix == ".json" and path.is_file():
    rows = np.asarray(json.loads(path.read_text())["lengths"], np.int64)
    return np.repeat(rows[:, :2], rows[:, 2], axis=0)
  raise DataError(f"--mix={path} is neither a token cache directory (with lengths.npy) nor a JSON "
                  "length histogram")


def mix_figures(shapes: list[dict[str, Any]], lengths: np.ndarray, peak: float | None,
                devices: int) -> dict[str, Any]:
  """The shapes' step times weighted as an epoch of these pairs would use them: each pair padded
  to the shortest timed row length that holds its longer side (as the loader's buckets pad), the
  steps of each shape counted from its padded positions. Pairs longer than every shape are left
  out (and counted)."""
  bounds = np.array([s["seq_len"] for s in shapes])
  longer = lengths.max(axis=1)
  shape_of = np.searchsorted(bounds, longer)
  kept = shape_of < len(bounds)
  seconds = flops = real = 0.0
  per_shape = []
  for i, s in enumerate(shapes):
    mine = kept & (shape_of == i)
    steps = mine.sum() * s["seq_len"] / s["target_tokens_per_step"]
    seconds += steps * s["step_sec_median"]
    flops += steps * s["flops_per_step"]
    real += float(lengths[mine, 1].sum())
    per_shape.append({"seq_len": s["seq_len"], "pair_share": float(mine.mean()),
                      "time_share": steps * s["step_sec_median"]})
  for s in per_shape:
    s["time_share"] /= seconds
  return {"pairs": len(lengths), "pairs_longer_than_every_shape": int((~kept).sum()),
          "real_target_tokens_per_sec": real / seconds,
          "target_positions_real": real / sum(
              float((kept & (shape_of == i)).sum()) * b for i, b in enumerate(bounds)),
          "mfu": flops / seconds / (peak * devices * 1e12) if peak else None,
          "per_shape": per_shape}


def benchmark_shapes(cfg: ml_collections.ConfigDict, fns, holder: dict[str, Any],
                     mesh: jax.sharding.Mesh, config: ModelConfig, batch_tokens: int,
                     lengths: list[int], steps: int, warmup: int, peak: float | None,
                     mix: np.ndarray | None) -> dict[str, Any]:
  """The step timed at each row length (full synthetic rows of the batch's token budget, as the
  loader makes for that bucket), and with `mix` their weighted whole."""
  shapes = []
  for length in lengths:
    rows = batching.rows_per_batch(batch_tokens, length, mesh.size * cfg.train.grad_accum_steps)
    batch = partitioning.shard_batch({"src": synthetic_tokens(rows, length, config.vocab_size, 0),
                                      "tgt": synthetic_tokens(rows, length, config.vocab_size, 1)},
                                     mesh)

    def one_step(batch=batch):
      holder["state"], sums = fns.step(holder["state"], batch, dropout_key(cfg))
      return sums

    log.info("Shape %d rows x %d tokens: compiling, then %d steps", rows, length, steps)
    compile_sec = timed(one_step, 1)[0]
    timed(one_step, warmup)
    times = spread(timed(one_step, steps))
    tokens = rows * length
    flops = training_flops_per_target_token(config, length, length) * tokens
    shapes.append({"seq_len": length, "rows": rows, "target_tokens_per_step": tokens,
                   "compile_sec": round(compile_sec, 2), "step_sec_median": times["median"],
                   "step_sec_p10": times["p10"], "step_sec_p90": times["p90"],
                   "target_tokens_per_sec": tokens / times["median"], "flops_per_step": flops,
                   "mfu": flops / times["median"] / (peak * mesh.size * 1e12) if peak else None})
  result = {"shapes": shapes}
  if mix is not None:
    result["mix"] = mix_figures(shapes, mix, peak, mesh.size)
  return result


def step_figures(cfg: ml_collections.ConfigDict, config: ModelConfig, mesh: jax.sharding.Mesh,
                 params: Any, rows: int, seq_len: int, compile_sec: float, times: dict[str, float],
                 loss: float, peak_tflops: float | None, measure_peak: bool) -> dict[str, Any]:
  """What the synthetic steps' timings say: the setup, tokens/s, analytic TFLOP/s and MFU."""
  tokens_per_step = rows * seq_len
  flops_per_step = training_flops_per_target_token(config, seq_len, seq_len) * tokens_per_step
  device_kind = jax.devices()[0].device_kind
  peak, peak_source = device_peak(peak_tflops, measure_peak, config.dtype, device_kind)
  achieved = flops_per_step / times["median"] / 1e12
  return {
      "backend": jax.default_backend(), "device": device_kind, "devices": mesh.size,
      "processes": jax.process_count(), "mesh": dict(mesh.shape), "dtype": cfg.model.dtype,
      "attention": cfg.model.attention, "remat": cfg.model.remat,
      "scan_layers": cfg.model.scan_layers, "grad_accum_steps": cfg.train.grad_accum_steps,
      "parameters": sum(x.size for x in jax.tree.leaves(params)),
      "rows": rows, "seq_len": seq_len, "target_tokens_per_step": tokens_per_step,
      "compile_sec": round(compile_sec, 2),
      "step_sec_median": times["median"], "step_sec_min": times["min"],
      "step_sec_max": times["max"], "step_sec_p10": times["p10"], "step_sec_p90": times["p90"],
      "step_spread_pct": times["spread_pct"],
      "target_tokens_per_sec": tokens_per_step / times["median"],
      "flops_per_step": flops_per_step, "analytic_tflops_per_sec": achieved,
      "peak_tflops_per_device": peak, "peak_source": peak_source if peak else None,
      "mfu": achieved / (peak * mesh.size) if peak else None,
      "floor_step_sec": flops_per_step / (peak * mesh.size * 1e12) if peak else None,
      "loss": loss,
  }


def benchmark_real_batches(cfg: ml_collections.ConfigDict, fns, holder: dict[str, Any],
                           mesh: jax.sharding.Mesh, count: int) -> dict[str, Any]:
  """The step on the config's own training batches (length buckets and their padding), as the run's
  log counts it: real (non-padding) target tokens per second. Every batch shape among the first
  `count` batches is compiled before timing; the compile time is reported apart."""
  with tempfile.TemporaryDirectory() as workdir:
    _, train_pipeline, _ = training_inputs(cfg, Path(workdir), num_devices=jax.device_count())
    with contextlib.closing(train_pipeline.batches()) as stream:
      batches = [batch for _, (batch, _) in zip(range(count), stream)]
  dropout_rng = dropout_key(cfg)
  step = lambda batch: fns.step(holder["state"], partitioning.shard_batch(batch, mesh), dropout_rng)
  first_of_shape = {batch["tgt"].shape: batch for batch in batches}
  log.info("Compiling the train step for %d batch shapes of the config's data",
           len(first_of_shape))
  t = time.perf_counter()
  for batch in first_of_shape.values():
    holder["state"], sums = step(batch)
  jax.block_until_ready(sums)
  compile_sec = time.perf_counter() - t
  log.info("Timing %d steps on the config's training batches", count)
  real = sum(int((batch["tgt"] != PAD_ID).sum()) for batch in batches)
  t = time.perf_counter()
  for batch in batches:
    holder["state"], sums = step(batch)
  jax.block_until_ready(sums)
  seconds = time.perf_counter() - t
  return {"real_batches": count, "real_batch_shapes": len(first_of_shape),
          "real_compile_sec": round(compile_sec, 2), "real_step_sec_mean": seconds / count,
          "real_target_tokens_per_sec": real / seconds,
          "real_target_padding_fraction": 1 - real / sum(b["tgt"].size for b in batches)}


def benchmark_checkpoint(holder: dict[str, Any], one_step, saves: int,
                         directory: str | None) -> dict[str, Any]:
  """How long an asynchronous checkpoint save stops training, as the trainer saves.

  Each round: a step, then `checkpoints.save` (timed: the blocking part, the copy off the
  accelerator), a step while the checkpoint is written in the background (timed), and the wait
  for the write to finish (timed from the save: the whole write). Writes under `directory` (the
  disk of your workdirs; default: a temporary directory) and removes it again.
  """
  with tempfile.TemporaryDirectory(dir=directory) as workdir:
    mngr = checkpoints.manager(workdir, keep=1)
    blocking, write, during = [], [], []
    for i in range(saves):
      jax.block_until_ready(one_step())
      t = time.perf_counter()
      checkpoints.save(mngr, i + 1, holder["state"], {"epoch": 0, "batch": i})
      blocking.append(time.perf_counter() - t)
      during.append(timed(one_step, 1)[0])
      checkpoints.finish_saves(mngr)
      write.append(time.perf_counter() - t)
    size = sum(f.stat().st_size for f in Path(workdir, checkpoints.CHECKPOINT_DIR).rglob("*")
               if f.is_file())
  return {"checkpoint_saves": saves, "checkpoint_bytes": size,
          "checkpoint_blocking_sec_median": statistics.median(blocking),
          "checkpoint_blocking_sec_max": max(blocking),
          "checkpoint_write_sec_median": statistics.median(write),
          "step_sec_during_checkpoint_write_median": statistics.median(during)}


def main(argv: list[str]) -> None:
  if FLAGS.config is None:
    raise app.UsageError("pass --config=configs/wmt14_ende.py:base (or another config)")
  initialize_distributed()
  # Where the results go: checked and made now, not found wanting after minutes of timing.
  if FLAGS.checkpoint_dir:
    writable_directory(FLAGS.checkpoint_dir, "--checkpoint_dir")
  if FLAGS.output:
    writable_directory(writable_file(FLAGS.output, "--output").parent, "--output")
  if FLAGS.loop:
    from transformer.accelerators.loop_benchmark import benchmark_loop
    result = benchmark_loop(FLAGS.config, FLAGS.loop)
  elif FLAGS.input_pipeline:
    result = benchmark_input(FLAGS.config, FLAGS.batches, [int(w) for w in FLAGS.loader_workers],
                             [float(ms) for ms in FLAGS.stub_step_ms], FLAGS.stub_steps,
                             FLAGS.token_cache, FLAGS.busy_cores)
  else:
    result = benchmark(FLAGS.config, FLAGS.batch_tokens, FLAGS.seq_len, FLAGS.steps,
                       FLAGS.warmup, FLAGS.decode_sentences, FLAGS.peak_tflops, FLAGS.measure_peak,
                       FLAGS.checkpoint_saves, FLAGS.checkpoint_dir, FLAGS.real_batches,
                       FLAGS.reference, shape_lengths(FLAGS.config, FLAGS.shapes) if FLAGS.shapes
                       else None, length_mix(FLAGS.mix) if FLAGS.mix else None)
  text = json.dumps(result)
  if jax.process_index() == 0:
    print(text)
  if FLAGS.output and jax.process_index() == 0:
    Path(FLAGS.output).write_text(text + "\n")


def run() -> None:
  """Console-script entry point."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.")
  flags.DEFINE_integer("batch_tokens", None, "Target tokens per step (as many source tokens; "
                       "default: the config's data.tokens_per_batch).", lower_bound=1)
  flags.DEFINE_integer("seq_len", 32, "Tokens per sentence of the synthetic batch.", lower_bound=1)
  flags.DEFINE_integer("steps", 20, "Timed steps.", lower_bound=1)
  flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.", lower_bound=0)
  flags.DEFINE_integer("decode_sentences", -1, "Sentences to decode with greedy and beam search "
                       "(-1 = the config's whole evaluation split, or 1000 synthetic ones; 0 = skip).", lower_bound=-1)
  flags.DEFINE_float("peak_tflops", None, "Peak TFLOP/s per device for MFU (default: the table).", lower_bound=0.0)
  flags.DEFINE_bool("measure_peak", False, "Measure the peak with a large matmul instead.")
  flags.DEFINE_integer("checkpoint_saves", 3, "Timed asynchronous checkpoint saves (0 = skip).", lower_bound=0)
  flags.DEFINE_string("checkpoint_dir", None, "Where to write them (default: a temporary "
                      "directory); put it on the disk of your workdirs.")
  flags.DEFINE_integer("reference", 0, "Also decode this many of the beam search's sentences with "
                       "reference.beam_search (full forward passes, no cache) and report whether "
                       "the hypotheses and scores agree (slow: a check, not a timing).", lower_bound=0)
  flags.DEFINE_integer("real_batches", 0, "Also time this many steps on the config's own training "
                       "batches (padding included; all their shapes compiled first) and report "
                       "real target tokens/s, the figure the training log prints.", lower_bound=0)
  flags.DEFINE_string("shapes", None, "Also time the step at these row lengths, as the real loader "
                      "makes them: 'buckets' (every length bucket up to data.max_len), 'packed' "
                      "(rows of data.pack_length) or lengths like 8,16,32,64,128,256; tokens/s and "
                      "MFU per shape.")
  flags.DEFINE_string("mix", None, "With --shapes: weight the shapes as an epoch of these pairs "
                      "would (a token cache directory, or a JSON length histogram such as "
                      "experiments/results/input_pipeline/standin_lengths.json): the mixed tokens/s "
                      "and MFU.")
  flags.DEFINE_string("output", None, "Also write the JSON result to this file.")
  define_distributed_flags()
  flags.DEFINE_bool("input_pipeline", False, "Time the config's training loader instead "
                    "(transformer/data/input_benchmark.py).")
  flags.DEFINE_integer("batches", 200, "Batches to time with --input_pipeline.", lower_bound=1)
  flags.DEFINE_integer("loop", 0, "Time the real training loop for this many steps (after one "
                       "untimed progress interval) beside the step alone on the same batches "
                       "(transformer/accelerators/loop_benchmark.py).", lower_bound=0)
  flags.DEFINE_list("loader_workers", ["0"], "With --input_pipeline: Grain worker counts to time.")
  flags.DEFINE_list("stub_step_ms", ["50", "12"], "With --input_pipeline: the stand-in training "
                    "loop's step times (ms).")
  flags.DEFINE_integer("busy_cores", 0, "With --input_pipeline: measure beside this many processes "
                       "that keep a core each busy (a loaded host: a CPU step, a GPU host's own "
                       "work); the record holds the load average.", lower_bound=0)
  flags.DEFINE_integer("stub_steps", 200, "With --input_pipeline: steps of the stand-in loop.", lower_bound=1)
  flags.DEFINE_string("token_cache", None, "With --input_pipeline: time this token cache (e.g. "
                      "a synthetic one) with the config's batch settings.")
  run_program("transformer-benchmark", main)


if __name__ == "__main__":
  run()
