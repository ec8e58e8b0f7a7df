"""Joining a multi-process (multi-host) job on JAX's own distributed runtime.

    transformer-train ... --coordinator_address=host0:1234 --num_processes=4 --process_id=$RANK
    srun transformer-train ...          # SLURM: everything read from the environment
    transformer-train ... --distributed=on   # e.g. every worker of a TPU pod slice

`initialize()` calls `jax.distributed.initialize` before anything touches a device: with the explicit
flags, or with none when the environment names a job of several processes (SLURM_NTASKS,
OMPI_COMM_WORLD_SIZE, JAX_COORDINATOR_ADDRESS) or `--distributed=on` asks JAX to detect it (TPU pods
through the metadata server). After it, `jax.devices()` lists the devices of every process, the mesh
spans them all, and only process 0 logs. docs/distributed.md shows launches on a TPU pod slice and a
SLURM GPU cluster.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import jax
import numpy as np

from transformer.errors import UserError

log = logging.getLogger("transformer")
T = TypeVar("T")

MODES = ("auto", "on", "off")


class DistributedError(UserError, RuntimeError):
  """The process could not join (or was told inconsistently how to join) a distributed job."""


def environment_has_job() -> bool:
  """True when a launcher describes a job of several processes in the environment."""
  for variable in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    if int(os.environ.get(variable, "1") or 1) > 1:
      return True
  return bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def initialize(mode: str = "auto", coordinator_address: str | None = None,
               num_processes: int | None = None, process_id: int | None = None) -> None:
  """Joins the job if there is one (see the module docstring); then quiets every process but 0."""
  if mode not in MODES:
    raise DistributedError(f"--distributed must be one of {', '.join(MODES)}, got {mode!r}")
  explicit = [coordinator_address, num_processes, process_id]
  if any(v is not None for v in explicit) and any(v is None for v in explicit):
    raise DistributedError("pass all three of --coordinator_address, --num_processes and "
                           "--process_id (or none, to read them from the environment)")
  if mode == "off" or (mode == "auto" and coordinator_address is None
                       and not environment_has_job()):
    return
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  except (RuntimeError, ValueError, TypeError) as e:
    where = coordinator_address or "the coordinator found in the environment"
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise DistributedError(f"cannot join the distributed job at {where}: {reason}") from e
  if jax.process_index() != 0:
    log.setLevel(logging.WARNING)  # one log per job: process 0's
  log.info("Joined a job of %d processes (%d devices, %d here)", jax.process_count(),
           jax.device_count(), jax.local_device_count())


def barrier(name: str) -> None:
  """Waits until every process gets here (a no-op in a single-process job)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def leader_first(name: str, fn: Callable[[], T]) -> T:
  """Runs `fn` on process 0, then on the others once it is done (e.g. it wrote a file they read)."""
  if jax.process_index() == 0:
    result = fn()
    barrier(name)
  else:
    barrier(name)
    result = fn()
  return result


def check_shared(path: Path) -> None:
  """Raises DistributedError in every process if any process of the job cannot see `path`, which
  process 0 wrote (a workdir on one node's own disk, not on storage the job shares)."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  seen = np.asarray(multihost_utils.process_allgather(np.array(path.exists()))).reshape(-1)
  blind = [str(i) for i, ok in enumerate(seen) if not ok]
  if blind:
    raise DistributedError(
        f"process(es) {', '.join(blind)} of the job cannot see {path}, which process 0 wrote: the "
        "workdir must be on storage every node of the job shares (a network file system or a "
        "bucket), not on a node's own disk")
