"""Per-operation time of a compiled JAX program, from a jax.profiler trace: shared by the profiles
of the training step (step_profile) and of decoding (decode_profile)."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
from collections.abc import Callable, Sequence

import jax


def traced_ops(run: Callable[[], object], hlo: str | Sequence[str], keep_dir: str | None = None,
               calls: Sequence[int] | None = None) -> list[dict]:
  """The trace events of XLA's ops while `run()` executes the program whose compiled HLO text is
  `hlo`, or several programs (xla_ops: `calls`, filled in by `run()`, says which ran when).
  `keep_dir`: write the trace there and keep it (for TensorBoard or Perfetto) rather than in a
  temporary directory."""
  with tempfile.TemporaryDirectory() as scratch:
    trace_dir = keep_dir or scratch
    jax.profiler.start_trace(trace_dir)
    run()
    jax.profiler.stop_trace()
    return xla_ops(trace_events(trace_dir), hlo, calls)


def trace_events(trace_dir: str) -> list[dict]:
  """The events of the newest trace jax.profiler wrote under `trace_dir`."""
  with gzip.open(max(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))) as f:
    return json.load(f)["traceEvents"]


def xla_ops(events: list[dict], hlo: str | Sequence[str], calls: Sequence[int] | None = None
            ) -> list[dict]:
  """XLA's ops among a trace's `events`, each with its JAX op (`op`: the `op_name` metadata it was
  compiled from, layers merged as `layer_*`) beside the trace's thread (`tid`), start (`ts`) and
  duration (`dur`), in µs. On a CPU an op's event is named by its HLO instruction (`fusion.12`); a
  GPU kernel's event is named by the kernel and carries the instruction as its `hlo_op` argument
  (or, when a CUDA graph ran it, the graph's; then kernel_instruction reads the kernel's name);
  where a trace has such device events, only they count (the host's events for the same ops are
  their launches). The runtime's own events (`PjitFunction(train_step)`,
  `CommonPjRtLoadedExecutable::...`) enclose the ops they run and are left out.

  Several programs (`hlo` a sequence) reuse instruction names (each has its `fusion.12`), so an
  event is read against the program that ran it: `calls[i]` is the index in `hlo` of the program
  the i-th execution ran, and a CPU op event's `run_id` names its execution (executions ordered by
  their first op).

  A fusion that contains matrix products (XLA's CPU backend fuses a layer's products, residual adds
  and LayerNorm into one YNNPACK graph, named after its last op) is named by its products, joined
  with ' + ', since they are most of its time."""
  programs = [hlo] if isinstance(hlo, str) else list(hlo)
  op_names = [instruction_ops(text) for text in programs]
  instructions = set(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = ", "\n".join(programs), re.MULTILINE))
  program_of = execution_programs(events, calls) if len(programs) > 1 else {}
  device = [e for e in events if e.get("args", {}).get("hlo_op")]
  ops = []
  for event in device or events:
    if program_of and event.get("args", {}).get("run_id") not in program_of:
      continue  # not an op of a traced execution
    names = op_names[program_of.get(event.get("args", {}).get("run_id"), 0)]
    name = event.get("args", {}).get("hlo_op") or event.get("name", "")
    if device and name.startswith("command_buffer"):  # a kernel run by a CUDA graph
      name = kernel_instruction(event["name"], instructions)
    if event.get("ph") == "X" and (name in names or re.fullmatch(r"[a-z_]+(\.\d+)?", name)
                                   or name.startswith(LIBRARY_KERNEL)):
      op = names.get(name, name)
      op = re.sub(r"layers?_\d+", "layer_*", re.sub(r"(^| \+ )(jit\([^)]*\)/)+", r"\1", op))
      ops.append({"op": op, "tid": event["tid"], "ts": event["ts"], "dur": event["dur"]})
  return ops


def instruction_ops(hlo: str) -> dict[str, str]:
  """{instruction: the JAX op it was compiled from} of one program's HLO text; a fusion whose
  computation holds dot instructions maps to their ops (xla_ops)."""
  ops = dict(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = .*?metadata=\{op_name=\"([^\"]+)\"", hlo,
                        re.MULTILINE))
  products: dict[str, list[str]] = {}
  computation = None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.-]+) .*\{$", line)
    if header:
      computation = products.setdefault(header.group(1), [])
    elif line.startswith("}"):
      computation = None
    elif computation is not None and re.search(r"= \S+ dot\(", line):
      name = re.search(r"op_name=\"([^\"]+)\"", line)
      if name and name.group(1) not in computation:
        computation.append(name.group(1))
  for instruction, called in re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = .*?\bcalls=%([\w.-]+)", hlo,
                                        re.MULTILINE):
    if products.get(called):
      ops[instruction] = " + ".join(products[called])
  return ops


def execution_programs(events: list[dict], calls: Sequence[int] | None) -> dict[str, int]:
  """{run_id: index of its program}: the traced executions in the order they started, matched to
  `calls` (the programs' indices in the order they were called)."""
  starts: dict[str, float] = {}
  for event in events:
    run = event.get("args", {}).get("run_id")
    if run is not None:
      starts[run] = min(starts.get(run, event["ts"]), event["ts"])
  runs = sorted(starts, key=starts.get)
  if calls is None or len(runs) != len(calls):
    raise ValueError(f"the trace has {len(runs)} executions but {None if calls is None else len(calls)} "
                     "calls were recorded: pass the index of the program each call ran, in order")
  return dict(zip(runs, calls))


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
