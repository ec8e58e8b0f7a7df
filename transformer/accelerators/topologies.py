"""Accelerator slices by the names users type, and what each chip can do: the table the compile
check (compile.py) plans against, and the devices JAX compiles for without the hardware.

    TOPOLOGIES['v5p-32']  ->  16 TPU v5p chips (4 hosts), JAX topology 'v5p:2x2x4'
    TOPOLOGIES['8xH100']  ->  one host of 8 H100 SXM GPUs

TPU names follow Google Cloud's accelerator types: v4 and v5p count TensorCores (2 per chip, so
v5p-32 is 16 chips), v5e and v6e count chips. JAX builds the devices of such a slice from libtpu's
topology description (`jax.experimental.topologies.get_topology_desc`), so XLA compiles the very
program a real slice would run; libtpu (the `jax[tpu]` extra) must be installed. GPUs go through
JAX's CUDA plugin with an XLA GPU target description (gpu_specs/*.txtpb, from XLA's source tree),
no GPU or CUDA driver needed.

Chip figures (peak dense bf16 FLOP/s from hardware.PEAK_TFLOPS, HBM capacity and bandwidth,
interconnect bandwidth), their sources:
  TPU v4, v5e, v5p, v6e: Google Cloud TPU system-architecture pages (cloud.google.com/tpu/docs/v4,
    /v5e, /v5p, /v6e): 'Peak compute per chip (bf16)', 'HBM capacity and bandwidth',
    'Bidirectional inter-chip interconnect (ICI) bandwidth (per chip)'. The v4 page gives no ICI
    figure: 6 ports at v5e's 50 GB/s per port and direction is assumed.
  H100 SXM, A100 SXM 80GB: NVIDIA data sheets (dense bf16 989 / 312 TFLOP/s; HBM 3.35 / 2.04 TB/s;
    NVLink 900 / 600 GB/s bidirectional per GPU); between hosts one 400 / 200 Gb/s InfiniBand NIC
    per GPU (DGX H100 / DGX A100).
"""

from __future__ import annotations

import dataclasses
import os
from importlib import resources

from transformer.errors import UserError
from transformer.hardware import PEAK_TFLOPS

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  peak_tflops: float      # dense bf16, per chip
  hbm_gib: float          # per chip
  hbm_gbps: float         # HBM bandwidth per chip, GB/s
  link_gbps: float        # interconnect within a slice or host, GB/s per chip, both directions
  cross_host_gbps: float  # between hosts (GPUs: InfiniBand per GPU, both directions); TPU: = link


# Peaks from hardware.PEAK_TFLOPS (the table training's MFU divides by), keyed by JAX's device kind.
CHIPS = {
    "v4": Chip("TPU v4", PEAK_TFLOPS["TPU v4"], 32.0, 1200.0, 600.0, 600.0),
    "v5e": Chip("TPU v5e", PEAK_TFLOPS["TPU v5 lite"], 16.0, 819.0, 400.0, 400.0),
    "v5p": Chip("TPU v5p", PEAK_TFLOPS["TPU v5"], 95.0, 2765.0, 1200.0, 1200.0),
    "v6e": Chip("TPU v6e", PEAK_TFLOPS["TPU v6 lite"], 32.0, 1640.0, 800.0, 800.0),
    "H100": Chip("NVIDIA H100 SXM 80GB", PEAK_TFLOPS["NVIDIA H100 80GB HBM3"], 79.1, 3350.0, 900.0,
                 100.0),
    "A100": Chip("NVIDIA A100 SXM 80GB", PEAK_TFLOPS["NVIDIA A100"], 79.3, 2039.0, 600.0, 50.0),
}
GPU_SPECS = {"H100": "h100_sxm.txtpb", "A100": "a100_sxm_80.txtpb"}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str           # what users type: 'v5p-32', '8xH100'
  chip: str           # a key of CHIPS
  platform: str       # 'tpu' | 'cuda'
  jax_name: str       # libtpu's topology name, or the CUDA plugin's 'slices x hosts x gpus'
  chips: int

  @property
  def spec(self) -> Chip:
    return CHIPS[self.chip]


def _tpu(chip: str, shape: str, per_name: int) -> Topology:
  """`per_name`: what the name counts (cores for v4/v5p, chips for v5e/v6e)."""
  chips = 1
  for size in shape.split("x"):
    chips *= int(size)
  return Topology(f"{chip}-{per_name}", chip, "tpu", f"{chip}:{shape}", chips)


def _gpus(chip: str, hosts: int, per_host: int = 8) -> Topology:
  return Topology(f"{per_host * hosts}x{chip}", chip, "cuda", f"1x{hosts}x{per_host}",
                  per_host * hosts)


TOPOLOGIES = {t.name: t for t in [
    _tpu("v4", "2x2x1", 8), _tpu("v4", "2x2x2", 16), _tpu("v4", "2x2x4", 32),
    _tpu("v4", "2x4x4", 64), _tpu("v4", "4x4x4", 128),
    _tpu("v5e", "2x2", 4), _tpu("v5e", "2x4", 8), _tpu("v5e", "4x4", 16), _tpu("v5e", "16x16", 256),
    _tpu("v5p", "2x2x1", 8), _tpu("v5p", "2x2x4", 32), _tpu("v5p", "4x4x4", 128),
    _tpu("v6e", "2x4", 8), _tpu("v6e", "16x16", 256),
    *(_gpus(chip, hosts) for chip in ("H100", "A100") for hosts in (1, 2, 4)),
    _gpus("H100", 1, per_host=1), _gpus("A100", 1, per_host=1),
]}


class TopologyError(UserError, ValueError):
  """A topology that cannot be compiled for here; the message says what to do."""


def cuda_compiler_installed() -> bool:
  """Whether JAX's CUDA plugin (which compiles for GPUs, without one) is installed."""
  import importlib.util
  try:  # find_spec imports the parent: no jax_plugins namespace at all means no plugin
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:
    return False


def lookup(name: str) -> Topology:
  if name not in TOPOLOGIES:
    raise TopologyError(f"unknown --topology={name!r}; known: {', '.join(TOPOLOGIES)}")
  return TOPOLOGIES[name]


def devices_per_host(devices: list) -> int:
  return len(devices) // len({d.process_index for d in devices})


def devices(topology: Topology) -> list:
  """The JAX devices of `topology`, compiled for without the hardware."""
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")  # else libtpu looks for its hosts
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only: no chip to share
  from jax.experimental import topologies
  try:
    if topology.platform == "tpu":
      desc = topologies.get_topology_desc(platform="tpu", topology_name=topology.jax_name)
    else:
      spec = resources.files("transformer.accelerators.gpu_specs").joinpath(GPU_SPECS[topology.chip]).read_text()
      desc = topologies.get_topology_desc(topology_name="", platform="cuda",
                                          topology=topology.jax_name, target_config=spec)
  except (RuntimeError, ValueError, KeyError, NotImplementedError) as e:
    if topology.platform == "tpu":
      fix = "compiling for TPUs needs libtpu: pip install -e '.[tpu]'"
    else:
      fix = ("compiling for GPUs needs JAX's CUDA plugin of JAX's own version (pip install "
             "\"jax-cuda12-plugin==$(python -c 'import jax; print(jax.__version__)')\"), and "
             "JAX_PLATFORMS=cpu set before JAX starts")
    raise TopologyError(f"cannot build the devices of {topology.name}: "
                        f"{str(e).splitlines()[0]}; {fix}") from e
  return list(desc.devices)


def per_device(topology: Topology, num_devices: int) -> Chip:
  """The chip's figures per JAX device: libtpu describes a v4 slice with one device per TensorCore
  (half a chip), other slices with one per chip."""
  share = topology.chips / num_devices
  chip = topology.spec
  return dataclasses.replace(chip, peak_tflops=chip.peak_tflops * share,
                             hbm_gib=chip.hbm_gib * share, hbm_gbps=chip.hbm_gbps * share,
                             link_gbps=chip.link_gbps * share,
                             cross_host_gbps=chip.cross_host_gbps * share)
