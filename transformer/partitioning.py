"""How arrays are laid out over devices: one mesh of all devices of all processes, and logical rules.

The mesh has three named axes, sized by the config's `mesh` section (-1 = the devices left):

  data    plain data parallelism: batch rows split, parameters and Adam state replicated;
  fsdp    batch rows split too, and parameters and Adam state sharded along d_model (ZeRO-3 style:
          XLA all-gathers a layer's weights where they are used and reduce-scatters its gradients);
  tensor  Megatron-style model parallelism: heads, d_ff and the vocabulary split over devices.

The model (model/transformer.py) names the axes of every parameter ('vocab', 'embed', 'heads', 'kv', 'mlp', ...)
and pins activations to logical layouts ('batch', 'act_heads', ...); `RULES` maps those names to mesh
axes, so one table says how every strategy shards, and the same jit-compiled step runs on one CPU,
on 8 fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8) and on every accelerator of
a multi-host job. Flax's logical partitioning API does the mapping (`nn.logical_to_mesh_sharding`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.errors import ConfigError
from transformer.hardware import usable_cpus

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # batch rows are split over both data-parallel axes

# Logical axis -> mesh axis (None = replicated). Parameters, then activations.
RULES = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("kv", None),
    ("position", None),
    ("relative_buckets", None),    # T5's bias table, per head: follows 'heads'
    ("relative_distances", None),  # Shaw's key and value embeddings of clipped offsets
    ("layers", None),
    ("batch", BATCH_AXES),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes with -1 resolved; their product must be `num_devices`."""
  sizes = [mesh_cfg[axis] for axis in MESH_AXES]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f"config.mesh {dict(zip(MESH_AXES, sizes))} cannot use {num_devices} "
                        f"devices: {num_devices} is not divisible by {known}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(f"config.mesh data x fsdp x tensor = {' x '.join(map(str, sizes))} = "
                      f"{math.prod(sizes)}, but there are {num_devices} devices; set one axis to -1")
  return tuple(sizes)


def check_divisible(cfg: ml_collections.ConfigDict, shape: tuple[int, int, int],
                    vocab_size: int) -> None:
  """Every sharded model dimension must split evenly over its mesh axis."""
  _, fsdp, tensor = shape
  needs = [("model.d_model", cfg.model.d_model, fsdp, "fsdp"),
           ("model.num_heads", cfg.model.num_heads, tensor, "tensor"),
           ("model.d_ff", cfg.model.d_ff, tensor, "tensor"),
           ("the vocabulary size", vocab_size, tensor, "tensor")]
  for what, size, devices, axis in needs:
    if size % devices:
      raise ConfigError(f"{what} ({size}) must be divisible by config.mesh.{axis} ({devices}) to "
                        f"shard it; change one of them")


def make_mesh(cfg: ml_collections.ConfigDict, vocab_size: int,
              devices: list[jax.Device] | None = None) -> Mesh:
  """The (data, fsdp, tensor) mesh over `devices` (default: every device of every process).

  `mesh_utils.create_device_mesh` orders devices so that the innermost (tensor) axis gets the
  fastest links (NVLink within a host, the TPU torus).
  """
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(cfg.mesh, len(devices))
  check_divisible(cfg, shape, vocab_size)
  try:
    grid = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):  # topologies it does not know
    grid = np.array(devices).reshape(shape)
  return Mesh(grid, MESH_AXES)


def use_cpu_devices(count: int) -> None:
  """Presents the CPU to JAX as `count` devices (0: one per core the process may use); call before
  JAX starts its backend. Accelerators are not affected.

  For decoding: XLA runs a small matrix product (the decoder's 256 x 256 ones at 32-256 rows) on
  one core, so with one CPU device the other cores idle through much of a decoding step. With one device
  per core each decodes its own queue of sentences (translator.search_fn), all cores at once. An
  XLA_FLAGS device count (--xla_force_host_platform_device_count, as the tests set) wins.
  """
  if count < 0:
    raise ConfigError(f"--cpu_devices must be >= 0 (0 = one per core), got {count}")
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    return
  if not count:
    count = usable_cpus()
  jax.config.update("jax_num_cpu_devices", count)


def data_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """Every device on the `data` axis: what evaluation and decoding use (parameters replicated)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.array(devices).reshape(len(devices), 1, 1), MESH_AXES)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def batch_shards(mesh: Mesh) -> int:
  """Into how many parts the batch rows are split."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Places this process's rows of a batch on the mesh as one global array per key."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def logical_shardings(boxed_tree: Any, mesh: Mesh) -> Any:
  """NamedShardings for a tree whose leaves carry logical axis names (unnamed leaves: replicated).

  The result has the structure of the unboxed tree, e.g. a TrainState's params and Adam moments.
  """
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_tree), mesh, RULES)


def with_mesh(fn: Callable, mesh: Mesh) -> Callable:
  """`fn` (a jitted function) called, or lowered (`.lower`), with `mesh` set, so that the model's
  activation constraints (`model.constrain`, a no-op without a mesh) bind while it is traced."""
  @functools.wraps(fn)
  def call(*args, **kwargs):
    with jax.set_mesh(mesh):
      return fn(*args, **kwargs)

  def lower(*args, **kwargs):  # ahead-of-time compilation (compile.py) binds the mesh the same way
    with jax.set_mesh(mesh):
      return fn.lower(*args, **kwargs)
  call.lower = lower
  return call


def with_sharding(abstract_tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying `shardings` (one for all leaves, or a matching tree): the target
  layout for jit outputs and checkpoint restore."""
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, abstract_tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract_tree, shardings)
