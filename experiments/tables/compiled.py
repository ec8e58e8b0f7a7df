"""Tables of programs compiled for hardware that is not here (transformer-compile): slices,
meshes, launch recipes, the chunked loss."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.tables import RESULTS, table


@table("accelerators")
def accelerators() -> str:
  """What transformer-compile reports for the paper's configs on named slices (no hardware)."""
  from experiments.analyses.accelerators import table as compile_table
  reports = [json.loads(p.read_text()) for p in sorted((RESULTS / "accelerators").glob("wmt*__*.json"))]
  return compile_table(reports)


@table("topologies")
def topologies() -> str:
  """The slices and clusters transformer-compile knows, and the chip figures it plans with (vendor
  data sheets, in transformer/accelerators/topologies.py)."""
  from transformer.accelerators.topologies import CHIPS, TOPOLOGIES
  lines = ["| names | chips | per chip: dense bf16 peak, HBM, HBM bandwidth, interconnect (within / "
           "between hosts) |", "|---|---|---|"]
  for key, chip in CHIPS.items():
    named = [t for t in TOPOLOGIES.values() if t.chip == key]
    counts = sorted({t.chips for t in named})
    lines.append(f"| {', '.join(t.name for t in named)} | {', '.join(map(str, counts))} | "
                 f"{chip.peak_tflops:g} TFLOP/s, {chip.hbm_gib:g} GiB, {chip.hbm_gbps:,.0f} GB/s, "
                 f"{chip.link_gbps:,.0f} / {chip.cross_host_gbps:,.0f} GB/s |")
  return "\n".join(lines)


def _collectives(collectives: dict) -> str:
  return ", ".join(f"{kind} {c['count']:.0f}× {c['bytes'] / 2**20:,.0f} MiB"
                   for kind, c in collectives.items())


@table("mesh-search")
def mesh_search() -> str:
  """`transformer-compile --search_mesh`: every split of big on a v5p-32, per device, best first."""
  r = json.loads((RESULTS / "accelerators" / "search_big_v5p-32.json").read_text())
  lines = ["| mesh (data, fsdp, tensor) | peak memory | compute / memory / interconnect | bound | "
           "collectives per step (count, data sent) |", "|---|---|---|---|---|"]
  for m in sorted(r["mesh_search"], key=lambda m: m["bound"]["step_s"]):
    b = m["bound"]
    lines.append(f"| {tuple(m['mesh'])} | {m['peak_bytes'] / 2**30:.2f} GiB | "
                 f"{1e3 * b['compute_s']:.2f} / {1e3 * b['memory_s']:.2f} / "
                 f"{1e3 * b['interconnect_s']:.2f} ms | {1e3 * b['step_s']:.2f} ms ({b['binding']}) | "
                 f"{_collectives(m['collectives'])} |")
  return "\n".join(lines)


@table("launch-recipes")
def launch_recipes() -> str:
  """distributed.md's three launches, each compiled for its slice (all three programs)."""
  lines = ["| recipe | topology | train: peak / HBM per device, bound | eval peak | beam peak | "
           "collectives of the train step |", "|---|---|---|---|---|---|"]
  for name, topology in (("single-host TPU VM, base", "v5e-8"), ("multi-host slice, big", "v5p-32"),
                         ("SLURM, 2 nodes × 8 GPUs, big", "16xH100")):
    r = json.loads((RESULTS / "accelerators" / f"recipe_{topology}.json").read_text())
    beam = json.loads((RESULTS / "accelerators" / f"recipe_{topology}_beam.json").read_text())
    train, b = r["programs"]["train"], r["programs"]["train"]["bound"]
    lines.append(
        f"| {name} | {topology} | {train['memory']['peak'] / 2**30:.2f} / {r['chip']['hbm_gib']:g} "
        f"GiB; {1e3 * b['step_s']:.1f} ms, {b['binding']}-bound ({b['hours']:.2f} h to the paper's "
        f"steps) | {r['programs']['eval']['memory']['peak'] / 2**30:.2f} GiB | "
        f"{beam['programs']['beam']['memory']['peak'] / 2**30:.2f} GiB | "
        f"{_collectives(train['collectives'])} |")
  return "\n".join(lines)


@table("loss-chunks")
def loss_chunks() -> str:
  """train.loss_chunks compiled for 8xH100 (no GPU needed): the step's HBM traffic and memory."""
  folder = RESULTS / "accelerators" / "loss_chunks"
  lines = ["| model, rows of | `train.loss_chunks` | HBM traffic per step and device | temporaries | "
           "peak memory | step bound (binding) |", "|---|---|---|---|---|---|"]
  def order(path: Path) -> tuple:
    size, seq, chunks = path.stem.split("_")
    return size != "base", int(seq.removeprefix("seq")), int(chunks.removeprefix("chunks"))
  for path in sorted(folder.glob("*.json"), key=order):
    size, seq, chunks = path.stem.split("_")
    train = json.loads(path.read_text())["programs"]["train"]
    lines.append(f"| {size}, {seq.removeprefix('seq')} tokens | {chunks.removeprefix('chunks')} | "
                 f"{train['hbm_bytes'] / 1e9:.1f} GB | {train['memory']['temp'] / 2**30:.2f} GiB | "
                 f"{train['memory']['peak'] / 2**30:.2f} GiB | {1e3 * train['bound']['step_s']:.2f} ms "
                 f"({train['bound']['binding']}) |")
  return "\n".join(lines)
