"""SLURM batch scripts that outlive their time limit: signalled before it, they checkpoint and
requeue themselves until the work is done.

    transformer-train --config=configs/wmt14_ende.py:base --workdir=/shared/runs/base \\
      --print_sbatch --sbatch="--nodes=2 --gpus-per-node=8 --time=24:00:00" > base.sbatch
    sbatch base.sbatch
    transformer-experiment positional --base=configs/multi30k.py --print_sbatch > grid.sbatch

The script asks SLURM for SIGTERM a few minutes before the time limit (`--signal=TERM@SECONDS`,
sent to the job's tasks, not to the batch shell). The trainer finishes its step, writes a checkpoint
and exits with 75 (EX_TEMPFAIL); on that status, and on no other, the script requeues the job
(`scontrol requeue`), which starts again with the same job id, resumes from the checkpoint, and
appends to the same log. A preemption (SLURM, or `scancel --signal=TERM JOB`) takes the same path.
A run that finished exits 0 and one that failed (a wrong config: 2) ends the job: a broken run is
never retried. A plain `scancel` cancels the job; the trainer still saves where it stopped, and
submitting the script again goes on from there. A grid becomes a job array, one task per run, each
task requeueing itself alone.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

import ml_collections

from transformer import partitioning
from transformer.errors import ConfigError, UserError
from transformer.stops import EXIT_STOPPED

SIGNAL_SECONDS = 300  # the trainer's step, a validation and a checkpoint write fit in 5 minutes
SHORTEST_LIMIT = 120  # seconds: a shorter job would spend its whole start starting up
SHORTEST_WINDOW = 60  # seconds from a start to its warning (SLURM's own resolution is a minute)
TIME_FORMATS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS[:MINUTES[:SECONDS]]"
COUNT_OPTIONS = ("nodes", "ntasks-per-node", "cpus-per-task")  # positive integers where given
DEFAULT_OPTIONS = "--time=24:00:00"
# Flags of ours that shape the script, not the command it runs.
OWN_FLAGS = ("--print_sbatch", "--sbatch")


class SbatchError(UserError, ValueError):
  """sbatch options that cannot make a job of this command."""


def time_limit_seconds(value: str) -> int | None:
  """sbatch's --time in seconds (None: UNLIMITED / infinite); SbatchError for what SLURM would not
  read."""
  if value.lower() in ("unlimited", "infinite"):
    return None
  match = (re.fullmatch(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?", value)
           or re.fullmatch(r"()(\d+)(?::(\d+))?(?::(\d+))?", value))
  if not match:
    raise SbatchError(f"--sbatch: --time={value} is not a SLURM time limit; write {TIME_FORMATS}, "
                      "e.g. --time=24:00:00")
  days, *parts = match.groups()
  given = [int(p) for p in parts if p is not None]
  if days:  # DAYS-HOURS[:MINUTES[:SECONDS]]
    hours, minutes, seconds = (given + [0, 0])[:3]
  elif len(given) == 3:
    hours, minutes, seconds = given
  else:  # MINUTES[:SECONDS]
    hours, (minutes, seconds) = 0, (given + [0])[:2]
  return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def signal_lead(opts: dict[str, str]) -> int:
  """Seconds before the time limit at which the trainer is signalled to checkpoint: --signal's, else
  SIGNAL_SECONDS, or a quarter of a limit shorter than four times that. SbatchError where the
  limit leaves a start too little time to train (a limit under SHORTEST_LIMIT, or a lead that
  leaves less than SHORTEST_WINDOW)."""
  limit = time_limit_seconds(opts.get("time", options(DEFAULT_OPTIONS)["time"]))
  given = opts.get("signal")
  lead = int(given.rsplit("@", 1)[1]) if given else SIGNAL_SECONDS
  if limit is None:
    return lead
  if limit < SHORTEST_LIMIT:
    raise SbatchError(f"--sbatch: --time={opts['time']} gives each start {limit} s, less than the "
                      f"{SHORTEST_LIMIT} s a start needs to load, compile and train a step before "
                      f"its checkpoint warning; ask for --time={SHORTEST_LIMIT // 60} or more")
  if given is None:
    return min(lead, limit // 4)
  if limit - lead < SHORTEST_WINDOW:
    raise SbatchError(f"--sbatch: --signal={given} warns {lead} s before a limit of {limit} s "
                      f"(--time={opts['time']}), leaving a start {max(limit - lead, 0)} s: it would "
                      f"be signalled while it starts up and requeue for ever. Leave --signal out "
                      f"(then the warning comes a quarter of a short limit before it), or give "
                      f"--signal=TERM@{limit - SHORTEST_WINDOW} or less")
  return lead


def options(text: str) -> dict[str, str]:
  """sbatch's long options in `text` ("--nodes=2 --time=1:00:00 --requeue"), as {name: value};
  SbatchError, naming the option and the fix, for what cannot make a job."""
  parsed = {}
  try:
    words = shlex.split(text)
  except ValueError as e:
    raise SbatchError(f"--sbatch: cannot split {text!r} into options ({e}); close its quotes, "
                      "e.g. --sbatch=\"--time=24:00:00 --partition=gpu\"") from None
  for word in words:
    match = re.fullmatch(r"--([a-z][a-z-]*)(?:=(.*))?", word)
    if not match:
      raise SbatchError(f"--sbatch: {word!r} is not a long sbatch option; write each as "
                        "--name=value, e.g. --sbatch=\"--nodes=2 --time=24:00:00\"")
    parsed[match.group(1)] = match.group(2) if match.group(2) is not None else ""
  if "no-requeue" in parsed:
    raise SbatchError("--sbatch: --no-requeue forbids the requeue that resumes the run at its "
                      "time limit; leave it out")
  signal = parsed.get("signal")
  if signal is not None and not re.fullmatch(r"(?:R:)?(?:TERM|SIGTERM|15)@\d+", signal):
    raise SbatchError(f"--sbatch: --signal={signal}: the trainer checkpoints on SIGTERM sent to "
                      "its tasks; use --signal=TERM@SECONDS (not B:, which signals the batch "
                      "shell only, nor another signal)")
  for name in COUNT_OPTIONS:
    value = parsed.get(name)
    if value is not None and not (value.isdigit() and int(value) >= 1):
      raise SbatchError(f"--sbatch: --{name}={value} is not a positive whole number; give one "
                        f"(e.g. --{name}=1)")
  if "time" in parsed:
    time_limit_seconds(parsed["time"])
  return parsed


def devices(opts: dict[str, str]) -> int | None:
  """The accelerators the options ask for (nodes x GPUs per node), None where they name none."""
  per_node = opts.get("gpus-per-node")
  gres = re.fullmatch(r"gpu(?::[\w-]+)?:(\d+)", opts.get("gres", ""))
  count = per_node.rsplit(":", 1)[-1] if per_node else gres.group(1) if gres else None
  if count is None:
    return None
  if not count.isdigit() or not opts.get("nodes", "1").isdigit():
    raise SbatchError(f"--sbatch: cannot read a GPU count from --nodes={opts.get('nodes')} "
                      f"--gpus-per-node={per_node}")
  return int(opts.get("nodes", "1")) * int(count)


def check_mesh(cfg: ml_collections.ConfigDict, opts: dict[str, str]) -> None:
  """Raises SbatchError if the job's GPUs cannot hold the config's mesh, or its tasks cannot
  share a node's GPUs evenly."""
  count = devices(opts)
  if count is None:
    return
  per_node, tasks = count // int(opts.get("nodes", "1")), opts.get("ntasks-per-node", "1")
  if not tasks.isdigit() or int(tasks) < 1 or per_node % int(tasks):
    raise SbatchError(f"--sbatch: --ntasks-per-node={tasks} does not divide a node's {per_node} "
                      "GPU(s): every process drives the same number (one task per node, or one "
                      "per GPU)")
  try:
    partitioning.mesh_shape(cfg.mesh, count)
  except ConfigError as e:
    raise SbatchError(f"--sbatch asks for {count} GPU(s) ({opts.get('nodes', '1')} node(s) x "
                      f"{count // int(opts.get('nodes', '1'))}), which the config cannot use: "
                      f"{e}") from None


def command_of(argv: Sequence[str]) -> list[str]:
  """The program's own command line without the flags that print a script."""
  kept, skip = [], False
  for arg in argv:
    if skip:
      skip = False
      continue
    name = arg.split("=", 1)[0]
    if name in OWN_FLAGS or name in ("--noprint_sbatch",):
      skip = "=" not in arg and name == "--sbatch"
      continue
    kept.append(arg)
  return kept


def script(name: str, commands: Sequence[str], sbatch: str, log: str = "slurm-%j.out") -> str:
  """A batch script running `commands` (shell lines, one per array task if several) under `srun`,
  requeued on exit status 75 (see the module docstring)."""
  opts = options(sbatch or DEFAULT_OPTIONS)
  lead = signal_lead(opts)
  lines = ["#!/bin/bash",
           "# Made by --print_sbatch. At --signal's warning before the time limit (or a preemption)",
           "# the trainer saves a checkpoint and exits 75; this script then requeues the job, which",
           "# resumes from it. Any other status ends the job. Submit with: sbatch THIS_FILE",
           f"#SBATCH --job-name={name}"]
  if len(commands) > 1:
    lines.append(f"#SBATCH --array=0-{len(commands) - 1}")
    log = "slurm-%A_%a.out"
  defaults = {"time": options(DEFAULT_OPTIONS)["time"], "signal": f"TERM@{lead}",
              "output": log, "open-mode": "append", "requeue": "", "chdir": os.getcwd()}
  for key, value in {**defaults, **opts}.items():
    lines.append(f"#SBATCH --{key}" + (f"={value}" if value else ""))
  job = ("${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" if len(commands) > 1 else "$SLURM_JOB_ID")
  lines += ["", f"job={job}",
            'echo "transformer: job $job (start $((${SLURM_RESTART_COUNT:-0} + 1))) on '
            '$SLURM_JOB_NODELIST at $(date -u +%FT%TZ)"']
  if len(commands) > 1:
    lines.append("case $SLURM_ARRAY_TASK_ID in")
    lines += [f"  {i}) {command} ;;" for i, command in enumerate(commands)]
    lines.append("esac")
  else:
    lines.append(commands[0])
  lines += ["status=$?",
            f"if [ $status -eq {EXIT_STOPPED} ]; then",
            '  echo "transformer: stopped before the end to go on later (exit '
            f'{EXIT_STOPPED}): requeueing job $job"',
            '  scontrol requeue "$job"',
            "fi",
            'echo "transformer: job $job exits with $status at $(date -u +%FT%TZ)"',
            "exit $status", ""]
  return "\n".join(lines)


def define_flags() -> None:
  """The flags of programs that print a batch script of themselves (train, experiment)."""
  from absl import flags
  flags.DEFINE_bool("print_sbatch", False, "Print a SLURM batch script that runs this command "
                    "(without this flag) under srun, checkpoints at --signal's warning before its "
                    "time limit or at a preemption and requeues itself until done; then exit.")
  flags.DEFINE_string("sbatch", DEFAULT_OPTIONS, "With --print_sbatch: the job's sbatch options, "
                      "e.g. \"--nodes=2 --gpus-per-node=8 --time=24:00:00 --partition=gpu\" "
                      f"(added unless given: --signal=TERM@{SIGNAL_SECONDS}, a quarter of a "
                      "shorter limit than 20 minutes; --requeue "
                      "--open-mode=append --output=slurm-%j.out --chdir=<this folder>).")


def train_script(cfg: ml_collections.ConfigDict, argv: Sequence[str], sbatch: str,
                 workdir: str) -> str:
  """The batch script of a transformer-train command line (`argv`, its own flags included) whose
  config (`cfg`, validated) is to run on the job `sbatch` asks for."""
  check_mesh(cfg, options(sbatch or DEFAULT_OPTIONS))
  name = os.path.basename(os.path.normpath(workdir)) or "train"
  return script(name, [srun(["transformer-train", *command_of(argv[1:])])], sbatch)


def srun(command: Sequence[str]) -> str:
  """A program's command line run as a job step (every task of the job runs it)."""
  return "srun " + shlex.join(command)
