"""What a run keeps in its workdir: the config it was started with, and Orbax checkpoints.

    WORKDIR/config.json        the run's config (the evaluation program rebuilds the model from it)
    WORKDIR/vocab.model        the SentencePiece vocabulary (data/vocab.py)
    WORKDIR/checkpoints/<step> Orbax checkpoints, the last `keep` of them: the train state ('state')
                               and the input pipeline's position ('data', JSON)
    WORKDIR/metrics.jsonl      one JSON object per logged event (metrics.py)

Orbax's CheckpointManager writes asynchronously (training continues while the previous step's arrays
are written) and atomically: a checkpoint is written under a temporary name and renamed when complete,
so a run killed mid-write leaves a temporary directory that is never listed (and is removed when
training restarts). Restoring the latest checkpoint falls back to the one before if it cannot be read
(a truncated file, a missing item), with a warning naming the broken step; training moves broken
checkpoints to WORKDIR/broken_checkpoints/ so that the step can be written again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from transformer.config import ConfigError, base_config
from transformer.data import sources
from transformer.errors import UserError
from transformer.files import write_atomically

log = logging.getLogger("transformer")

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
BROKEN_DIR = "broken_checkpoints"
# Errors that mean "this checkpoint is of another model", not "this checkpoint is damaged".
# What decides the model's shapes, its vocabulary and its training data: a resumed run must not
# change these (batch size, schedule, steps, evaluation settings may change).
def fixed_keys() -> dict[str, tuple[str, ...] | None]:
  """The keys a resumed run must keep, by section (None: every key): the whole model, and what
  decides the training data and its vocabulary (each source's own `fixed` keys among them)."""
  data = ("source", "src_lang", "tgt_lang", *(k.name for k in sources.all_keys() if k.fixed),
          "train_split", "vocab_size", "vocab_model_type", "vocab_normalization",
          "pretokenize")
  return {"model": None, "data": data}


RETIRED_KEYS = {"data": ("shuffle_window",)}  # keys older runs stored that no longer mean anything


class CheckpointError(UserError, RuntimeError):
  """A checkpoint that is missing or cannot be restored; the message says what to do."""


def check_run_config(workdir: str | os.PathLike, cfg: ml_collections.ConfigDict,
                     allow_changes: bool = False) -> list[str]:
  """The model and data keys in which `cfg` differs from the run already in `workdir` (none for a
  new workdir). Raises ConfigError if there are any, unless `allow_changes`; reads only."""
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    return []
  old = with_defaults(json.loads(path.read_text()))
  new = json.loads(cfg.to_json_best_effort())
  changed = [f"{section}.{key}: {old.get(section, {}).get(key)!r} -> {new[section].get(key)!r}"
             for section, fixed in fixed_keys().items()
             for key in sorted(set(old.get(section, {})) | set(new[section]))
             if (fixed is None or key in fixed)
             and old.get(section, {}).get(key) != new[section].get(key)]
  if changed and not allow_changes:
    raise ConfigError(f"{workdir} holds a run with a different config ({', '.join(changed)}); use "
                      "a new --workdir, the original values, or --allow_config_change to go on "
                      "with the new ones")
  kinds = old.get("model", {}).get("positional"), new["model"].get("positional")
  if kinds[0] != kinds[1]:  # kinds without parameters would restore silently into each other
    raise ConfigError(f"{workdir} holds a run with positional={kinds[0]!r}, not {kinds[1]!r}: its "
                      "parameters were trained for those positions, even with "
                      "--allow_config_change; use a new --workdir, or "
                      f"--config.model.positional={kinds[0]}")
  return changed


def write_run_config(workdir: str | os.PathLike, cfg: ml_collections.ConfigDict,
                     previous_step: int | None = None) -> None:
  """Writes config.json (process 0 only). With `previous_step`, an existing config.json that differs
  is first kept as config.until_step<N>.json: the config that trained the run up to step N."""
  if jax.process_index() != 0:
    return
  path = Path(workdir) / CONFIG_FILE
  text = json.dumps(json.loads(cfg.to_json_best_effort()), indent=2, sort_keys=True) + "\n"
  if previous_step is not None and path.is_file() and path.read_text() != text:
    path.replace(path.with_name(f"config.until_step{previous_step}.json"))
  write_atomically(path, text)


def load_run_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise CheckpointError(f"{path} not found: {workdir} is not a training workdir "
                          "(train first with transformer-train --workdir=...)")
  return ml_collections.ConfigDict(with_defaults(json.loads(path.read_text())))


def with_defaults(stored: dict[str, Any]) -> dict[str, Any]:
  """A stored config with keys added since it was written set to their defaults.

  A new key's default always reproduces the behaviour from before the key existed (e.g. model.d_k = 0
  means d_model / num_heads), so older workdirs still resume and evaluate.
  """
  merged = json.loads(base_config().to_json_best_effort())
  for section, keys in RETIRED_KEYS.items():
    for key in keys:
      stored.get(section, {}).pop(key, None)
  for key, value in stored.items():
    if isinstance(value, dict) and isinstance(merged.get(key), dict):
      merged[key].update(value)
    else:
      merged[key] = value
  return merged


def manager(workdir: str | os.PathLike, keep: int = 5, read_only: bool = False
            ) -> ocp.CheckpointManager:
  """A CheckpointManager over WORKDIR/checkpoints: asynchronous saves, keeps the last `keep`, and
  (when writing) removes the temporary directories of saves that were cut short."""
  if read_only:
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  else:
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        enable_async_checkpointing=True, cleanup_tmp_directories=True)
  return ocp.CheckpointManager(Path(workdir).absolute() / CHECKPOINT_DIR, options=options,
                               item_handlers={"state": ocp.StandardCheckpointHandler(),
                                              "data": ocp.JsonCheckpointHandler()})


def save(mngr: ocp.CheckpointManager, step: int, state: Any, data_state: dict[str, int]) -> None:
  """Starts an asynchronous save of the train state and the input pipeline's position at `step`.

  Returns once the arrays are copied off the accelerator; raises CheckpointError if an earlier
  asynchronous save failed (e.g. the disk is full)."""
  with _write_errors(mngr):
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            data=ocp.args.JsonSave(data_state)), force=True)


def finish_saves(mngr: ocp.CheckpointManager) -> None:
  """Waits for the asynchronous save in flight; raises CheckpointError if it failed."""
  with _write_errors(mngr):
    mngr.wait_until_finished()


def check_saves(mngr: ocp.CheckpointManager) -> None:
  """Raises CheckpointError if an asynchronous save has failed (cheap: does not wait)."""
  with _write_errors(mngr):
    mngr.check_for_errors()


@contextlib.contextmanager
def _write_errors(mngr: ocp.CheckpointManager):
  """Turns an Orbax write failure (often raised by a later call) into one CheckpointError line."""
  try:
    yield
  except CheckpointError:
    raise
  except Exception as e:  # noqa: BLE001  Orbax and TensorStore raise many kinds
    steps = mngr.all_steps()
    kept = (f"the latest complete checkpoint is step {max(steps)}" if steps else
            "no checkpoint is complete yet")
    fix = "Free space (or fix the directory) and run" if _os_reason(e) else "Run"
    raise CheckpointError(f"could not write a checkpoint to {mngr.directory}: "
                          f"{describe_os_error(e)}; {kept}. {fix} the same command again to "
                          "resume") from None


def _os_reason(error: BaseException) -> str | None:
  """The operating system's reason inside an error from Orbax or TensorStore, if there is one."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  code = re.search(r"os_error_code='?(\d+)", str(error))
  return os.strerror(int(code.group(1))) if code else None


def describe_os_error(error: BaseException) -> str:
  """E.g. 'No space left on device' for an error from the OS, else the error's first line (without
  the repr of a C++ binding that TensorStore's messages carry)."""
  first = str(error).strip().splitlines()[0] if str(error).strip() else ""
  first = re.sub(r"\s*(?:See full TensorStore details: )?<bound method [^>]*>?.*$", "", first)
  return _os_reason(error) or f"{type(error).__name__}: {first[:200]}"


def describe_restore_error(error: BaseException) -> str:
  """Why a checkpoint could not be read, in plain words: the array whose file is cut short or
  unreadable (TensorStore's cause, which Orbax wraps in a message of indices), a damaged metadata
  file, the OS's reason, else the error's first line."""
  chain, cause = [], error
  while cause is not None and cause not in chain:
    chain.append(cause)
    cause = cause.__cause__ or cause.__context__
  for cause in chain:
    read = re.search(r'(\w+): Error reading "([^"/]+)[^"]*"', str(cause))
    if read:
      array, code = read.group(2), read.group(1)
      what = ("is shorter than its index says: truncated" if code == "OUT_OF_RANGE" or
              "is not valid for value of size" in str(cause) else f"cannot be read ({code})")
      return f"the file holding the array {array} {what}"
    if isinstance(cause, json.JSONDecodeError):
      return f"a metadata file is damaged (not valid JSON: {cause.msg})"
  return describe_os_error(error)


def _available_steps(mngr: ocp.CheckpointManager, step: int | None) -> list[int]:
  """All steps, newest first, or just `step` (which must exist)."""
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    raise CheckpointError(f"no checkpoint in {mngr.directory}; train first, or check --workdir")
  if step is not None and step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {mngr.directory}; "
                          f"available steps: {', '.join(map(str, sorted(steps)))}")
  return [step] if step is not None else steps


def array_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """'params/decoder/layer_0/ffn/wi/kernel' -> shape, for every array of a (saved or abstract) state."""
  name = lambda key: str(next(getattr(key, a) for a in ("key", "name", "idx") if hasattr(key, a)))
  return {"/".join(map(name, path)): tuple(getattr(leaf, "shape", ()))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _mismatch(mngr: ocp.CheckpointManager, step: int, abstract_state: Any) -> str | None:
  """How checkpoint `step`'s saved train state (Orbax's tree metadata: array names and shapes)
  differs from `abstract_state`; None if it matches. Raises if the metadata cannot be read."""
  saved = mngr.item_metadata(step)["state"]
  if saved is None:
    raise FileNotFoundError(f"checkpoint {step} has no train state")
  saved, wanted = array_shapes(getattr(saved, "tree", saved)), array_shapes(abstract_state)
  missing, unexpected = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
  if missing or unexpected:
    return (f"{len(missing)} arrays of this model missing, {len(unexpected)} others present, "
            f"e.g. {(missing or unexpected)[0]}")
  path = next((p for p in wanted if saved[p] != wanted[p]), None)
  return path and f"{path} has shape {saved[path]} there and {wanted[path]} here"


def _restore_one(mngr: ocp.CheckpointManager, step: int, abstract_state: Any,
                 with_data: bool) -> tuple[Any, dict[str, int] | None]:
  items = {"state": ocp.args.StandardRestore(abstract_state)}
  if with_data:
    items["data"] = ocp.args.JsonRestore()
  restored = mngr.restore(step, args=ocp.args.Composite(**items))
  return restored.state, (dict(restored.data) if with_data else None)


def restore(mngr: ocp.CheckpointManager, abstract_state: Any, step: int | None = None,
            with_data: bool = False) -> Any:
  """Restores checkpoint `step` into the shapes, dtypes and shardings of `abstract_state`.

  Without `step`, the latest checkpoint that can be read: a damaged one (truncated or missing file,
  missing item) is skipped with a warning naming it. A checkpoint of another model is an error at
  once. With `with_data`, returns (state, input-pipeline position).
  """
  failures: list[tuple[int, str]] = []  # (step, why it could not be restored)
  for candidate in _available_steps(mngr, step):
    try:
      mismatch = _mismatch(mngr, candidate, abstract_state)
      if mismatch is None:
        state, data = _restore_one(mngr, candidate, abstract_state, with_data)
    except Exception as e:  # noqa: BLE001  Orbax and TensorStore raise many kinds
      reason = describe_restore_error(e)
      failures.append((candidate, reason))
      log.warning("checkpoint %d in %s cannot be restored (%s)%s", candidate, mngr.directory,
                  reason, "; trying the one before" if step is None else "")
      continue
    if mismatch:
      raise CheckpointError(f"checkpoint {candidate} in {mngr.directory} does not match this "
                            f"model ({mismatch}); evaluate or resume it with the config it was "
                            "trained with")
    if failures:
      log.warning("restored checkpoint %d instead of the broken %s", candidate,
                  ", ".join(f"step {s}" for s, _ in failures))
    return (state, data) if with_data else state
  if step is not None:
    raise CheckpointError(f"checkpoint {step} in {mngr.directory} cannot be restored: "
                          f"{failures[0][1]}. Copy an intact copy of it back, or use another "
                          "--step")
  raise CheckpointError(f"no checkpoint in {mngr.directory} can be restored: "
                        f"{'; '.join(f'step {s} ({why})' for s, why in failures)}. Copy intact "
                        "checkpoints back, or start a new --workdir")


def move_broken(mngr: ocp.CheckpointManager, after: int) -> list[int]:
  """Moves the checkpoints newer than `after` (those a restore skipped as broken) to
  WORKDIR/broken_checkpoints/, kept for inspection, so that training can write those steps again.
  Process 0 moves; returns the steps."""
  steps = [s for s in mngr.all_steps() if s > after]
  if jax.process_index() == 0:
    for step in steps:
      target = Path(mngr.directory).parent / BROKEN_DIR / str(step)
      target.parent.mkdir(exist_ok=True)
      if target.exists():
        shutil.rmtree(target)
      (Path(mngr.directory) / str(step)).rename(target)
  mngr.reload()
  return steps


def last_steps(mngr: ocp.CheckpointManager, count: int, up_to: int | None = None) -> list[int]:
  """The `count` most recent checkpoint steps (those <= `up_to` if given), oldest first."""
  steps = sorted(mngr.all_steps())
  if up_to is not None:
    _available_steps(mngr, up_to)
    steps = [s for s in steps if s <= up_to]
  if count < 1 or count > len(steps):
    raise CheckpointError(f"cannot average the last {count} checkpoints: {mngr.directory} has "
                          f"{len(steps)}{f' up to step {up_to}' if up_to is not None else ''} "
                          f"(steps {', '.join(map(str, steps)) or 'none'}); keep more with "
                          "train.keep_checkpoints, or average fewer")
  return steps[-count:]


def average_params(mngr: ocp.CheckpointManager, abstract_state: Any, steps: list[int],
                   pick: Callable[[Any], Any]) -> Any:
  """The arithmetic mean (float32) of `pick(state)` over checkpoints `steps` (runs.load_run picks
  the parameters and their moving average).

  Restores one checkpoint at a time into a running sum, so memory holds the sum and one train
  state, never N of them.
  """
  total = None
  for step in steps:
    params = pick(restore(mngr, abstract_state, step))
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    total = params if total is None else jax.tree.map(jnp.add, total, params)
    del params
  return jax.tree.map(lambda x: x / len(steps), total)
