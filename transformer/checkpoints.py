"""What a run keeps in its workdir: the config it was started with, and Orbax checkpoints.

    WORKDIR/config.json        the run's config (the evaluation program rebuilds the model from it)
    WORKDIR/vocab.model        the SentencePiece vocabulary (data/vocab.py)
    WORKDIR/checkpoints/<step> Orbax checkpoints, the last `keep` of them: the train state ('state')
                               and the input pipeline's position ('data', JSON)
    WORKDIR/metrics.jsonl      one JSON object per logged event (metrics.py)

Orbax's CheckpointManager writes asynchronously (training continues while the previous step's arrays
are written) and atomically (a checkpoint directory appears only once complete).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from transformer.config import ConfigError, base_config

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
# What decides the model's shapes, its vocabulary and its training data: a resumed run must not
# change these (batch size, schedule, steps, evaluation settings may change).
FIXED_KEYS = {"model": None,  # every key
              "data": ("source", "src_lang", "tgt_lang", "train_src", "train_tgt", "tfds_name",
                       "train_split", "vocab_size", "vocab_model_type")}


class CheckpointError(RuntimeError):
  """A checkpoint that is missing or cannot be restored; the message says what to do."""


def save_run_config(workdir: str | os.PathLike, cfg: ml_collections.ConfigDict) -> None:
  """Writes config.json (process 0), or checks that an existing one describes the same model and
  data."""
  path = Path(workdir) / CONFIG_FILE
  new = json.loads(cfg.to_json_best_effort())
  if path.is_file():
    old = _with_defaults(json.loads(path.read_text()))
    changed = [f"{section}.{key}" for section, fixed in FIXED_KEYS.items()
               for key in sorted(set(old.get(section, {})) | set(new[section]))
               if (fixed is None or key in fixed)
               and old.get(section, {}).get(key) != new[section].get(key)]
    if changed:
      raise ConfigError(f"{workdir} holds a run with a different config ({', '.join(changed)}); "
                        "use a new --workdir, or the original values to resume it")
  path.write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")


def load_run_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise CheckpointError(f"{path} not found: {workdir} is not a training workdir "
                          "(train first with transformer-train --workdir=...)")
  return ml_collections.ConfigDict(_with_defaults(json.loads(path.read_text())))


def _with_defaults(stored: dict[str, Any]) -> dict[str, Any]:
  """A stored config with keys added since it was written set to their defaults.

  A new key's default always reproduces the behaviour from before the key existed (e.g. model.d_k = 0
  means d_model / num_heads), so older workdirs still resume and evaluate.
  """
  merged = json.loads(base_config().to_json_best_effort())
  for key, value in stored.items():
    if isinstance(value, dict) and isinstance(merged.get(key), dict):
      merged[key].update(value)
    else:
      merged[key] = value
  return merged


def manager(workdir: str | os.PathLike, keep: int = 5, read_only: bool = False
            ) -> ocp.CheckpointManager:
  """A CheckpointManager over WORKDIR/checkpoints: asynchronous saves, keeps the last `keep`."""
  if read_only:
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  else:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True)
  return ocp.CheckpointManager(Path(workdir).absolute() / CHECKPOINT_DIR, options=options)


def save(mngr: ocp.CheckpointManager, step: int, state: Any, data_state: dict[str, int]) -> None:
  """Starts an asynchronous save of the train state and the input pipeline's position at `step`."""
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          data=ocp.args.JsonSave(data_state)), force=True)


def _checked_step(mngr: ocp.CheckpointManager, step: int | None) -> int:
  steps = mngr.all_steps()
  if not steps:
    raise CheckpointError(f"no checkpoint in {mngr.directory}; train first, or check --workdir")
  if step is None:
    return max(steps)
  if step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {mngr.directory}; "
                          f"available steps: {', '.join(map(str, sorted(steps)))}")
  return step


def restore(mngr: ocp.CheckpointManager, abstract_state: Any, step: int | None = None) -> Any:
  """Restores `step` (default: the latest) into the shapes, dtypes and shardings of `abstract_state`."""
  step = _checked_step(mngr, step)
  try:
    return mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state))).state
  except (ValueError, KeyError, FileNotFoundError) as e:
    raise CheckpointError(f"checkpoint {step} in {mngr.directory} does not match this model "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def restore_data_state(mngr: ocp.CheckpointManager, step: int) -> dict[str, int]:
  """The input pipeline's position saved with checkpoint `step`."""
  step = _checked_step(mngr, step)
  try:
    return dict(mngr.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data)
  except (ValueError, KeyError, FileNotFoundError) as e:
    raise CheckpointError(f"checkpoint {step} in {mngr.directory} has no input-pipeline position "
                          f"({type(e).__name__}); it was written by an older version: start a new "
                          "--workdir") from None


def last_steps(mngr: ocp.CheckpointManager, count: int, up_to: int | None = None) -> list[int]:
  """The `count` most recent checkpoint steps (those <= `up_to` if given), oldest first."""
  steps = sorted(mngr.all_steps())
  if up_to is not None:
    _checked_step(mngr, up_to)
    steps = [s for s in steps if s <= up_to]
  if count < 1 or count > len(steps):
    raise CheckpointError(f"cannot average the last {count} checkpoints: {mngr.directory} has "
                          f"{len(steps)}{f' up to step {up_to}' if up_to is not None else ''} "
                          f"(steps {', '.join(map(str, steps)) or 'none'}); keep more with "
                          "train.keep_checkpoints, or average fewer")
  return steps[-count:]


def average_params(mngr: ocp.CheckpointManager, abstract_state: Any, steps: list[int]) -> Any:
  """The arithmetic mean (float32) of the parameters of checkpoints `steps`.

  Restores one checkpoint at a time into a running sum, so memory holds the sum and one train
  state, never N of them.
  """
  total = None
  for step in steps:
    params = restore(mngr, abstract_state, step).params
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    total = params if total is None else jax.tree.map(jnp.add, total, params)
    del params
  return jax.tree.map(lambda x: x / len(steps), total)
