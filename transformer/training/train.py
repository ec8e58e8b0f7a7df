"""Train a translation model from a config, on every accelerator of the machine (or job), with
validation BLEU, checkpoints and exact resumption.

    transformer-train --config=configs/multi30k.py --workdir=runs/m30k
    transformer-train --config=configs/wmt14_ende.py:base --workdir=runs/base --config.train.steps=1000

The loop around the train step (step.py), which is compiled for every batch shape (compiled.py) on a
(data, fsdp, tensor) mesh of all devices of all processes, the state laid out by partitioning.py's
rules and the batch rows split over the data-parallel axes (feed.py places them ahead). The loop
logs a progress line every `train.log_every` steps, computes validation loss, accuracy, perplexity
every `train.eval_every` steps (teacher-forced, cheap; BLEU is the separate evaluation program's
job), saves Orbax checkpoints asynchronously every `train.checkpoint_every` steps and, if
`train.checkpoint_minutes` is set, at the first progress line after that many minutes, and resumes from the
latest readable one when restarted: same parameters, Adam state, step, dropout keys (a function of
seed and step) and input position, so an interrupted run ends bit-identical to an uninterrupted one.

Start-up checks everything (config, data, vocabulary, checkpoints, the first batch) before it writes
anything but the vocabulary. SIGTERM/SIGINT stop after the current step with a checkpoint
(preemption.py); a non-finite loss or gradient stops with the last good state and the batch saved,
or is skipped (nonfinite.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.extend.random
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from transformer import hardware, partitioning, progress, slurm, version
from transformer.cli import (
  define_distributed_flags,
  define_progress_flag,
  initialize_distributed,
  run_program,
)
from transformer.config import validate
from transformer.data import pipeline
from transformer.data import vocab as vocab_lib
from transformer.distributed import check_shared, leader_first
from transformer.errors import UserError
from transformer.files import writable_directory
from transformer.hardware import table_peak
from transformer.metrics import CompileClock, MetricWriter, format_duration
from transformer.model.transformer import ModelConfig, Transformer
from transformer.training import (
    checkpoints,
    compiled,
    early_stop,
    feed,
    init_from,
    params_file,
    preemption,
)
from transformer.training import nonfinite as faults
from transformer.training.step import (
  EmaTrainState,
  TrainFunctions,
  TrainState,
  dropout_key,
  jit_eval_step,
  jit_train_fns,
)

log = logging.getLogger("transformer")

FLAGS = flags.FLAGS
def evaluate_loss(eval_fn, params: Any, batches: Iterable[dict[str, np.ndarray]],
                  mesh: jax.sharding.Mesh) -> dict[str, float]:
  """Teacher-forced validation metrics: per-token NLL, accuracy and perplexity, and the loss the
  step's smoothing makes of them (`loss`: label-smoothed, as the training loss)."""
  totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
  for batch in batches:
    sums = jax.device_get(eval_fn(params, partitioning.shard_batch(batch, mesh)))
    for k in totals:
      totals[k] += float(sums[k])
  nll = totals["nll"] / totals["tokens"]
  return {"loss": totals["loss"] / totals["tokens"], "nll": nll,
          "accuracy": totals["correct"] / totals["tokens"],
          "perplexity": float(np.exp(nll)), "tokens": totals["tokens"]}


# --------------------------------------------------------------------------------------- the loop

def interval_record(step_sums: list[dict[str, np.ndarray]], seconds: float) -> dict[str, float]:
  """Per-token averages of the steps since the last progress line (skipped non-finite updates left
  out), how many steps and target tokens they average (a record written at a stop, or the first
  after a resume, covers part of an interval: metrics.whole_intervals weighs them), R-Drop's KL
  term per token where the run has one, and the throughput of all of them."""
  tokens = sum(float(s["tokens"]) for s in step_sums)
  good = [s for s in step_sums if s.get("finite", 1.0)]
  good_tokens = sum(float(s["tokens"]) for s in good) or float("nan")
  rdrop = {"rdrop_kl": sum(float(s["rdrop_kl"]) for s in good) / good_tokens
           } if step_sums and "rdrop_kl" in step_sums[0] else {}
  return {**rdrop, "loss": sum(float(s["loss"]) for s in good) / good_tokens,
          "nll": sum(float(s["nll"]) for s in good) / good_tokens,
          "accuracy": sum(float(s["correct"]) for s in good) / good_tokens,
          "grad_norm": float(np.mean([s["grad_norm"] for s in good])) if good else float("nan"),
          "steps": len(step_sums), "loss_tokens": 0.0 if not good else good_tokens,
          "tokens": tokens, "tokens_per_sec": tokens / seconds}


def minutes_since(t: float) -> float:
  """Minutes since `t` by process 0's clock, so every process makes the same checkpoint decision."""
  elapsed = np.float64((time.time() - t) / 60)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    elapsed = multihost_utils.broadcast_one_to_all(elapsed)
  return float(elapsed)


@contextlib.contextmanager
def _undone_if_failed(workdir: Path):
  """Start-up creates only the workdir and its vocabulary; if start-up fails (bad data, a broken
  checkpoint, ...) they are removed again, so a failed start leaves the disk as it found it."""
  missing = [p for p in (workdir, *workdir.parents) if not p.exists()]  # deepest first
  vocabs = [workdir / name for name in (vocab_lib.VOCAB_FILE, vocab_lib.MARIAN_VOCAB_FILE)]
  had = [path.exists() for path in vocabs]
  try:
    yield
  except BaseException:
    if jax.process_index() == 0:
      for path in (path for path, existed in zip(vocabs, had) if not existed):
        path.unlink(missing_ok=True)
      for directory in missing:
        with contextlib.suppress(OSError):
          directory.rmdir()  # only if empty
    raise


@dataclasses.dataclass
class Run:
  """Everything a started run needs; made by `start_run` before anything is written."""
  cfg: ml_collections.ConfigDict
  workdir: Path
  vocab: Any
  train_pipeline: pipeline.Loader
  eval_batches: list[dict[str, np.ndarray]]
  mesh: jax.sharding.Mesh
  model: Transformer
  fns: TrainFunctions
  state: TrainState
  data_state: pipeline.PipelineState
  batches: Any          # the training batch generator, positioned at data_state
  first_batch: Any      # its first (batch, state after it), already read (None if nothing to do)
  broken_after: int | None  # restored a checkpoint older than broken ones: their steps are > this


def start_run(cfg: ml_collections.ConfigDict, workdir: Path, allow_config_change: bool = False
              ) -> Run:
  """Checks what can go wrong before training (data, vocabulary, checkpoints, the first batch) and
  restores or initializes the state; writes nothing but the workdir and its vocabulary."""
  writable_directory(workdir, "--workdir")
  init_from.copy_vocabulary(cfg, workdir)
  vocab, train_pipeline, eval_batches = pipeline.training_inputs(cfg, workdir,
                                                                 num_devices=jax.device_count())
  mesh = partitioning.make_mesh(cfg, vocab.get_piece_size())
  model = Transformer(ModelConfig.from_config(cfg.model, vocab.get_piece_size()))
  fns = jit_train_fns(cfg, model, mesh)
  data_state, broken_after = pipeline.PipelineState(), None
  with contextlib.closing(checkpoints.manager(workdir, read_only=True)) as reader:
    saved = reader.all_steps()
    if saved:
      state, data = checkpoints.restore(reader, fns.abstract_state, with_data=True)
  if saved:
    data_state = train_pipeline.resume_state(data, allow_config_change)
    if int(state.step) < max(saved):
      broken_after = int(state.step)
    log.info("Resumed from the checkpoint at step %d (data: epoch %d, batch %d of %d)",
             int(state.step), data_state.epoch, data_state.batch, train_pipeline.num_batches)
  else:
    state = init_from.start_state(cfg, fns.init(jax.random.key(cfg.seed)))
  batches = train_pipeline.batches(data_state)
  first = next(batches) if int(state.step) < cfg.train.steps else None  # e.g. all pairs filtered
  return Run(cfg, workdir, vocab, train_pipeline, eval_batches, mesh, model, fns, state, data_state,
             batches, first, broken_after)


def train_and_evaluate(cfg: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> dict[str, Any]:
  """Trains (or resumes) the run in `workdir` up to `cfg.train.steps`; returns a summary.

  Raises preemption.Interrupted after a SIGTERM/SIGINT (a checkpoint saved), faults.NonFiniteError
  at a non-finite loss or gradient (train.on_nonfinite='stop'), and ConfigError, DataError or
  CheckpointError for bad input, before writing anything.
  """
  cfg = init_from.with_architecture(validate(cfg))
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise UserError(f"--workdir={workdir} is a file, not a directory: pass a new directory (or "
                    "the workdir of the run to continue)")
  if params_file.holds_params(workdir):
    raise params_file.ParamsFileError(
        f"--workdir={workdir} keeps a model's parameters only (transformer-average "
        "--params_only), no optimizer state to resume: train in a new --workdir, starting from "
        f"them with --config.train.init_from={workdir} if you wish")
  changed = checkpoints.check_run_config(workdir, cfg, allow_config_change)
  with _undone_if_failed(workdir):
    run = start_run(cfg, workdir, allow_config_change)
  with contextlib.closing(run.batches):  # stops the input pipeline's thread, however we leave
    return _write_and_train(run, changed)


def _write_and_train(run: Run, changed: list[str]) -> dict[str, Any]:
  """Start-up succeeded: from here on the run writes."""
  cfg, workdir, start = run.cfg, run.workdir, int(run.state.step)
  if changed:
    log.warning("Continuing %s with a changed config (--allow_config_change): %s; the old one is "
                "kept as config.until_step%d.json", workdir, ", ".join(changed), start)
  leader_first("run config", lambda: checkpoints.write_run_config(
      workdir, cfg, previous_step=start if changed else None))
  check_shared(workdir / checkpoints.CONFIG_FILE)  # every process sees what process 0 wrote
  if run.broken_after is not None:
    with contextlib.closing(checkpoints.manager(workdir, read_only=True)) as reader:
      moved = leader_first("broken checkpoints",
                           lambda: checkpoints.move_broken(reader, run.broken_after))
    log.warning("Moved the broken checkpoint(s) %s to %s", ", ".join(map(str, moved)),
                workdir / checkpoints.BROKEN_DIR)
  n_params = sum(x.size for x in jax.tree.leaves(run.state.params))
  log.info("Model: %s parameters; %d devices (%s) in %d process(es); mesh %s", f"{n_params:,}",
           run.mesh.size, jax.devices()[0].platform, jax.process_count(),
           " x ".join(f"{axis} {size}" for axis, size in run.mesh.shape.items()))
  # TensorBoard hides what an earlier process logged after the checkpoint this run resumes from.
  # The bar shows on process 0's terminal; in a log file the loop's own lines are the progress.
  with (contextlib.closing(checkpoints.manager(workdir, keep=cfg.train.keep_checkpoints)) as mngr,
        preemption.StopRequests() as stop,
        MetricWriter(workdir, purge_step=start + 1 if start else None) as writer,
        progress.Progress("training", cfg.train.steps, "steps", initial=start, line_seconds=None,
                          mode=None if jax.process_index() == 0 else "off") as bar,
        CompileClock() as compiling):
    return _Loop(run, mngr, stop, writer, bar, n_params, compiling).train()


class _Loop:
  """The steps from the run's state to `train.steps`, with what is due after each: a progress line,
  validation, a checkpoint, a stop. Metrics stay on the device until a progress line fetches them,
  so the host never waits on the device between steps."""

  def __init__(self, run: Run, mngr, stop: preemption.StopRequests, writer: MetricWriter,
               bar: progress.Progress, n_params: int, compiling: CompileClock):
    self.run, self.mngr, self.stop, self.writer, self.bar = run, mngr, stop, writer, bar
    self.n_params, self.compiling = n_params, compiling
    self.launch_sec = hardware.seconds_since_launch()  # the start-up: imports, data, state
    # Where the loop's wall time goes besides the steps (compiling counted apart from the rest).
    self.validation_sec = self.checkpoint_sec = self.wait_sec = 0.0
    self.peak = table_peak(jax.devices()[0].device_kind)  # None off the table (CPUs): no MFU then
    self.watch = faults.NonFiniteWatch(skip=run.cfg.train.on_nonfinite == "skip")
    self.start = int(run.state.step)
    self.t_start = self.interval_start = self.last_save = time.time()
    self.step_fn, self.eval_fn = compiled.loop_steps(  # every shape before the first step
        run, jit_eval_step(run.model, run.mesh, run.cfg.train.label_smoothing),
        stopped=lambda: stop.signal_name)
    self.learning_rate = compiled.learning_rate(run.fns.schedule)
    self.lowered_before_loop = compiling.lowerings
    self.interval_sums, self.interval_flops, self.tokens_seen = [], 0.0, 0.0
    self.interval_real, self.interval_positions = 0.0, 0  # this process's target tokens, padding
    self.interval_wait = 0.0  # seconds the loop waited for its next batch
    self.saved_step = self.start
    self.patience = (early_stop.Patience(run.cfg.train.patience, early_stop.validation_losses(
        run.workdir, up_to=self.start)) if run.cfg.train.patience else None)

  def train(self) -> dict[str, Any]:
    run = self.run
    if self.patience and self.patience.stop_step is not None:
      log.info("Stopped early at step %d (train.patience = %d); nothing to do",
               self.patience.stop_step, run.cfg.train.patience)
      return self.finish(self.patience.stop_step)
    if self.start >= run.cfg.train.steps:
      log.info("Already trained to step %d (train.steps = %d); nothing to do", self.start,
               run.cfg.train.steps)
      return self.finish()
    trained_on = hardware.describe()  # which machine trains which steps
    log.info("Machine: %s", trained_on["machine"])
    self.writer.write("start", self.start, **trained_on, commit=version.commit())
    batches = itertools.chain([run.first_batch], run.batches)
    with feed.DeviceFeed(batches, run.mesh, run.model.config,
                         depth=run.cfg.train.device_prefetch) as placed:
      return self._steps(placed)

  def _steps(self, placed: feed.DeviceFeed) -> dict[str, Any]:
    run, cfg, total = self.run, self.run.cfg, self.run.cfg.train.steps
    state, data_state = run.state, run.data_state
    dropout_rng = dropout_key(cfg)
    healthy = jax.device_put(True, partitioning.replicated(run.mesh))  # as the step returns it
    minutes = cfg.train.checkpoint_minutes  # the wall-clock cadence; 0 = off
    for step in range(self.start, total):
      waited = time.perf_counter()
      batch = next(placed)
      self.interval_wait += time.perf_counter() - waited
      state, sums = self.step_fn(state, batch.arrays, dropout_rng, healthy)
      healthy = sums["healthy"]  # stays on the device: see step.train_step
      self.watch.record(step + 1, batch.host, data_state, sums)
      data_state = batch.data_state
      self.interval_sums.append(sums)
      self.interval_flops += batch.flops * (2 if cfg.train.rdrop_alpha else 1)  # R-Drop: 2 passes
      self.interval_positions += batch.positions
      self.interval_real += batch.real_tokens
      self.bar.update(1, tokens=batch.real_tokens * jax.process_count())
      done = step + 1
      log_due = done % cfg.train.log_every == 0 or done == total
      eval_due = done % cfg.train.eval_every == 0 or done == total
      save_due = (done % cfg.train.checkpoint_every == 0 or done == total
                  or (minutes and log_due and minutes_since(self.last_save) >= minutes))
      stop_due = self.stop.requested(done)
      if not (log_due or eval_due or save_due or stop_due):
        continue
      bad = self.watch.check()  # the device catches up here anyway
      if bad is not None:
        faults.stop_with_evidence(run, self.mngr, state, bad, self.writer)
      if log_due or (stop_due and self.interval_sums):  # a stop records its part-interval too
        self.log_progress(done, data_state)
      early = eval_due and self.validate(done, state)
      if early and self.interval_sums:  # the steps since the last progress line
        self.log_progress(done, data_state)
      if save_due or ((stop_due or early) and self.saved_step != done):
        self.save(done, state, data_state)
      if early:
        return self.stop_early(done)
      if stop_due:
        checkpoints.finish_saves(self.mngr)
        self.writer.write("interrupted", done, signal=self.stop.signal_name)
        raise preemption.Interrupted(
            f"stopped by {self.stop.signal_name} after step {done}/{total}; the checkpoint at step "
            f"{done} is in {self.mngr.directory}. Run the same command again to resume")
    return self.finish()

  def log_progress(self, done: int, data_state: pipeline.PipelineState) -> None:
    """The steps since the last progress line: a metrics record and a log line."""
    now = time.time()
    record = interval_record(jax.device_get(self.interval_sums), now - self.interval_start)
    record.update(learning_rate=self.learning_rate(done - 1),
                  epoch=self.run.train_pipeline.epoch_fraction(data_state),
                  elapsed=now - self.t_start, skipped_updates=self.watch.skipped,
                  tflops_per_sec=self.interval_flops / (now - self.interval_start) / 1e12,
                  target_padding=1 - self.interval_real / max(self.interval_positions, 1),
                  data_wait=self.interval_wait / (now - self.interval_start))
    if self.peak:
      record["mfu"] = record["tflops_per_sec"] / (self.peak * jax.device_count())
    self.tokens_seen += record.pop("tokens")
    self.writer.write("train", done, **record)
    total = self.run.cfg.train.steps
    eta = record["elapsed"] / (done - self.start) * (total - done)
    mfu = f" | MFU {record['mfu']:.1%}" if "mfu" in record else ""
    log.info("step %d/%d | loss %.3f | nll %.3f | lr %.2e | %.0f tok/s | pad %.0f%% | "
             "data wait %.1f%% | %.2f TFLOP/s%s | elapsed %s | ETA %s", done, total,
             record["loss"], record["nll"], record["learning_rate"], record["tokens_per_sec"],
             100 * record["target_padding"], 100 * record["data_wait"], record["tflops_per_sec"],
             mfu,
             format_duration(record["elapsed"]), format_duration(eta))
    self.bar.update(0, loss=record["loss"])
    checkpoints.check_saves(self.mngr)  # a failed background write (disk full) stops the run here
    self.wait_sec += self.interval_wait
    self.interval_start, self.interval_sums, self.interval_flops = time.time(), [], 0.0
    self.interval_real, self.interval_positions, self.interval_wait = 0.0, 0, 0.0

  def validate(self, done: int, state: TrainState) -> bool:
    """Teacher-forced validation of the parameters (and of their moving average, if kept); True if
    the run stops early here (train.patience)."""
    run = self.run
    t, compiled = time.perf_counter(), self.compiling.seconds
    metrics = evaluate_loss(self.eval_fn, state.params, run.eval_batches, run.mesh)
    ema = ""
    if isinstance(state, EmaTrainState):
      ema_metrics = evaluate_loss(self.eval_fn, state.ema_params, run.eval_batches, run.mesh)
      metrics.update({f"ema_{k}": v for k, v in ema_metrics.items() if k != "tokens"})
      ema = (f" | EMA: nll {ema_metrics['nll']:.3f} | perplexity {ema_metrics['perplexity']:.2f}"
             f" | accuracy {ema_metrics['accuracy']:.3f}")
    self.validation_sec += time.perf_counter() - t - (self.compiling.seconds - compiled)
    self.writer.write("eval", done, **metrics)
    log.info("eval at step %d | nll %.3f | perplexity %.2f | accuracy %.3f%s", done,
             metrics["nll"], metrics["perplexity"], metrics["accuracy"], ema)
    return self.patience is not None and self.patience.update(done, metrics["loss"])

  def stop_early(self, done: int) -> dict[str, Any]:
    best_step, best = self.patience.best()
    self.writer.write(early_stop.STOP_EVENT, done, best_step=best_step, best_loss=best)
    log.info("Stopping early at step %d: %d validations without a loss below %.4f (step %d)",
             done, self.run.cfg.train.patience, best, best_step)
    return self.finish(done)

  def save(self, step: int, state: TrainState, position: pipeline.PipelineState) -> None:
    t = time.perf_counter()
    checkpoints.save(self.mngr, step, state, self.run.train_pipeline.position(position))
    blocked = time.perf_counter() - t
    self.checkpoint_sec += blocked
    self.writer.write("checkpoint", step, blocking_sec=blocked)
    log.info("checkpoint at step %d (training paused %.3fs; written in the background)", step,
             blocked)
    self.last_save, self.saved_step = time.time(), step

  def finish(self, last: int | None = None) -> dict[str, Any]:
    """The summary of a run that reached train.steps, or stopped early at step `last`."""
    t = time.perf_counter()
    checkpoints.finish_saves(self.mngr)
    self.checkpoint_sec += time.perf_counter() - t
    total, train_time = last or self.run.cfg.train.steps, time.time() - self.t_start
    summary = {"steps": total, "resumed_from": self.start, "train_time_sec": train_time,
               "tokens_per_sec": (self.tokens_seen / train_time if train_time and self.tokens_seen
                                  else None),
               "skipped_updates": self.watch.skipped, "parameters": self.n_params,
               "shapes_compiled": self.step_fn.shapes + self.eval_fn.shapes,
               "compiled_in_loop": self.compiling.lowerings - self.lowered_before_loop,
               **self.wall_split(train_time)}
    if total > self.start:
      self.writer.write("summary", total, **summary)
      log.info("Trained steps %d-%d in %s (%.0f target tokens/s; besides the steps: compiling "
               "%.0fs, validation %.0fs, checkpoints %.1fs, waiting for data %.1fs). Next: "
               "transformer-eval --workdir=%s", self.start, total, format_duration(train_time),
               summary["tokens_per_sec"], summary["compile_sec"], summary["validation_sec"],
               summary["checkpoint_sec"], summary["data_wait_sec"], self.run.workdir)
    return summary

  def wall_split(self, train_time: float) -> dict[str, float | None]:
    """Where the loop's `train_time` went: compiling (tracing, lowering, XLA or the persistent
    cache), validation, checkpoints (the loop's pauses and the final wait), waiting for data, and
    the steps (the rest); `startup_sec`: the process's seconds before the loop (None off Linux)."""
    split = {"compile_sec": self.compiling.seconds, "validation_sec": self.validation_sec,
             "checkpoint_sec": self.checkpoint_sec, "data_wait_sec": self.wait_sec}
    return {**split, "steps_sec": train_time - sum(split.values()),
            "startup_sec": self.launch_sec}


# ---------------------------------------------------------------------------------- command line

def main(argv: list[str]) -> None:
  if FLAGS.config is None or FLAGS.workdir is None:
    raise app.UsageError("pass --config=configs/multi30k.py (or another config) and --workdir=DIR")
  if FLAGS.print_sbatch:
    print(slurm.train_script(validate(FLAGS.config), sys.argv, FLAGS.sbatch, FLAGS.workdir), end="")
    return
  try:
    initialize_distributed()
    progress.configure(FLAGS.progress)
    train_and_evaluate(FLAGS.config, FLAGS.workdir, FLAGS.allow_config_change)
  except preemption.Interrupted as e:
    print(f"transformer-train: {e}", file=sys.stderr)
    sys.exit(preemption.EXIT_INTERRUPTED)


def run() -> None:
  """Console-script entry point (flags are defined here, so importing this module defines none)."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file, e.g. "
                                  "configs/multi30k.py or configs/wmt14_ende.py:big.")
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary and metrics (shared "
                      "by all processes of a multi-host job).")
  flags.DEFINE_bool("allow_config_change", False, "Continue a workdir whose run has a different "
                    "model or data config (e.g. fine-tuning with another dropout or data); the old "
                    "config.json is kept as config.until_step<N>.json.")
  define_distributed_flags()
  define_progress_flag()
  slurm.define_flags()
  run_program("transformer-train", main)


if __name__ == "__main__":
  run()
