"""The accelerator table of docs/performance.md: the paper's configs compiled for named TPU slices and
GPU clusters (transformer-compile's `check`, no hardware), one JSON per cell and a Markdown table.

    python -m experiments.analyses.accelerators --out=experiments/results/accelerators
    python -m experiments.analyses.accelerators --configs=configs/wmt14_ende.py:big --topologies=v5e-8 \
        --out=/tmp/acc

Each cell compiles the train step at the config's 25k-token batch on the config's mesh (data parallel
unless `--mesh` says otherwise) and records fit, peak memory per device, the step-time bound and
what it implies; `--max_batch` cells add the largest token budget that fits. The table is rebuilt from
every JSON cell in `--out` (a cell is compiled only once; delete its file to redo it), so cells
added by later commands join the same table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import flags

from transformer.accelerators import compile as compile_lib
from transformer.accelerators import compile_report, topologies
from transformer.cli import run_program

FLAGS = flags.FLAGS
CONFIGS = ("configs/wmt14_ende.py:base", "configs/wmt14_ende.py:big", "configs/wmt14_enfr.py:base",
           "configs/wmt14_enfr.py:big")
TOPOLOGIES = ("v5e-8", "v5p-8", "v5p-32", "v4-32", "v6e-8", "8xH100")
PAPER_HOURS = {"base": 12.0, "big": 84.0}  # 8 P100: 100k steps in 12 h, 300k in 3.5 days


def load_config(spec: str):
  path, _, size = spec.partition(":")
  namespace: dict = {}
  exec(compile(Path(path).read_text(), path, "exec"), namespace)
  cfg = namespace["get_config"](size) if size else namespace["get_config"]()
  cfg.config_file = spec
  return cfg


def cell_name(config: str, topology: str, mesh: str | None) -> str:
  stem = config.replace("configs/", "").replace(".py", "").replace(":", "_")
  return f"{stem}__{topology}" + (f"__{mesh.replace(',', '-')}" if mesh else "")


def run_cell(config: str, topology_name: str, mesh: str | None, seq_len: int) -> dict:
  cfg = compile_lib.with_mesh_flag(load_config(config), mesh)
  topology = topologies.lookup(topology_name)
  devices = topologies.devices(topology)
  report = compile_lib.check(cfg, topology, devices, seq_len, ("train",))
  report["steps"] = cfg.train.steps
  report["config"] = config
  return compile_report.public(report)


def table(reports: list[dict]) -> str:
  """One row per cell: the bound (perfect overlap) and the no-overlap sum beside it."""
  lines = ["| config | topology | mesh (data, fsdp, tensor) | fits | peak GiB / device (HBM) | "
           "step: bound – no overlap | binding | target tokens/s at the bound | MFU: no overlap – "
           "bound | hours to the paper's steps: bound – no overlap (paper, 8 P100) | compute binds "
           "from (tokens/step) |", "|" + "---|" * 11]
  for r in reports:
    t = r["programs"]["train"]
    b = t["bound"]
    size = r["config"].rsplit(":", 1)[-1]
    serial = b["serial_s"] / b["step_s"]
    balanced = (f"{b['compute_bound_tokens']:,.0f}" if b["compute_bound_tokens"] != float("inf")
                else "never")
    lines.append(
        f"| {r['config'].replace('configs/', '')} | {r['topology']} | "
        f"{tuple(r['mesh'].values())} | {'yes' if t['fits'] else 'NO'} | "
        f"{t['memory']['peak'] / 2**30:.2f} ({r['chip']['hbm_gib']:.0f}) | "
        f"{1e3 * b['step_s']:.1f} – {1e3 * b['serial_s']:.1f} ms | {b['binding']} | "
        f"{b['tokens_per_s']:,.0f} | {b['mfu'] / serial:.0%} – {b['mfu']:.0%} | "
        f"{b['hours']:.2f} – {b['hours'] * serial:.2f} ({PAPER_HOURS[size]:.0f}) | {balanced} |")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  out = Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  for config in FLAGS.configs:
    for topology in FLAGS.topologies:
      path = out / f"{cell_name(config, topology, FLAGS.mesh)}.json"
      if not path.exists():
        print(f"compiling {config} for {topology}", file=sys.stderr, flush=True)
        path.write_text(json.dumps(run_cell(config, topology, FLAGS.mesh, FLAGS.seq_len),
                                   indent=1, default=float))
  reports = [json.loads(p.read_text()) for p in sorted(out.glob("wmt*__*.json"))]
  order = {name: i for i, name in enumerate(topologies.TOPOLOGIES)}
  reports.sort(key=lambda r: (r["config"], order.get(r["topology"], 0), tuple(r["mesh"].values())))
  text = table(reports)
  (out / "table.md").write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  flags.DEFINE_list("configs", list(CONFIGS), "Config files with their size.")
  flags.DEFINE_list("topologies", list(TOPOLOGIES), "Topology names (transformer/accelerators/topologies.py).")
  flags.DEFINE_string("mesh", None, "data,fsdp,tensor for every cell (default: the config's).")
  flags.DEFINE_integer("seq_len", 64, "Tokens per row of the compiled batch.")
  flags.DEFINE_string("out", "experiments/results/accelerators", "Directory of the cells and table.")
  run_program("experiments.analyses.accelerators", main, compilation_cache=False)
