"""What the loader delivers on this host: `transformer-benchmark --input_pipeline` runs this.

    transformer-benchmark --config=configs/standin_ende.py:base,data/standin_ende --input_pipeline \
        --loader_workers=0,1,2 --stub_step_ms=50,12 --output=input.json
    transformer-benchmark --config=configs/wmt14_enfr.py:base --input_pipeline \
        --config.data.vocab_size=37000 --token_cache=/data/synthetic_40m   # token_cache.write_synthetic
    ... --busy_cores=2                            # the same beside 2 processes that keep a core busy

For each Grain worker count: real source and target tokens per second over `batches` batches (after
a few untimed ones), the share of positions that are padding, and every batch's real target tokens
(min / median / max); the time from nothing to the first batch and to the first batch of a resumed
run (mid-epoch); the memory of the loader (this process's private and file-backed resident memory,
plus its workers'); and a stand-in training loop whose "step" sleeps for `stub_step_ms`, as a host
waits for its accelerator, with the share of its time and of its steps spent waiting for data.
With `busy` > 0 all of it runs beside that many processes spinning on float work (a host whose
cores the training step or its own bookkeeping keep busy), and the record holds the load average.
Nothing here is asserted by a test: speed lives in benchmarks.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from transformer.data.loader import Loader, PipelineState
from transformer.data.token_cache import TokenCache
from transformer.hardware import memory_mib, usable_cpus
from transformer.host_memory import release_freed_memory
from transformer.tokens import PAD_ID

WARMUP_BATCHES = 3
WAIT_THRESHOLD_SEC = 0.001  # a step "waits on data" when its batch was not ready within this


_SPINNERS: set[int] = set()  # the busy processes of `busy_cores`: not the loader's workers


def children_pids() -> list[int]:
  """This process's descendants (Grain's workers), from /proc; not the busy processes."""
  parents: dict[int, list[int]] = {}
  for entry in Path("/proc").iterdir():
    if entry.name.isdigit():
      try:
        ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        continue
      parents.setdefault(ppid, []).append(int(entry.name))
  out, todo = [], [os.getpid()]
  while todo:
    kids = [pid for pid in parents.get(todo.pop(), []) if pid not in _SPINNERS]
    out += kids
    todo += kids
  return out


def throughput(cache: TokenCache, spec, seed: int, workers: int, batches: int,
               subword: dict[str, Any] | None = None) -> dict[str, Any]:
  """Tokens/s over `batches` batches after a few untimed ones, and the memory of this process
  (before the loader was made, and after) and of its workers."""
  before = memory_mib()
  loader = Loader(cache, spec, seed=seed, workers=workers, subword=subword)
  stream = loader.batches()
  try:
    for _ in range(WARMUP_BATCHES):
      next(stream)
    real_src, real_tgt, positions = 0, 0, 0
    per_batch = []
    t = time.perf_counter()
    for _ in range(batches):
      batch, _ = next(stream)
      tgt = int((batch["tgt"] != PAD_ID).sum())
      real_src += int((batch["src"] != PAD_ID).sum())
      real_tgt += tgt
      positions += batch["tgt"].size
      per_batch.append(tgt)
    seconds = time.perf_counter() - t
    workers_memory = [memory_mib(pid) for pid in children_pids()]
    memory = {k: v for k, v in memory_mib().items() if k != "peak"}
  finally:
    stream.close()
  return {"workers": workers, "batches": batches, "seconds": seconds,
          "target_tokens_per_sec": real_tgt / seconds, "source_tokens_per_sec": real_src / seconds,
          "target_padding_fraction": 1 - real_tgt / positions,
          "real_target_tokens_per_batch": {"min": min(per_batch),
                                           "median": statistics.median(per_batch),
                                           "max": max(per_batch),
                                           "mean": real_tgt / batches},
          "rss_mib": {**memory, "anon_before": before["anon"],
                      "workers_anon": sum(m["anon"] for m in workers_memory)}}


def direct(cache: TokenCache, spec, seed: int, batches: int) -> dict[str, Any]:
  """The batches made by calling the batch function in this thread, without Grain: what the
  gathers alone cost, against which Grain's read-ahead is measured."""
  loader = Loader(cache, spec, seed=seed)
  loader.make(0)  # plans the epoch
  real = 0
  t = time.perf_counter()
  for g in range(1, batches + 1):
    real += int((loader.make(g)["tgt"] != PAD_ID).sum())
  seconds = time.perf_counter() - t
  return {"batches": batches, "seconds": round(seconds, 3), "target_tokens_per_sec": real / seconds,
          "ms_per_batch": 1000 * seconds / batches}


def start_times(cache: TokenCache, spec, seed: int, workers: int) -> dict[str, float]:
  """Seconds from a new loader to its first batch: from the start, and resumed mid-epoch 3."""
  out = {}
  for name, start in (("first_batch_sec", None), ("resume_sec", "mid")):
    t = time.perf_counter()
    loader = Loader(cache, spec, seed=seed, workers=workers)
    state = PipelineState() if start is None else PipelineState(3, loader.num_batches // 2)
    stream = loader.batches(state)
    next(stream)
    out[name] = round(time.perf_counter() - t, 3)
    stream.close()
  return out


def stub_training(cache: TokenCache, spec, seed: int, workers: int, step_ms: float, steps: int,
                  subword: dict[str, Any] | None = None) -> dict[str, Any]:
  """A loop that takes a batch, then "steps" by sleeping `step_ms` (the GIL released, as a host
  waiting for its accelerator): the share of its time and of its steps spent waiting for data."""
  loader = Loader(cache, spec, seed=seed, workers=workers, subword=subword)
  stream = loader.batches()
  try:
    for _ in range(WARMUP_BATCHES):
      next(stream)
    waits = []
    t = time.perf_counter()
    for _ in range(steps):
      w = time.perf_counter()
      next(stream)
      waits.append(time.perf_counter() - w)
      time.sleep(step_ms / 1000)
    seconds = time.perf_counter() - t
  finally:
    stream.close()
  return {"step_ms": step_ms, "workers": workers, "steps": steps,
          "waiting_time_share": sum(waits) / seconds,
          "steps_waiting_share": float(np.mean(np.asarray(waits) > WAIT_THRESHOLD_SEC)),
          "wait_ms_median": 1000 * statistics.median(waits)}


def _spin(seconds: float) -> None:
  """Keeps one core busy with float work (a host's own compute: a CPU step, a GPU host's
  feeding and bookkeeping) until `seconds` have passed."""
  a = np.random.default_rng(0).random((256, 256))
  end = time.time() + seconds
  while time.time() < end:
    a = np.tanh(a @ a)


@contextlib.contextmanager
def busy_cores(count: int, seconds: float = 3600.0):
  """`count` processes that keep a core each busy while the block runs (none for 0)."""
  if not count:
    yield
    return
  context = multiprocessing.get_context("spawn")
  spinners = [context.Process(target=_spin, args=(seconds,), daemon=True) for _ in range(count)]
  for spinner in spinners:
    spinner.start()
    _SPINNERS.add(spinner.pid)
  try:
    yield
  finally:
    for spinner in spinners:
      spinner.kill()
      spinner.join()
      _SPINNERS.discard(spinner.pid)


def run(cache: TokenCache, spec, seed: int, batches: int, workers: list[int],
        stub_step_ms: list[float], stub_steps: int, subword: dict[str, Any] | None = None,
        busy: int = 0) -> dict[str, Any]:
  """Everything above, for a cache and the run's batch settings; beside `busy` processes that keep
  a core each busy (a loaded host), if asked."""
  with busy_cores(busy):
    time.sleep(1.0 if busy else 0.0)  # (the spinners are running before anything is timed)
    result = _run(cache, spec, seed, batches, workers, stub_step_ms, stub_steps, subword)
    result["busy_processes"], result["load_average_1min"] = busy, os.getloadavg()[0]
  return result


def _run(cache: TokenCache, spec, seed: int, batches: int, workers: list[int],
         stub_step_ms: list[float], stub_steps: int, subword: dict[str, Any] | None
         ) -> dict[str, Any]:
  result: dict[str, Any] = {
      "cache": str(cache.directory), "pairs": len(cache), "corpus": cache.meta["corpus"],
      "dropped": cache.meta["dropped"], "mode": spec.mode,
      "tokens_per_batch": spec.tokens_per_batch, "cpus": usable_cpus()}
  loader = Loader(cache, spec, seed=seed)
  result["batches_per_epoch"] = loader.num_batches
  src, tgt = loader.planner.real_share(cache.lengths)
  result["epoch_real_share"] = {"source": src, "target": tgt}
  del loader  # (each measurement below makes its own: the memory figures are one loader's)
  release_freed_memory()
  result.update(start_times(cache, spec, seed, min(workers)))
  result["without_grain"] = direct(cache, spec, seed, batches)
  result["throughput"] = [throughput(cache, spec, seed, w, batches) for w in workers]
  if subword:  # per-sentence sampling: its own rates, and the stub loop samples too
    result["subword_dropout"] = [throughput(cache, spec, seed, w, batches, subword)
                                 for w in workers]
  result["stub_training"] = [stub_training(cache, spec, seed, w, ms, stub_steps, subword)
                             for ms in stub_step_ms for w in workers]
  return result
