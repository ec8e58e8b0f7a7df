"""Which machine ran a program: the CPU, the JAX devices and JAX's version.

float32 training is deterministic on one machine but not across machines: two CPUs (or two XLA
versions, or another device count) round a run's sums differently, and after thousands of steps
the same config's BLEU differs by tenths of a point (docs/experiments.md). So a run's metrics.jsonl
records the machine at every start ('start' records), and an experiment's tables warn when a run is
compared with a base trained elsewhere. The CPU is named by its vendor, family and model numbers as
well as its name, because VMs often report only a brand ("AMD EPYC") for different generations.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")  # Linux's; elsewhere the platform module names the CPU


def _cpuinfo() -> dict[str, str]:
  """The first processor's fields of /proc/cpuinfo ({} where there is none: macOS, Windows)."""
  fields: dict[str, str] = {}
  try:
    text = CPUINFO.read_text()
  except OSError:
    return fields
  for line in text.splitlines():
    if not line.strip():
      break  # the first processor's block ends at a blank line
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  return fields


def cpu_model(info: dict[str, str] | None = None) -> str:
  """The processor's name as the OS reports it, e.g. 'AMD EPYC'."""
  info = _cpuinfo() if info is None else info
  return info.get("model name") or platform.processor() or platform.machine()


def cpu_id() -> str:
  """The processor's name with its vendor, family and model numbers where the OS gives them, e.g.
  'AMD EPYC (AuthenticAMD family 26 model 2)': what tells two generations of one brand apart."""
  info = _cpuinfo()
  name = cpu_model(info)
  parts = [info.get("vendor_id", "")] + [f"{label} {info[key]}" for key, label in
                                         (("cpu family", "family"), ("model", "model")) if key in info]
  numbers = " ".join(part for part in parts if part)
  return f"{name} ({numbers})" if numbers else name


def describe() -> dict[str, str | int]:
  """The machine as a metrics record's fields, `machine` being the one-line label to compare."""
  import jax  # here, so that naming the CPU (records.py) costs no JAX import
  devices, cpu = jax.devices(), cpu_id()
  kind = devices[0].device_kind
  label = (f"{cpu}, {len(devices)} {kind} device(s), JAX {jax.__version__}"
           if devices[0].platform == "cpu" else
           f"{len(devices)} x {kind} on {cpu}, JAX {jax.__version__}")
  return {"machine": label, "cpu": cpu, "cpu_count": os.cpu_count() or 0,
          "platform": devices[0].platform, "device_kind": kind, "devices": len(devices),
          "processes": jax.process_count(), "jax": jax.__version__}


@contextlib.contextmanager
def silenced_stderr():
  """File descriptor 2 closed (to /dev/null) inside: for C++ libraries that log as they load,
  which Python's own redirections do not reach. Exceptions still propagate, after it is restored."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as devnull:
      os.dup2(devnull.fileno(), 2)
      yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def accelerator_devices() -> dict[str, bool]:
  """Which kinds of accelerator this machine has device files for: an NVIDIA driver or GPU, a TPU
  (/dev/accel* on v2-v4, /dev/vfio/N on v5 and later), an AMD GPU (ROCm's /dev/kfd). Read without
  JAX, so that its plugins can be kept quiet where their device is absent."""
  dev = Path("/dev")
  return {"gpu": Path("/proc/driver/nvidia").exists() or any(dev.glob("nvidia[0-9]*"))
          or (dev / "kfd").exists(),
          "tpu": any(dev.glob("accel[0-9]*")) or any(dev.glob("vfio/[0-9]*"))}


def usable_cpus() -> int:
  """The cores this process may use: its CPU affinity mask (which taskset, SLURM and container
  runtimes set), not the machine's count; SLURM_CPUS_PER_TASK where that is smaller."""
  count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
  return min(count, int(slurm)) if slurm.isdigit() and int(slurm) > 0 else count


def memory_mib(pid: int | str = "self") -> dict[str, int]:
  """A process's memory in MiB from Linux's /proc/<pid>/status: resident private memory ('anon'),
  resident pages of mapped files ('file': page cache, shared and reclaimable) and the peak resident
  size ('peak', VmHWM). Zeros where it cannot be read (another OS, a process that has ended)."""
  fields = {"RssAnon:": "anon", "RssFile:": "file", "VmHWM:": "peak"}
  out = dict.fromkeys(fields.values(), 0)
  try:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
      name = line.split(":", 1)[0] + ":"
      if name in fields:
        out[fields[name]] = int(line.split()[1]) // 1024
  except OSError:
    pass
  return out


def seconds_since_launch() -> float | None:
  """Wall seconds since this process started (Linux's /proc: its start in clock ticks after boot,
  and the boot time); None where that cannot be read."""
  try:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
  except (OSError, ValueError, IndexError, StopIteration):
    return None
  return time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK"))


# Dense bf16 peak TFLOP/s per JAX device (vendor data sheets, no sparsity). TPU v2/v3 devices are
# single cores (half a chip); later TPUs are whole chips. Matched as a prefix of device_kind.
PEAK_TFLOPS = {
    "NVIDIA H200": 989.0,
    "NVIDIA H100 80GB HBM3": 989.0,   # SXM
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA A100": 312.0,
    "NVIDIA L4": 121.0,
    "Tesla V100": 125.0,    # fp16 tensor cores: V100 has no bf16
    "Tesla P100": 21.2,     # fp16
    "TPU v2": 22.5,
    "TPU v3": 61.5,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,   # v5e
    "TPU v5": 459.0,        # v5p
    "TPU v6 lite": 918.0,   # v6e (Trillium)
}


def table_peak(device_kind: str) -> float | None:
  """The bf16 peak of `device_kind` from PEAK_TFLOPS (longest matching prefix), or None."""
  matches = [k for k in PEAK_TFLOPS if device_kind.startswith(k)]
  return PEAK_TFLOPS[max(matches, key=len)] if matches else None
