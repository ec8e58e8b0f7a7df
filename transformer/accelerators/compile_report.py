"""transformer-compile's report as the terminal shows it (compile.py builds it) and as JSON."""

from __future__ import annotations

import math
import re
from typing import Any

import ml_collections

from transformer.accelerators.topologies import GIB


def size(x: float) -> str:
  return f"{x / GIB:.2f} GiB" if abs(x) >= GIB / 10 else f"{x / 2**20:.2f} MiB"


def format_report(report: dict[str, Any]) -> str:
  """The report as the terminal shows it."""
  chip, batch = report["chip"], report["batch"]
  lines = [f"{report['topology']} ({report['jax_topology']}): {report['devices']} x "
           f"{report['device_kind']} in {report['hosts']} host(s); mesh "
           + " x ".join(f"{k} {v}" for k, v in report["mesh"].items()),
           f"per device: {chip['hbm_gib']:.1f} GiB HBM at {chip['hbm_gbps']:.0f} GB/s, "
           f"{chip['peak_tflops']:.0f} TFLOP/s bf16, links {chip['link_gbps']:.0f} GB/s",
           f"train batch: {batch['rows']} rows x {batch['seq_len']} tokens = "
           f"{batch['target_tokens']:,} target tokens, {batch['grad_accum_steps']} micro-batch(es); "
           f"attention: {report['attention']}"]
  for name, p in report["programs"].items():
    m = p["memory"]
    verdict = (f"fits, {size(p['headroom_bytes'])} to spare" if p["fits"]
               else f"DOES NOT FIT by {size(-p['headroom_bytes'])}")
    lines.append(f"\n{name} (compiled in {p['compile_sec']:.0f} s): peak {size(m['peak'])} per "
                 f"device, {verdict}")
    state = ", ".join(f"{k} {size(m[k])}" for k in ("params", "optimizer", "ema") if m.get(k))
    lines.append(f"  arguments {size(m['argument'])}{f' ({state})' if state else ''}, "
                 f"temporaries {size(m['temp'])}, outputs {size(m['output'])} "
                 f"({size(m['alias'])} of them in donated buffers)")
    xla = p["xla_cost_analysis"]["flops"]
    analytic = f", analytic {p['analytic_flops']:.3g}" if "analytic_flops" in p else ""
    xla_text = f", XLA's cost analysis {xla:.3g} (loop bodies once)" if xla else ""
    lines.append(f"  matmul FLOPs per device {p['matmul_flops']:.3g}{analytic}{xla_text}; "
                 f"HBM traffic {size(p['hbm_bytes'])}; {p['kernels']:.0f} kernels"
                 + (f"; loops {p['loops']}" if p["loops"] else ""))
    if None in p["loops"]:
      lines.append("  (None: a loop that runs until the data says stop, e.g. the search's steps; its "
                   "body is counted once, so these figures are per decoding step)")
    collectives = ", ".join(f"{k} {c['count']:.0f}x {c['bytes'] / 2**20:.1f} MiB"
                            for k, c in sorted(p["collectives"].items()))
    lines.append(f"  collectives per device: {collectives or 'none'}")
    if name == "train":
      share = sum(k["bytes"] for k in p["top_kernels"]) / max(p["hbm_bytes"], 1.0)
      lines.append(f"  the {len(p['top_kernels'])} kernels with the most HBM traffic "
                   f"({share:.0%} of it):")
      lines += [f"    {size(k['bytes'])}  {k['opcode']} {k['shape']}  {k['op']}"
                for k in p["top_kernels"]]
    if "bound" in p:
      b = p["bound"]
      lines.append(f"  step >= {1e3 * b['step_s']:.2f} ms, {b['binding']} bound (compute "
                   f"{1e3 * b['compute_s']:.2f} ms, memory {1e3 * b['memory_s']:.2f} ms, "
                   f"interconnect {1e3 * b['interconnect_s']:.2f} ms; all serial "
                   f"{1e3 * b['serial_s']:.2f} ms)")
      lines.append(f"  => at most {b['tokens_per_s']:,.0f} target tokens/s, MFU <= {b['mfu']:.0%}, "
                   f"{b['hours']:.2f} h to {report['steps']:,} steps")
      lines.append(f"  compute binds from ~{b['compute_bound_tokens']:,.0f} target tokens per step"
                   if b["compute_bound_tokens"] != float("inf") else
                   "  no batch makes the step compute-bound: its HBM traffic grows with the tokens "
                   "as fast as its FLOPs (fewer bytes per token would)")
  return "\n".join(lines)


def public(report: Any) -> Any:
  """The report without its internal objects (for JSON)."""
  if isinstance(report, dict):
    return {k: public(v) for k, v in report.items() if not k.startswith("_")}
  if isinstance(report, list):
    return [public(v) for v in report]
  return report


def fit_advice(report: dict[str, Any], cfg: ml_collections.ConfigDict) -> str:
  """What would make the programs that do not fit fit, with the numbers that say why."""
  hbm = report["chip"]["hbm_gib"] * GIB
  lines = []
  for name, program in report["programs"].items():
    if program["fits"]:
      continue
    m = program["memory"]
    state = m["argument"]
    lines.append(f"{name}: needs {size(m['peak'])} per device, the chip has {size(hbm)} "
                 f"({size(state)} arguments, {size(m['temp'])} temporaries)")
    if state > 0.3 * hbm:
      lines.append("  the state is large: shard it with --config.mesh.fsdp=-1 --config.mesh.data=1 "
                   "(parameters and Adam moments split over devices) or --config.mesh.tensor=N")
    room = hbm - (m["peak"] - m["temp"])  # what the temporaries may take
    if room > 0:
      lines += _remedies(name, cfg, 2 ** math.ceil(math.log2(max(2.0, m["temp"] / room))))
  return "\n".join(lines)


def _remedies(name: str, cfg: ml_collections.ConfigDict, k: int) -> list[str]:
  if name == "beam":
    return ["  decode fewer sentences at a time: --config.decode.tokens_per_batch="
            f"{max(cfg.decode.tokens_per_batch // k, 1)}"]
  return [f"  activations: --config.train.grad_accum_steps={cfg.train.grad_accum_steps * k} (the "
          f"same update, 1/{k} of the rows at a time), --config.model.remat=full, or a smaller "
          "--config.data.tokens_per_batch"]


def oom_advice(name: str, message: str, cfg: ml_collections.ConfigDict) -> str:
  """What would help a program the TPU compiler refused as too big for HBM ('RESOURCE_EXHAUSTED:
  ... required for HLO temporaries (41.97G) exceeds available HBM (15.75G)')."""
  sizes = [float(x) for x in re.findall(r"\(([\d.]+)G\)", message)]
  reason = message.split("RESOURCE_EXHAUSTED: ")[-1].splitlines()[0]
  k = 2 ** math.ceil(math.log2(sizes[0] / sizes[1])) if len(sizes) >= 2 and sizes[1] else 2
  return "\n".join([f"{name}: the compiler says: {reason}", *_remedies(name, cfg, k)])
