"""Throughput of each sharding strategy as the device count grows, one benchmark process per setting.

    python -m experiments.analyses.scaling --config=configs/multi30k.py --devices=1,2,4,8 [--fake]
        [--strategies=data,fsdp,tensor] [--batch_tokens=2048] [--seq_len=16] [--steps=10]

Runs `transformer-benchmark` for every (strategy, device count) at the same global batch and prints
a markdown table: target tokens/s, step time, speed-up over one device and, where known, MFU. With
--fake each run gets that many fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count),
which share the host's cores: on a CPU this measures the sharding overhead, not a speed-up.
Strategy 'data' puts every device on mesh.data, 'fsdp' on mesh.fsdp, 'tensor' on mesh.tensor (it
must divide the heads); 'DxFxT' (e.g. -1x1x4) sets the three sizes. docs/performance.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MESH = {"data": (-1, 1, 1), "fsdp": (1, -1, 1), "tensor": (1, 1, -1)}


def mesh_axes(strategy: str) -> tuple[int, int, int]:
  """'data' / 'fsdp' / 'tensor' (every device on that axis) or explicit sizes like '-1x1x4'."""
  if strategy in MESH:
    return MESH[strategy]
  try:
    data, fsdp, tensor = (int(v) for v in strategy.split("x"))
  except ValueError:
    sys.exit(f"unknown strategy {strategy!r}: use data, fsdp, tensor or DATAxFSDPxTENSOR (-1 = rest)")
  return data, fsdp, tensor


def run_benchmark(args: argparse.Namespace, strategy: str, devices: int) -> dict:
  data, fsdp, tensor = mesh_axes(strategy)
  env = dict(os.environ)
  if args.fake:
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  else:
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(devices)))
  with tempfile.TemporaryDirectory() as tmp:
    output = Path(tmp) / "result.json"
    command = [sys.executable, "-m", "transformer.accelerators.benchmark", f"--config={args.config}",
               f"--batch_tokens={args.batch_tokens}", f"--seq_len={args.seq_len}",
               f"--steps={args.steps}", "--warmup=2", "--decode_sentences=0",
               f"--config.mesh.data={data}", f"--config.mesh.fsdp={fsdp}",
               f"--config.mesh.tensor={tensor}", f"--output={output}", *args.overrides]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
      sys.exit(f"benchmark failed ({strategy}, {devices} devices):\n{result.stderr[-2000:]}")
    return json.loads(output.read_text())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/multi30k.py")
  parser.add_argument("--devices", default="1,2,4,8")
  parser.add_argument("--strategies", default="data", help="comma-separated: data, fsdp, tensor, DxFxT")
  parser.add_argument("--fake", action="store_true", help="fake CPU devices")
  parser.add_argument("--batch_tokens", type=int, default=2048)
  parser.add_argument("--seq_len", type=int, default=16)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("overrides", nargs="*", help="more benchmark flags, e.g. --config.model.dtype=bfloat16")
  args = parser.parse_args()
  rows = ["| strategy | devices | mesh (data x fsdp x tensor) | tokens/s | step (median, p10-p90) | "
          "speed-up | MFU |", "|---|---|---|---|---|---|---|"]
  base = None
  for strategy in args.strategies.split(","):
    for devices in map(int, args.devices.split(",")):
      r = run_benchmark(args, strategy, devices)
      base = base or r["target_tokens_per_sec"]
      mesh = " x ".join(str(v) for v in r["mesh"].values())
      mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-"
      rows.append(f"| {strategy} | {devices} | {mesh} | {r['target_tokens_per_sec']:,.0f} | "
                  f"{r['step_sec_median']:.3f} s ({r['step_sec_p10']:.3f}-{r['step_sec_p90']:.3f}) | "
                  f"{r['target_tokens_per_sec'] / base:.2f}x | {mfu} |")
      print(rows[-1], flush=True)
  print("\n".join(rows))


if __name__ == "__main__":
  main()
