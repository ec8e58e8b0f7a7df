"""Doing a grid's plan: each run trained and evaluated as far as it is not done, one or several at a
time, and its results kept in (and restored from) the grid's record."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from transformer.metrics import METRICS_FILE, format_duration
from transformer.sweeps import results
from transformer.sweeps.plan import KEPT_MODEL, Run
from transformer.training import params_file

log = logging.getLogger("transformer")


# A finished run's results without its checkpoints (kilobytes, not gigabytes): what collecting the
# tables reads from a workdir; and its kept model where the grid keeps one (megabytes: the
# parameters, their config and vocabulary, not average.json, which names this machine's paths).
KEPT_FILES = ("config.json", METRICS_FILE, "eval/*.json", "eval/*.hyp.txt",
              f"{KEPT_MODEL}/config.json", f"{KEPT_MODEL}/vocab.*", f"{KEPT_MODEL}/{params_file.PARAMS_FILE}")


def missing(run: Run) -> list[str]:
  """The names of the run's evaluation reports that do not exist yet."""
  return [e.report.name for e in run.evals.values() if not e.report.is_file()]


def evaluated(run: Run) -> bool:
  """Whether every evaluation report of the run exists (its checkpoints may be gone)."""
  return not missing(run)


def kept_folder(run: Run, record: Path) -> Path:
  return record / "runs" / run.variant.name / f"seed{run.seed}"


def keep_results(run: Run, record: Path) -> None:
  """Copies the run's KEPT_FILES into the record, where a fresh checkout finds them."""
  for pattern in KEPT_FILES:
    for path in run.workdir.glob(pattern):
      target = kept_folder(run, record) / path.relative_to(run.workdir)
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(path, target)


def restore_results(runs: list[Run], record: Path) -> int:
  """Copies kept results back into the workdir of every run not evaluated there (replacing what
  an unfinished attempt left); returns how many runs are evaluated thanks to them."""
  restored = 0
  for run in runs:
    kept = kept_folder(run, record)
    if evaluated(run.settled()) or not kept.is_dir():
      continue
    for path in kept.rglob("*"):
      if path.is_file():
        target = run.workdir / path.relative_to(kept)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    restored += evaluated(run.settled())  # its metrics say where it ended
  return restored


# The console scripts the printed commands use, and the modules this Python runs for them (the same
# programs, without depending on where pip put the scripts).
PROGRAMS = {"transformer-train": "transformer.training.train",
            "transformer-eval": "transformer.evaluation.evaluate",
            "transformer-average": "transformer.evaluation.average"}


def execute(command: list[str], log_file: Path, env: dict[str, str] | None = None) -> int:
  """Runs one command with its output appended to `log_file` (`env`: the environment, None = this
  process's); returns the exit status."""
  log_file.parent.mkdir(parents=True, exist_ok=True)
  with log_file.open("a") as out:
    out.write(f"$ {shlex.join(command)}\n")
    out.flush()
    argv = [sys.executable, "-m", PROGRAMS[command[0]], *command[1:]]
    return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False).returncode


# What JAX on a GPU takes by default (75% of its memory) leaves nothing for a second process: runs
# side by side share it out, leaving a tenth for the driver and XLA's autotuning.
MEMORY_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def side_by_side_env(parallel: int) -> dict[str, str] | None:
  """The environment of runs trained `parallel` at a time: None (this process's) for one at a
  time, else each given 0.9 / parallel of an accelerator's memory, unless the caller set it."""
  if parallel == 1 or MEMORY_FRACTION in os.environ:
    return None
  return {**os.environ, MEMORY_FRACTION: f"{0.9 / parallel:.3f}"}


def run_all(runs: list[Run], record: Path | None = None, parallel: int = 1,
            on_finished: Callable[[], None] | None = None) -> list[str]:
  """Trains and evaluates what is not done yet, `parallel` runs at a time, keeping each finished
  run's results in `record` (if given) and calling `on_finished` (one call at a time) after each
  run this call trained or evaluated, so that a grid of many hours shows its tables as it goes;
  returns one line per failed run."""
  env = side_by_side_env(parallel)
  jobs = [(f"[{i}/{len(runs)}] {run.label}", run) for i, run in enumerate(runs, 1)]
  one_at_a_time = threading.Lock()

  def job(prefix: str, run: Run) -> str | None:
    done_before = evaluated(run.settled())
    failure = run_one(prefix, run, record, env)
    if on_finished and not failure and not done_before:
      with one_at_a_time:
        on_finished()
    return failure

  with concurrent.futures.ThreadPoolExecutor(parallel) as pool:  # 1: in order, one at a time
    outcomes = list(pool.map(lambda j: job(*j), jobs))
  return [failure for failure in outcomes if failure]


def run_one(prefix: str, run: Run, record: Path | None, env: dict[str, str] | None) -> str | None:
  """Trains and evaluates one run as far as it is not done; returns why it failed, or None."""
  run = run.settled()
  done = results.trained_steps(run.workdir)
  todo = [e for e in (*run.evals.values(), *run.extra) if not e.report.is_file()]
  if evaluated(run) and (not todo or done < run.final_step):
    if todo:
      log.warning("%s: no checkpoint of its last step here (results restored from a record), "
                  "so not scored for --also_min_len (%s); that table will lack it", prefix,
                  ", ".join(e.report.name for e in todo))
    else:
      log.info("%s: evaluated already, skipping training and evaluation", prefix)
    if done >= run.final_step and (why := keep_model(prefix, run, env)):
      return why
    if record:
      keep_results(run, record)
    return None
  if done < run.final_step <= results.recorded_steps(run.workdir):
    return failed(f"{run.label}: its results were restored from the record without checkpoints, "
                  f"so it cannot be evaluated again ({', '.join(missing(run))}); evaluate it on "
                  f"the machine that trained it, or delete {run.workdir} to train it again")
  if done >= run.final_step:
    log.info("%s: trained (step %d), skipping training", prefix, done)
  else:
    what = f"resuming from step {done}" if done else "training"
    log.info("%s: %s to step %d (log: %s)", prefix, what, run.config.train.steps,
             run.workdir / "train.log")
    t = time.time()
    status = execute(run.train, run.workdir / "train.log", env)
    if status != 0:
      return failed(f"{run.label}: transformer-train exited with {status}; see "
                    f"{run.workdir / 'train.log'}")
    log.info("%s: trained in %s", prefix, format_duration(time.time() - t))
    run = run.settled()  # a run that stopped early (train.patience) is scored where it stopped
    todo = [e for e in (*run.evals.values(), *run.extra) if not e.report.is_file()]
  for report, _, command in todo:
    log.info("%s: evaluating -> %s", prefix, report.name)
    status = execute(command, run.workdir / "eval.log", env)
    if status != 0:
      return failed(f"{run.label}: {shlex.join(command)} exited with {status}; see "
                    f"{run.workdir / 'eval.log'}")
  if why := keep_model(prefix, run, env):
    return why
  if record:
    keep_results(run, record)
  return None


def keep_model(prefix: str, run: Run, env: dict[str, str] | None) -> str | None:
  """Writes the run's kept model (its evaluated parameters) if the grid keeps one and it is not
  there yet; returns why that failed, or None."""
  if not run.keep_model or params_file.holds_params(run.workdir / KEPT_MODEL):
    return None
  log.info("%s: keeping its parameters -> %s", prefix, run.workdir / KEPT_MODEL)
  status = execute(list(run.keep_model), run.workdir / "eval.log", env)
  if status != 0:
    return failed(f"{run.label}: {shlex.join(run.keep_model)} exited with {status}; see "
                  f"{run.workdir / 'eval.log'}")
  return None


def failed(why: str) -> str:
  """Logs a run's failure as it happens (runs side by side finish in any order) and returns it."""
  log.error("%s", why)
  return why
