"""A workdir that keeps a model's parameters only: what a record carries so that a run trained on one
machine can be decoded, ensembled or exported on another without its checkpoints.

    WORKDIR/config.json, WORKDIR/vocab.model   as a training workdir's
    WORKDIR/params.msgpack                     the parameters (and their moving average, where the
                                               run keeps one), the steps they average, their dtype

`transformer-average --params_only` writes one (the mean of a run's last N checkpoints, optionally
in float16: half the bytes, a rounding of ~5e-4 relative); `workdir.load_run` reads it like a
checkpoint, cast back to float32. No optimizer state or input position: it cannot be trained on.
Flax's msgpack serialisation holds the arrays (one file, no Orbax metadata to keep in step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from transformer.errors import UserError
from transformer.files import write_atomically
from transformer.training import checkpoints

PARAMS_FILE = "params.msgpack"
DTYPES = ("float32", "float16")


class ParamsFileError(UserError, RuntimeError):
  """A params-only workdir that is damaged, of another model, or asked for what it does not hold."""


def write(workdir: str | Path, params: Any, ema_params: Any | None, steps: list[int],
          dtype: str = "float32") -> None:
  """Writes `params` (and `ema_params`, if any), the mean of checkpoints `steps`, stored as `dtype`."""
  if dtype not in DTYPES:
    raise ParamsFileError(f"cannot store parameters as {dtype!r}: use one of {', '.join(DTYPES)}")
  as_numpy = lambda tree: serialization.to_state_dict(
      jax.tree.map(lambda x: np.asarray(x, dtype=dtype), tree))
  content = {"steps": [int(s) for s in steps], "dtype": dtype, "params": as_numpy(params)}
  if ema_params is not None:
    content["ema_params"] = as_numpy(ema_params)
  write_atomically(Path(workdir) / PARAMS_FILE, serialization.msgpack_serialize(content))


def holds_params(workdir: str | Path) -> bool:
  return (Path(workdir) / PARAMS_FILE).is_file()


def read(workdir: str | Path, abstract_params: Any) -> tuple[Any, Any | None, list[int]]:
  """(parameters, their moving average or None, averaged steps), as float32 arrays placed as
  `abstract_params` (the train state's params, shapes and shardings) says."""
  path = Path(workdir) / PARAMS_FILE
  try:
    content = serialization.msgpack_restore(path.read_bytes())
    stored = content["params"]
  except Exception as e:  # noqa: BLE001  msgpack raises many kinds on a damaged file
    raise ParamsFileError(f"{path} cannot be read ({type(e).__name__}: {e}); copy an intact one "
                          "back, or write it again with transformer-average --params_only") from None
  wanted, have = checkpoints.array_shapes(abstract_params), checkpoints.array_shapes(stored)
  if wanted != have:
    differ = sorted(set(wanted) ^ set(have)) or [k for k in wanted if wanted[k] != have[k]]
    raise ParamsFileError(f"{path} holds the parameters of another model than its config.json "
                          f"describes (e.g. {differ[0]}); keep the config.json it was written with")

  def restore(tree):
    target = jax.tree.map(lambda a: np.zeros(a.shape, np.float32), abstract_params)
    arrays = serialization.from_state_dict(target, tree)
    return jax.tree.map(lambda x, a: jax.device_put(jnp.asarray(x, jnp.float32), a.sharding),
                        arrays, abstract_params)

  ema = content.get("ema_params")
  return restore(stored), (restore(ema) if ema is not None else None), list(content["steps"])
