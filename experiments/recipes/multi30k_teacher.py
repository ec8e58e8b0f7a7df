"""The teachers of multi30k_levers' students: ensembles of the grid's kept runs, chosen on validation.

    python -m experiments.recipes.multi30k_teacher

Sequence-level knowledge distillation (Kim and Rush, 2016) trains the student on the training
sources paired with the teacher's translations. Each teacher of TEACHERS is made of its pool, runs
the levers grid trains before its student (their kept models in the record, so that it can be made
on any machine): greedy forward selection on the validation set (experiments/analyses/
ensemble_selection.py) chooses the ensemble, which translates the training sources with the runs'
search (beam 5). The `backward` teacher is the De->En run of experiments/recipes/multi30k_backward.py
(its own record), which translates the training targets instead (back-translation). The teacher's
folder of the levers' record holds the selection's table and the translations, gzipped
(teacher_targets, which the students' configs read), so it is made once.

A teacher whose pool is not all kept yet says which runs are missing and is not made (its student
then fails alone and the other variants train); one whose translations exist is left alone.
experiments/recipes/multi30k_literature.sh runs this before the levers grid.
"""

from __future__ import annotations

import gzip
import shlex
import subprocess
import sys
import time
from pathlib import Path

from experiments.analyses import ensemble_selection
from experiments.recipes.multi30k_levers import (
  BUNDLED,
  LEVERS_RECORD,
  TEACHERS,
  Teacher,
  teacher_targets,
)
from transformer.cli import run_program
from transformer.sweeps import records
from transformer.training import params_file


def pool_models(pool: tuple[str, ...], record: Path = Path(LEVERS_RECORD)
                ) -> tuple[list[str], list[str]]:
  """(the pool's kept models in `record`, the pool's variants that have none yet)."""
  models = {name: record / "runs" / name / "seed0" / "model" for name in pool}
  kept = [str(m) for m in models.values() if params_file.holds_params(m)]
  missing = [name for name, m in models.items() if not params_file.holds_params(m)]
  return kept, missing


def translate(members: list[str], source: str, target: Path) -> None:
  """The ensemble's translations of `source` (transformer-translate), gzipped into `target`
  reproducibly (no time stamp), written whole or not at all."""
  partial = target.parent / (target.name + ".partial")
  command = [sys.executable, "-m", "transformer.evaluation.translate", f"--workdir={members[0]}",
             f"--input_file={source}",
             f"--output_file={partial}", "--progress=lines"]
  if len(members) > 1:
    command.append("--ensemble=" + ",".join(members[1:]))
  print(shlex.join(command), flush=True)
  subprocess.run(command, check=True)
  with open(partial, "rb") as text, gzip.GzipFile(target, "wb", mtime=0) as packed:
    packed.write(text.read())
  partial.unlink()


def make(name: str, teacher: Teacher) -> None:
  """The teacher's selection and translations, unless made already or its pool is not all kept."""
  target = Path(teacher_targets(name))
  if target.is_file():
    print(f"The translations of {name} are made already: {target}")
    return
  kept, missing = pool_models(teacher.pool, Path(teacher.record))
  if missing:
    print(f"{name} waits for the kept models of {', '.join(missing)} (the grid of {teacher.record} "
          f"trains them before its students); its students fail alone until then.")
    return
  start = time.time()
  rounds = ensemble_selection.select(kept)
  members = [kept[i] for i in rounds[-1]["members"]]
  target.parent.mkdir(parents=True, exist_ok=True)
  source = f"{BUNDLED}/train.{teacher.source}.gz"
  translate(members, source, target)
  text = (f"# The distillation teacher `{name}`, chosen on validation\n\n"
          f"{ensemble_selection.table(kept, rounds)}\n"
          f"Chosen: {', '.join(members)}. They translated `{source}` (their search: "
          f"beam 5) into `{target.name}`, training pairs of its students in the levers grid.\n")
  records.record_table(text, target.parent, f"Multi30k distillation teacher {name}",
                       time.time() - start, "experiments.recipes.multi30k_teacher")
  print(text)


def main(argv: list[str]) -> None:
  del argv
  for name, teacher in TEACHERS.items():
    make(name, teacher)


if __name__ == "__main__":
  run_program("experiments.recipes.multi30k_teacher", main)
