"""Per-operation time of a compiled JAX program, from a jax.profiler trace: shared by the profiles
of the training step (step_profile) and of decoding (decode_profile)."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
from collections.abc import Callable

import jax


def traced_ops(run: Callable[[], object], hlo: str, keep_dir: str | None = None) -> list[dict]:
  """The trace events of XLA's ops while `run()` executes the program whose compiled HLO text is
  `hlo` (xla_ops). `keep_dir`: write the trace there and keep it (for TensorBoard or Perfetto)
  rather than in a temporary directory."""
  with tempfile.TemporaryDirectory() as scratch:
    trace_dir = keep_dir or scratch
    jax.profiler.start_trace(trace_dir)
    run()
    jax.profiler.stop_trace()
    return xla_ops(trace_events(trace_dir), hlo)


def trace_events(trace_dir: str) -> list[dict]:
  """The events of the newest trace jax.profiler wrote under `trace_dir`."""
  with gzip.open(max(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))) as f:
    return json.load(f)["traceEvents"]


def xla_ops(events: list[dict], hlo: str) -> list[dict]:
  """XLA's ops among a trace's `events`, each with its JAX op (`op`: the `op_name` metadata it was
  compiled from, layers merged as `layer_*`) beside the trace's thread (`tid`), start (`ts`) and
  duration (`dur`), in µs. On a CPU an op's event is named by its HLO instruction (`fusion.12`); a
  GPU kernel's event is named by the kernel and carries the instruction as its `hlo_op` argument
  (or, when a CUDA graph ran it, the graph's; then kernel_instruction reads the kernel's name);
  where a trace has such device events, only they count (the host's events for the same ops are
  their launches). The runtime's own events (`PjitFunction(train_step)`,
  `CommonPjRtLoadedExecutable::...`) enclose the ops they run and are left out."""
  op_names = dict(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = .*?metadata=\{op_name=\"([^\"]+)\"", hlo,
                             re.MULTILINE))
  instructions = set(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = ", hlo, re.MULTILINE))
  device = [e for e in events if e.get("args", {}).get("hlo_op")]
  ops = []
  for event in device or events:
    name = event.get("args", {}).get("hlo_op") or event.get("name", "")
    if device and name.startswith("command_buffer"):  # a kernel run by a CUDA graph
      name = kernel_instruction(event["name"], instructions)
    if event.get("ph") == "X" and (name in op_names or re.fullmatch(r"[a-z_]+(\.\d+)?", name)
                                   or name.startswith(LIBRARY_KERNEL)):
      op = op_names.get(name, name)
      op = re.sub(r"layers?_\d+", "layer_*", re.sub(r"^(jit\([^)]*\)/)+", "", op))
      ops.append({"op": op, "tid": event["tid"], "ts": event["ts"], "dur": event["dur"]})
  return ops


LIBRARY_KERNEL = "library kernel: "


def kernel_instruction(kernel: str, instructions: set[str]) -> str:
  """The HLO instruction a GPU kernel ran for, from the kernel's name: XLA names a fusion's kernel
  after the instruction with '.' as '_' (`input_reduce_fusion_346` for `input_reduce_fusion.346`).
  A library's kernel (cuBLAS `nvjet_*`, cuDNN `*sdpa*`) has no such name and is kept as
  `library kernel: NAME`."""
  for candidate in (kernel, re.sub(r"_(\d+)$", r".\1", kernel)):
    if candidate in instructions:
      return candidate
  return LIBRARY_KERNEL + kernel


def op_times(ops: list[dict], calls: int) -> collections.Counter:
  """Milliseconds per call of each JAX op in `ops` (traced_ops of `calls` calls), summed over
  threads."""
  per_op: collections.Counter = collections.Counter()
  for event in ops:
    per_op[event["op"]] += event["dur"] / calls / 1e3
  return per_op


def concurrency(ops: list[dict]) -> dict[int, float]:
  """Seconds of the traced span during which 0, 1, 2, ... ops ran at once: how much of the wall
  time the cores spent idle (between ops: the runtime's own work) or alone."""
  edges = sorted([(e["ts"], 1) for e in ops] + [(e["ts"] + e["dur"], -1) for e in ops])
  seconds: collections.Counter = collections.Counter()
  running, last = 0, edges[0][0]
  for t, change in edges:
    seconds[running] += (t - last) / 1e6
    running, last = running + change, t
  return dict(sorted(seconds.items()))


def print_breakdown(per_op: collections.Counter, part_of: Callable[[str], str], whole: str,
                    top: int) -> None:
  """The op time summed by `part_of(op)` as a markdown table (share of the total), then the `top`
  single ops with the most time; `whole` names what was traced ('step', 'search')."""
  total = sum(per_op.values())
  by_part: collections.Counter = collections.Counter()
  for op, ms in per_op.items():
    by_part[part_of(op)] += ms
  print(f"\nop time {total:.0f} ms per {whole} (summed over threads)\n")
  print(f"| part of the {whole} | op time | share |\n|---|---|---|")
  for name, ms in by_part.most_common():
    print(f"| {name} | {ms:.0f} ms | {ms / total:.0%} |")
  print(f"\nThe {top} single operations with the most time:")
  for op, ms in per_op.most_common(top):
    print(f"  {ms:7.1f} ms  {op[:150]}")
