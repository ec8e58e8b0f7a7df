"""What a compiled XLA program does per step, read from its optimized HLO text: matmul FLOPs,
collectives (kind, count, bytes) and an estimate of HBM traffic, each loop counted as often as it runs.

Why not XLA's own `cost_analysis()`: it counts the body of a `while` loop once, whatever its trip
count, so a gradient-accumulation scan or the loops the SPMD partitioner writes for collective
matmuls (fsdp, tensor parallelism) vanish from its FLOPs; GPU executables return none at all; and
its TPU byte count models tiled re-reads inside a kernel, not the traffic of one step. Here every
computation gets a multiplier (how often it runs per call of the entry computation: the product of
the trip counts of the loops around it; a trip count is XLA's `known_trip_count` where the compiler
wrote one, else the bound its loop condition compares with), and
  * FLOPs are 2 x multiply-adds of every `dot`, `convolution` and cuBLAS gemm (matmuls only, like
    model.size.training_flops_per_target_token, so the two compare directly);
  * a collective moves, per device, what a ring algorithm moves: all-reduce 2(n-1)/n of its buffer,
    all-gather and all-to-all (n-1)/n of the result, reduce-scatter (n-1)/n of the input, a
    collective-permute its whole buffer (n = the size of its replica group);
  * HBM traffic counts, for every kernel (each top-level instruction outside fused computations),
    its operands read once and its result written once, leaving out arrays the compiler placed in
    on-chip memory (a TPU core's VMEM): no cache reuse is modelled, and an in-place update counts
    its whole buffer, so this is an estimate, not a floor.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re

import numpy as np

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16, "token": 0}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")
# Instructions that launch no kernel of their own (bookkeeping, control flow, the second half of an
# asynchronous pair).
NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while", "call",
             "conditional", "after-all", "partition-id", "replica-id", "opt-barrier", "async-done",
             "copy-done", "send-done", "recv-done", "add-dependency", "domain", "iota"}

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](\{[^}]*\})?")
_CALLEE = re.compile(r"\b(calls|body|condition|to_apply|branch_computations|true_computation|"
                     r"false_computation)=(?:\{([^}]*)\}|%?([\w.\-]+))")


@dataclasses.dataclass
class Instruction:
  name: str
  shape: str      # the result's shape text, e.g. 'bf16[8,512]{1,0}' or a tuple '(s32[], ...)'
  opcode: str
  operands: list[str]
  arguments: str  # the text between the opcode's parentheses
  attributes: str


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  is_entry: bool = False


def _split_shape(text: str) -> tuple[str, str]:
  """('shape', 'rest') of 'shape opcode(...)...': a tuple shape ends at its matching parenthesis."""
  if text.startswith("("):
    depth = 0
    for i, ch in enumerate(text):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        return text[:i + 1], text[i + 1:].lstrip()
  shape, _, rest = text.partition(" ")
  return shape, rest


def _parse_instruction(line: str) -> Instruction | None:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  name, text = match.groups()
  shape, rest = _split_shape(text)
  opcode, _, rest = rest.partition("(")
  depth, end = 1, len(rest)
  for i, ch in enumerate(rest):
    depth += (ch == "(") - (ch == ")")
    if depth == 0:
      end = i
      break
  operands = re.findall(r"%([\w.\-]+)", rest[:end])
  return Instruction(name, shape, opcode.strip(), operands, rest[:end], rest[end + 1:])


def parse(text: str) -> dict[str, Computation]:
  """The computations of an HLO module's text, by name."""
  computations: dict[str, Computation] = {}
  current = None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = Computation(header.group(2), [], is_entry=bool(header.group(1)))
      computations[current.name] = current
    elif line.startswith("}"):
      current = None
    elif current is not None:
      instruction = _parse_instruction(line)
      if instruction:
        current.instructions.append(instruction)
  return computations


def array_dims(shape: str, hbm_only: bool = False) -> list[tuple[str, list[int]]]:
  """(dtype, dims) of every array in a shape text (one, or the elements of a tuple); with
  `hbm_only`, not those whose layout puts them in another memory space (`S(1)`: a TPU core's
  on-chip memory)."""
  return [(dtype, [int(d) for d in dims.split(",") if d])
          for dtype, dims, layout in _ARRAY.findall(shape)
          if dtype in DTYPE_BYTES and not (hbm_only and re.search(r"S\([1-9]", layout))]


def shape_bytes(shape: str, hbm_only: bool = False) -> float:
  return sum(DTYPE_BYTES[dtype] * math.prod(dims) for dtype, dims in array_dims(shape, hbm_only))


def _trip_count(instruction: Instruction, computations: dict[str, Computation]) -> int | None:
  """How often a `while` runs its body: XLA's known_trip_count, else the constant its condition
  compares the counter with (loops JAX and the SPMD partitioner write count up from 0); None for a
  loop whose end depends on the data (a search's)."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"', instruction.attributes)
  if known:
    return int(known.group(1))
  condition = re.search(r"condition=%?([\w.\-]+)", instruction.attributes)
  constants, todo, seen = set(), [condition.group(1)] if condition else [], set()
  while todo:
    name = todo.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for ins in computations[name].instructions:
      if ins.opcode == "constant" and re.match(r"[su]\d+\[\]", ins.shape):
        constants.add(int(ins.arguments))
      todo += [c for _, c in _callees(ins)]
  values = [c for c in constants if c > 1]
  return max(values) if values else None


def _callees(instruction: Instruction) -> list[tuple[str, str]]:
  """(role, computation name) of every computation an instruction calls."""
  found = []
  for role, listed, single in _CALLEE.findall(instruction.attributes):
    found += [(role, n.strip().lstrip("%")) for n in (listed or single).split(",") if n.strip()]
  return found


def multipliers(computations: dict[str, Computation]) -> tuple[dict[str, float], set[str]]:
  """How often each computation runs per call of the entry, and which ones are fused (inside a
  kernel) or scalar reducers rather than sequences of kernels."""
  entry = next(c for c in computations.values() if c.is_entry)
  runs: dict[str, float] = collections.defaultdict(float)
  inside_kernels: set[str] = set()
  runs[entry.name] = 1.0
  order = [entry.name]
  for name in order:  # breadth first: a caller is finished before its callees are visited
    for ins in computations[name].instructions:
      for role, callee in _callees(ins):
        if callee not in computations:
          continue
        factor = (_trip_count(ins, computations) or 1) if ins.opcode == "while" and role == "body" \
            else 1
        if ins.opcode == "fusion" or role == "to_apply" or name in inside_kernels:
          inside_kernels.add(callee)
        runs[callee] += runs[name] * factor
        if callee not in order:
          order.append(callee)
  return dict(runs), inside_kernels


def _operand_shapes(ins: Instruction, shapes: dict[str, str]) -> list[str]:
  return [shapes.get(op, "") for op in ins.operands]


def dot_flops(ins: Instruction, shapes: dict[str, str]) -> float:
  """2 x multiply-adds of a dot, convolution or cuBLAS gemm custom call (0 for anything else)."""
  out = array_dims(ins.shape)
  if not out:
    return 0.0
  out_elements = math.prod(out[0][1])
  operands = [array_dims(s) for s in _operand_shapes(ins, shapes)]
  if ins.opcode == "dot" and operands and operands[0]:
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attributes)
    dims = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
    return 2.0 * out_elements * math.prod(operands[0][0][1][d] for d in dims)
  if ins.opcode == "convolution" and len(operands) > 1 and operands[0] and operands[1]:
    return _convolution_flops(ins, operands[0][0][1], operands[1][0][1], out[0][1])
  if ins.opcode == "custom-call" and "gemm" in ins.attributes and operands and operands[0]:
    config = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', ins.attributes)
    dims = [int(d) for d in json.loads(f"[{config.group(1)}]")] if config else []
    return 2.0 * out_elements * math.prod(operands[0][0][1][d] for d in dims)
  return 0.0


def _window(attributes: str, key: str, spatial: int, default: int) -> list[int]:
  found = re.search(rf"\b{key}=([\dx_]+)", attributes)
  if not found:
    return [default] * spatial
  return [int(v) if "_" not in v else v for v in found.group(1).split("x")]


def _convolution_flops(ins: Instruction, lhs: list[int], kernel: list[int], out: list[int]) -> float:
  """2 x the multiply-adds that touch real input. XLA writes batched matmuls as convolutions whose
  'spatial' dimensions are padded or dilated so that each output meets one input element; counting
  window size x output size would count the padding (8x, for attention heads)."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attributes)
  if not labels:
    return 0.0
  lhs_labels, kernel_labels, out_labels = labels.groups()
  spatial = sum(ch.isdigit() for ch in out_labels)
  pads = _window(ins.attributes, "pad", spatial, 0)
  strides = _window(ins.attributes, "stride", spatial, 1)
  lhs_dilation = _window(ins.attributes, "lhs_dilate", spatial, 1)
  rhs_dilation = _window(ins.attributes, "rhs_dilate", spatial, 1)
  macs = 2.0 * kernel[kernel_labels.index("i")]
  macs *= math.prod(size for label, size in zip(out_labels, out) if label in "bf")
  for d in range(spatial):
    size_in, size_k, size_out = (lhs[lhs_labels.index(str(d))], kernel[kernel_labels.index(str(d))],
                                 out[out_labels.index(str(d))])
    low = int(str(pads[d]).split("_")[0]) if pads[d] else 0
    o = np.arange(size_out)[:, None]
    k = np.arange(size_k)[None, :]
    position = o * strides[d] + k * rhs_dilation[d] - low  # in the dilated input
    real = ((position >= 0) & (position <= (size_in - 1) * lhs_dilation[d])
            & (position % lhs_dilation[d] == 0))
    macs *= float(real.sum())
  return macs


def _group_size(ins: Instruction, devices: int) -> int:
  """Devices in each of the collective's groups, from any of XLA's three ways to write them."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", ins.attributes)
  if mesh:
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'([^']+)'", mesh.group(2)) if a in sizes)
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=", ins.attributes)
  if iota:
    return int(iota.group(1).split(",")[-1])
  groups = re.search(r"replica_groups=\{\{([\d,]*)\}", ins.attributes)
  if groups:
    return len(groups.group(1).split(","))
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}?", ins.attributes)
  return 2 if pairs else devices


def collective_bytes(kind: str, ins: Instruction, shapes: dict[str, str], devices: int) -> float:
  """Bytes one device sends for this collective under a ring algorithm."""
  n = _group_size(ins, devices)
  result = ins.shape
  if ins.opcode.endswith("-start") and result.startswith("("):  # (operand, result[, context...])
    parts = array_dims(result)
    result_bytes = (DTYPE_BYTES[parts[-1][0]] * math.prod(parts[-1][1]) if kind == "all-gather"
                    else DTYPE_BYTES[parts[0][0]] * math.prod(parts[0][1]))
  else:
    result_bytes = shape_bytes(result)
  operand_bytes = sum(shape_bytes(s) for s in _operand_shapes(ins, shapes)) or result_bytes
  if n <= 1:
    return 0.0
  if kind == "all-reduce":
    return 2.0 * (n - 1) / n * result_bytes
  if kind == "reduce-scatter":
    return (n - 1) / n * operand_bytes
  if kind in ("collective-permute", "collective-broadcast"):
    return result_bytes
  return (n - 1) / n * result_bytes  # all-gather, all-to-all


def _collective_kind(opcode: str) -> str | None:
  base = opcode.removesuffix("-start")
  return base if base in COLLECTIVES and not opcode.endswith("-done") else None


@dataclasses.dataclass
class ProgramStats:
  """Per device and per call of the program."""
  matmul_flops: float
  hbm_bytes: float
  kernels: float
  collectives: dict[str, dict[str, float]]  # kind -> {'count', 'bytes', 'cross_host_bytes'}
  top_kernels: list[dict]  # the kernels with the most HBM traffic: bytes, opcode, shape, JAX op
  loops: list[int | None]  # trip counts of the program's while loops (None: data-dependent, counted once)

  @property
  def collective_bytes(self) -> float:
    return sum(c["bytes"] for c in self.collectives.values())


def analyze(text: str, devices: int, devices_per_host: int | None = None) -> ProgramStats:
  """FLOPs, HBM traffic, kernel launches and collectives of one compiled program (module docstring);
  a collective's bytes also count as 'cross_host_bytes' when its group is larger than
  `devices_per_host` (it then crosses the slower network between hosts)."""
  computations = parse(text)
  runs, inside_kernels = multipliers(computations)
  flops = hbm = kernels = 0.0
  collectives: dict[str, dict[str, float]] = {}
  loops, traffic = [], []
  for name, computation in computations.items():
    times = runs.get(name, 0.0)
    if not times:
      continue
    shapes = {ins.name: ins.shape for ins in computation.instructions}
    for ins in computation.instructions:
      flops += times * dot_flops(ins, shapes)
      kind = _collective_kind(ins.opcode)  # TPU fuses some collectives into kernels: count those too
      if name in inside_kernels and not kind:
        continue
      if ins.opcode == "while":
        loops.append(_trip_count(ins, computations))
      if kind:
        entry = collectives.setdefault(kind, {"count": 0.0, "bytes": 0.0, "cross_host_bytes": 0.0})
        moved = times * collective_bytes(kind, ins, shapes, devices)
        entry["count"] += times
        entry["bytes"] += moved
        if devices_per_host and _group_size(ins, devices) > devices_per_host:
          entry["cross_host_bytes"] += moved
      elif ins.opcode not in NO_KERNEL and not ins.opcode.endswith("-done"):
        kernels += times
        moved = times * (shape_bytes(ins.shape, hbm_only=True)
                         + sum(shape_bytes(s, hbm_only=True) for s in _operand_shapes(ins, shapes)))
        hbm += moved
        traffic.append((moved, ins))
  traffic.sort(key=lambda t: -t[0])
  top = [{"bytes": moved, "opcode": ins.opcode, "shape": re.sub(r"\{[^}]*\}", "", ins.shape)[:80],
          "op": _op_name(ins)} for moved, ins in traffic[:TOP_KERNELS]]
  return ProgramStats(matmul_flops=flops, hbm_bytes=hbm, kernels=kernels, collectives=collectives,
                      top_kernels=top, loops=loops)


TOP_KERNELS = 8


def _op_name(ins: Instruction) -> str:
  """The JAX operation a kernel came from (XLA keeps it as metadata), without the jit prefixes."""
  found = re.search(r'op_name="([^"]*)"', ins.attributes)
  return re.sub(r"^(jit\([^)]*\)/)+", "", found.group(1))[-90:] if found else ""
