"""How arrays are laid out over devices: a 1-D `data` mesh over all devices of all processes.

Parameters and optimizer state are replicated; batches are split along their first (row) axis. The
same jit-compiled step therefore runs unchanged on one CPU, on 8 fake CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8) and on every accelerator of a job.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def data_mesh() -> Mesh:
  return Mesh(np.array(jax.devices()), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Places this process's rows of a batch on the mesh as one global array per key."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def with_sharding(abstract_tree: Any, sharding: NamedSharding) -> Any:
  """ShapeDtypeStructs carrying `sharding`, the target layout for jit outputs and checkpoint restore."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract_tree)
