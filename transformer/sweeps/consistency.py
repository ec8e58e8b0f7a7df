"""Before a grid runs anything: its folder and record can be written, and every run it finds (in
its folder or its record) belongs to it.

A grid resumed with another base config would put runs of two recipes in one table; one resumed
with fewer seeds, or a record holding variants the grid no longer has, would leave finished runs
out of the tables without a word. Each is an error that names the run, what differs and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer.errors import ConfigError
from transformer.files import writable_directory
from transformer.training import checkpoints

# Keys that decide how a run is logged, checkpointed or fed, not what it learns or how it is
# scored: runs of one grid may differ in them (a grid may checkpoint less than a single run).
BOOKKEEPING = {
    "train": ("log_every", "eval_every", "checkpoint_every", "checkpoint_minutes",
              "keep_checkpoints", "compile_ahead", "device_prefetch"),
    "data": ("vocab_cache_dir", "token_cache_dir", "loader_workers"),
}


def extends(old: dict[str, Any], planned: dict[str, Any], section: str, key: str) -> bool:
  """Whether a stored run's `train.steps` below the planned ones is a run to continue there: the
  same schedule, only longer (no cool-down, which ends where train.steps says)."""
  return (section, key) == ("train", "steps") and old["train"]["steps"] < planned["train"]["steps"] \
      and not old["train"].get("cooldown_steps") and not planned["train"].get("cooldown_steps")


def differences(stored: dict[str, Any], planned: dict[str, Any]) -> list[str]:
  """'section.key: stored -> planned' for every key that differs, bookkeeping keys aside and a run
  that the plan only trains longer (`extends`); keys a stored config predates count as their
  defaults (which reproduce the older behaviour)."""
  old = checkpoints.with_defaults(stored)
  changed = []
  for section in sorted(set(old) | set(planned)):
    mine, theirs = old.get(section), planned.get(section)
    if not (isinstance(mine, dict) and isinstance(theirs, dict)):
      if mine != theirs:
        changed.append(f"{section}: {mine!r} -> {theirs!r}")
      continue
    for key in sorted(set(mine) | set(theirs)):
      if (key not in BOOKKEEPING.get(section, ()) and mine.get(key) != theirs.get(key)
          and not extends(old, planned, section, key)):
        changed.append(f"{section}.{key}: {mine.get(key)!r} -> {theirs.get(key)!r}")
  return changed


def found_runs(folder: Path) -> set[tuple[str, int]]:
  """(variant, seed) of every run folder <variant>/seed<k> with a config.json under `folder`."""
  found = set()
  for config in folder.glob(f"*/seed*/{checkpoints.CONFIG_FILE}"):
    seed = config.parent.name[len("seed"):]
    if seed.isdigit():
      found.add((config.parent.parent.name, int(seed)))
  return found


def writable(root: Path, record: str | None) -> None:
  """Raises UserError unless the grid's folder and record can be written (before it builds its
  test sets or trains anything)."""
  writable_directory(root, "--root", create=False)
  if record:
    writable_directory(record, "--record", create=False)


def check(runs: Sequence[Any], grid_name: str, root: Path, record: Path | None) -> None:
  """Raises ConfigError if a run of `runs` (transformer.sweeps.run.Run) was trained with another
  config than the grid plans for it, or if `root` or `record`/runs holds runs the grid leaves out."""
  planned = {(run.variant.name, run.seed): run for run in runs}
  places = [("folder", root)] + ([("record", record / "runs")] if record else [])
  for what, folder in places:
    for run in runs:
      stored = (folder / run.variant.name / f"seed{run.seed}" if what == "record" else run.workdir
                ) / checkpoints.CONFIG_FILE
      if not stored.is_file():
        continue
      changed = differences(json.loads(stored.read_text()),
                            json.loads(run.config.to_json_best_effort()))
      if changed:
        raise ConfigError(
            f"the grid's {what} holds {run.label} ({stored.parent}) trained with another config "
            f"than this command's: {'; '.join(changed)}. Pass the --base flags it was run with, "
            f"use another --root{' and --record' if record else ''}, or delete the run to train "
            "it again")
    left_out = sorted(found_runs(folder) - set(planned))
    if left_out:
      names = ", ".join(f"{variant}/seed{seed}" for variant, seed in left_out)
      seeds = sorted({seed for _, seed in left_out} - {run.seed for run in runs})
      hint = (f"pass --seeds/--first_seed to include seed(s) {', '.join(map(str, seeds))}"
              if seeds else f"they are no variants of grid {grid_name}")
      raise ConfigError(f"the grid's {what} {folder} holds runs this command leaves out of its "
                        f"tables: {names} ({hint}); use the command that made them, another "
                        f"--root{' or --record' if record else ''}, or move them away")
