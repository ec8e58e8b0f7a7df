"""Write the average of a run's last N checkpoints as a new workdir that evaluation reads like any other.

    transformer-average --workdir=runs/base --last=5 --output=runs/base_avg5
    transformer-eval --workdir=runs/base_avg5 --split=test

The paper evaluates base models on the average of the last 5 checkpoints and big models on the last 20
(written every 10 minutes). `transformer-eval --average_last=N` averages on the fly; this program
stores the result once. The output workdir holds the run's config.json and vocab.model and one
checkpoint at the last averaged step: the float32 mean of the parameters, with the last checkpoint's
optimizer state and data position (so the format is the training one), and `average.json` saying
which steps went in. Checkpoints are restored one at a time into a running sum.

With `--params_only` the output keeps the averaged parameters alone (training/params_file.py: no
optimizer state, a third of the bytes; `--dtype=float16` halves that again), which evaluation,
translation, ensembles and export read like a checkpoint but training cannot resume: what an
experiment's record carries so that its runs can be decoded on another machine.

    transformer-average --workdir=runs/base --last=5 --output=runs/base_kept --params_only
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from absl import app, flags

from transformer.cli import run_program
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.files import writable_directory
from transformer.training import checkpoints, params_file
from transformer.training.workdir import load_run

FLAGS = flags.FLAGS
AVERAGE_FILE = "average.json"


def average_checkpoints(workdir: str, last: int, output: str, step: int | None = None,
                        params_only: bool = False, dtype: str = "float32") -> list[int]:
  """Writes the mean of the last `last` checkpoints of `workdir` (up to `step`) to `output`: a
  checkpoint in the training format, or with `params_only` the parameters alone, as `dtype`."""
  workdir, output = Path(workdir), Path(output)
  if output.resolve() == workdir.resolve():
    raise ConfigError("--output must be a new directory, not the training workdir")
  if (output / checkpoints.CHECKPOINT_DIR).exists() or params_file.holds_params(output):
    raise ConfigError(f"{output} already holds a model; choose a new --output")
  if dtype != "float32" and not params_only:
    raise ConfigError(f"--dtype={dtype} applies to --params_only (a checkpoint keeps the training "
                      "format, float32)")
  writable_directory(output, "--output", create=False)  # before any checkpoint is read
  run = load_run(workdir, step, average_last=last, with_state=not params_only)
  output.mkdir(parents=True, exist_ok=True)
  for name in (checkpoints.CONFIG_FILE, vocab_lib.run_vocab_path(workdir).name):
    shutil.copyfile(workdir / name, output / name)
  if params_only:
    params_file.write(output, run.raw_params, run.ema_params, run.steps, dtype)
  else:
    state = run.state.replace(params=run.raw_params)
    if run.ema_params is not None:  # the parameters and their moving average, each averaged
      state = state.replace(ema_params=run.ema_params)
    with contextlib.closing(checkpoints.manager(output, keep=1)) as target:
      checkpoints.save(target, run.steps[-1], state, run.data_state)
      checkpoints.finish_saves(target)
  (output / AVERAGE_FILE).write_text(json.dumps(
      {"source_workdir": str(workdir.absolute()), "averaged_steps": run.steps,
       **({"params_only": True, "dtype": dtype} if params_only else {})}, indent=2) + "\n")
  return run.steps


def main(argv: list[str]) -> None:
  if FLAGS.workdir is None or FLAGS.output is None:
    raise app.UsageError("pass --workdir=DIR (a training workdir), --last=N and --output=NEW_DIR")
  steps = average_checkpoints(FLAGS.workdir, FLAGS.last, FLAGS.output, FLAGS.step,
                              FLAGS.params_only, FLAGS.dtype)
  print(f"averaged steps {', '.join(map(str, steps))} of {FLAGS.workdir} into {FLAGS.output}; "
        f"evaluate with: transformer-eval --workdir={FLAGS.output}")


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_string("workdir", None, "Training workdir whose checkpoints to average.")
  flags.DEFINE_integer("last", 5, "How many of the latest checkpoints to average (paper: 5 base, "
                       "20 big).")
  flags.DEFINE_integer("step", None, "Average the checkpoints up to this step (default: latest).")
  flags.DEFINE_string("output", None, "New workdir to write the averaged checkpoint to.")
  flags.DEFINE_bool("params_only", False, "Keep the averaged parameters alone (no optimizer state): "
                    "evaluation, translation and export read them; training cannot resume them.")
  flags.DEFINE_enum("dtype", "float32", params_file.DTYPES, "How --params_only stores them "
                    "(float16: half the bytes, rounded to ~5e-4 relative; read back as float32).")
  run_program("transformer-average", main)


if __name__ == "__main__":
  run()
