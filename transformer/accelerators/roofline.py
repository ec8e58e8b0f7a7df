"""A lower bound on a compiled train step's time, and what it implies, per device.

Three terms, each the time one resource needs at its peak for what the step asks of it:
  compute       the program's matmul FLOPs (hlo.py, loops counted) / the chip's dense bf16 peak;
  memory        the kernels' HBM traffic (hlo.py's floor: operands read once, results written once)
                / HBM bandwidth;
  interconnect  the bytes the collectives send per device (ring algorithms) / the link bandwidth
                in one direction (between hosts, the slower network's).
A step cannot be faster than the largest term (perfect overlap) and is no slower than their sum
would suggest unless something else binds: kernel launches, host input, the scheduler's bubbles. So
the bound is optimistic by construction; the binding term says what to change.

`compute_bound_tokens` answers "what batch would use these chips well": compute grows with the
tokens in a step, while the gradient and weight collectives and the optimizer's HBM traffic (twice
the state: read and written once) do not; the batch at which compute catches up with both is the
smallest for which the chips' FLOPs, not their overheads, set the pace.
"""

from __future__ import annotations

import dataclasses

from transformer.accelerators.hlo import ProgramStats
from transformer.accelerators.topologies import Chip


@dataclasses.dataclass(frozen=True)
class StepBound:
  compute_s: float
  memory_s: float
  interconnect_s: float
  binding: str             # the name of the largest term
  step_s: float            # the largest term: the step can be no faster
  serial_s: float          # the three terms one after another, no overlap
  tokens_per_s: float      # target tokens per second of the whole slice at step_s
  mfu: float               # analytic model FLOPs / (peak x step_s): MFU can be at most this
  hours: float             # to the config's steps at step_s
  compute_bound_tokens: float  # target tokens per step for compute to bind (module docstring)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def bound(stats: ProgramStats, chip: Chip, analytic_flops_per_device: float, tokens_per_step: int,
          steps: int, state_bytes_per_device: float) -> StepBound:
  """The step-time bound of a train step compiled for devices like `chip` (per-device figures)."""
  compute = stats.matmul_flops / (chip.peak_tflops * 1e12)
  memory = stats.hbm_bytes / (chip.hbm_gbps * 1e9)
  local = sum(c["bytes"] - c["cross_host_bytes"] for c in stats.collectives.values())
  remote = sum(c["cross_host_bytes"] for c in stats.collectives.values())
  interconnect = local / (chip.link_gbps / 2 * 1e9) + remote / (chip.cross_host_gbps / 2 * 1e9)
  terms = {"compute": compute, "memory": memory, "interconnect": interconnect}
  binding = max(terms, key=terms.get)
  step = terms[binding]
  fixed_memory = min(memory, 2 * state_bytes_per_device / (chip.hbm_gbps * 1e9))
  per_token_compute = compute / tokens_per_step
  per_token_memory = (memory - fixed_memory) / tokens_per_step
  needed = [interconnect / per_token_compute if per_token_compute else float("inf")]
  margin = per_token_compute - per_token_memory
  needed.append(fixed_memory / margin if margin > 0 else float("inf"))
  return StepBound(compute_s=compute, memory_s=memory, interconnect_s=interconnect,
                   binding=binding, step_s=step, serial_s=sum(terms.values()),
                   tokens_per_s=tokens_per_step / step if step else float("inf"),
                   mfu=analytic_flops_per_device / (chip.peak_tflops * 1e12 * step) if step else 0.0,
                   hours=steps * step / 3600, compute_bound_tokens=max(needed))
