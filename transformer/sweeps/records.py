"""Record folders: an experiment's tables, figures and commands copied into the repository
(experiments/results/<name>/), with a README.md this module writes, so every record says how it was
made: the command, the commit, the date, the JAX version, the CPU model and the wall time.

A README's "## Notes" section (the analysis people write by hand) is kept when the record is
rebuilt. Text files are copied with the absolute path of the working directory removed (paths in a record
are relative to the repository, never to one machine).
"""

from __future__ import annotations

import datetime
import logging
import platform
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import flags

from transformer import version
from transformer.hardware import cpu_id

log = logging.getLogger("transformer")
TEXT_SUFFIXES = {".md", ".csv", ".sh", ".json", ".txt", ".jsonl"}


def commit(record_folder: Path | None = None) -> str:
  """The commit of the repository in the working directory (version.commit), the files of
  `record_folder` aside."""
  return version.commit(record_folder, Path.cwd())


def provenance(command: Sequence[str], wall_seconds: float,
               record_folder: Path | None = None) -> list[str]:
  """The README lines that say how a record was made."""
  import jax  # the version, without making importing this module cost a JAX start-up
  return [f"- command: `{shlex.join(command)}`",
          f"- commit: {commit(record_folder)}",
          f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
          f"- JAX {jax.__version__}, Python {platform.python_version()}, "
          f"{jax.default_backend()} backend",
          f"- CPU: {cpu_id()}",
          f"- wall time: {wall_seconds / 60:.1f} min"]


def _copy(path: Path, target: Path) -> None:
  if path.suffix in TEXT_SUFFIXES:
    text = path.read_text()
    target.write_text(text.replace(str(Path.cwd().resolve()) + "/", ""))
  else:
    shutil.copy2(path, target)


NOTES = "## Notes"  # a README's hand-written part, from this heading on, survives re-recording


def _notes(readme: Path) -> str:
  text = readme.read_text() if readme.is_file() else ""
  return "\n" + text[text.index(NOTES):] if NOTES in text else ""


def record(files: Sequence[Path], folder: Path, title: str, wall_seconds: float,
           command: Sequence[str] | None = None, part_of: Path | None = None) -> None:
  """Copies the experiment's `files` that exist into `folder` and writes its README.md. `part_of`:
  the record that `folder` sits in, written by the same command, whose rewritten files do not make
  the code 'uncommitted' either."""
  folder.mkdir(parents=True, exist_ok=True)
  copied = []
  for path in files:
    if path.is_file():
      _copy(path, folder / path.name)
      copied.append(path.name)
  command = list(command) if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
  readme = [f"# {title}", "", "Written by the recording tool (transformer/sweeps/records.py); "
            "rerun the command to rebuild this folder.", "",
            *provenance(command, wall_seconds, part_of or folder), "",
            "Files: " + ", ".join(f"`{name}`" for name in sorted(copied)), ""]
  (folder / "README.md").write_text("\n".join(readme) + _notes(folder / "README.md"))
  log.info("Recorded %d files in %s", len(copied), folder)


def define_record_flag() -> None:
  """An analysis's --record flag: the folder record_table writes."""
  flags.DEFINE_string("record", None, "Also write the table as results.md in this record folder, "
                      "with its README (command, machine, versions, commit, date).")


def record_table(table: str, folder: str | Path, title: str, wall_seconds: float, module: str) -> None:
  """An analysis's markdown table as `folder`/results.md, with the README that says how `python -m
  module` (this process's arguments) made it."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "results.md").write_text(table.rstrip("\n") + "\n")
  record([folder / "results.md"], folder, title, wall_seconds, ["python", "-m", module, *sys.argv[1:]])
