"""The train and validation steps compiled before the loop, for every batch shape the data fills,
all at once.

A length-bucketed loader fills a handful of batch shapes (rows x padded length), all known before
the first step. Compiled as the loop meets them, each compilation (on a GPU, with XLA's autotuning
of every fusion) stops training in turn. Here each shape is lowered in the main thread (tracing is
quick) and compiled ahead of time (`jax.stages.Lowered.compile`) in a pool of threads, one per
usable core (XLA's compiler releases the GIL); the loop then only dispatches the executables. They
are the programs `jax.jit` would have built for the same arguments, so training is bit-identical.
JAX's persistent compilation cache serves these compilations like any other (a second process
loads them; JAX also keeps XLA's GPU autotuning results there). A shape the set lacks (the data of
a resumed run changed, say) is compiled when it is met, with one log line.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from transformer import partitioning, stops
from transformer.hardware import usable_cpus
from transformer.metrics import COMPILE_EVENTS
from transformer.training.step import dropout_key

log = logging.getLogger("transformer")

Shape = tuple[tuple[str, tuple[int, ...], str], ...]  # (key, shape, dtype) of each batch array


def shape_of(batch: dict[str, Any]) -> Shape:
  return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))


def abstract_batch(template: dict[str, np.ndarray], rows: int, length: int,
                   mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """A global batch of `rows` x `length` with the keys and dtypes of `template` (a batch as the
  loader makes it) and the layout `partitioning.shard_batch` gives."""
  sharding = partitioning.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct((rows, length), v.dtype, sharding=sharding)
          for k, v in template.items()}


def learning_rate(schedule: Callable[[int], Any]) -> Callable[[int], float]:
  """The schedule compiled once (evaluated op by op, it would compile each of its operations the
  first time a progress line asks for the learning rate)."""
  compiled = jax.jit(schedule).lower(0).compile()
  return lambda step: float(compiled(step))


def loop_steps(run: Any, eval_fn: Callable, stopped: Callable[[], str | None] = lambda: None
               ) -> tuple[PerShape, PerShape]:
  """The train step and `eval_fn` (the validation step) of a started run (train.Run), compiled for
  every shape of its training batches (`Loader.batch_shapes`) and of its validation batches, all
  at once: what the loop calls. `stopped` names a stop signal received meanwhile (None: none);
  one ends the compiling with stops.Stopped, as no step has been trained since the checkpoint."""
  step, validation = PerShape(run.fns.step, "train step"), PerShape(eval_fn, "validation step")
  if run.first_batch is None or not run.cfg.train.compile_ahead:  # nothing to train, or jit's way
    return step, validation
  mesh, processes = run.mesh, jax.process_count()
  healthy = jax.ShapeDtypeStruct((), np.bool_, sharding=partitioning.replicated(mesh))
  template = run.first_batch[0]
  train_args = [(run.fns.abstract_state, abstract_batch(template, rows, length, mesh),
                 dropout_key(run.cfg), healthy)
                for rows, length in run.train_pipeline.batch_shapes()]
  eval_args = [(run.fns.abstract_state.params,
                abstract_batch(b, b["src"].shape[0] * processes, b["src"].shape[1], mesh))
               for b in run.eval_batches]
  lowered = step.lower_all(train_args)
  if name := stopped():
    raise stops.Stopped(name)
  compile_all(lowered + validation.lower_all(eval_args), stopped=stopped)
  return step, validation


class PerShape:
  """`fn` (jitted, with `.lower`), called as `fn(first, batch, *rest)`, through the executables
  `lower_all` and `compile_all` made for its batch shapes (with none, it is `fn` itself); `late`
  counts the shapes it had to compile when called."""

  def __init__(self, fn: Callable, name: str):
    self.fn, self.name = fn, name
    self.executables: dict[Shape, Any] = {}
    self.late = 0

  def lower_all(self, args: Sequence[tuple]) -> list[tuple[PerShape, Shape, Any]]:
    """`fn` lowered for each argument tuple of `args` (arrays or ShapeDtypeStructs, the batch
    second) whose batch shape it has no executable for: (self, shape, lowered) for `compile_all`."""
    todo = {shape_of(a[1]): a for a in args if shape_of(a[1]) not in self.executables}
    return [(self, shape, self.fn.lower(*a)) for shape, a in todo.items()]

  @property
  def shapes(self) -> int:
    return len(self.executables)

  def __call__(self, first: Any, batch: dict[str, jax.Array], *rest: Any) -> Any:
    if not self.executables:  # nothing compiled ahead (train.compile_ahead off): jit's own way
      return self.fn(first, batch, *rest)
    shape = shape_of(batch)
    executable = self.executables.get(shape)
    if executable is None:
      self.late += 1
      log.info("The %s meets a batch shape it was not compiled for (%s); compiling it now",
               self.name, ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s, _ in shape))
      executable = self.executables[shape] = self.fn.lower(first, batch, *rest).compile()
    return executable(first, batch, *rest)


def compile_all(lowered: Sequence[tuple[PerShape, Shape, Any]], threads: int | None = None,
                stopped: Callable[[], str | None] = lambda: None) -> float:
  """Compiles what `PerShape.lower_all` lowered, `threads` at a time (default: the usable cores),
  into each PerShape's executables; returns the seconds it took. A stop (`stopped` names its
  signal) or a second Ctrl-C ends it at once, leaving the compilations under way to the exit."""
  if not lowered:
    return 0.0
  t = time.perf_counter()
  threads = max(1, min(len(lowered), threads or usable_cpus()))
  pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="compile")
  futures = [pool.submit(item[2].compile) for item in lowered]
  pending: set = set(futures)
  try:
    while pending:
      _, pending = concurrent.futures.wait(pending, timeout=0.2)
      if pending and (name := stopped()):
        raise stops.Stopped(name)
  finally:
    pool.shutdown(wait=not pending, cancel_futures=True)
  for (owner, shape, _), future in zip(lowered, futures):
    owner.executables[shape] = future.result()
  seconds = time.perf_counter() - t
  jax.monitoring.record_event_duration_secs(COMPILE_EVENTS[-1], seconds)  # (metrics.CompileClock)
  names = {owner.name: sum(1 for o, _, _ in lowered if o is owner) for owner, _, _ in lowered}
  log.info("Compiled %s ahead of the loop in %.1fs (%d at a time)",
           " and ".join(f"the {name} for {n} batch shape(s)" for name, n in names.items()),
           seconds, threads)
  return seconds
