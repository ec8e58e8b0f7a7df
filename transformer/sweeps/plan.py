"""A grid's plan: every run (variant x seed) with its workdir, its config and the commands that
train and evaluate it, and the command lines a scheduler runs."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import ml_collections

from transformer.config import ConfigError, validate
from transformer.evaluation import evaluate
from transformer.sweeps.grids import Grid, Variant
from transformer.training import early_stop

# A run's parameters as evaluated, kept for later decoding (Grid.keep_models): a params-only workdir
# inside the run's (transformer-average --params_only).
KEPT_MODEL = "model"


class Evaluation(NamedTuple):
  """One transformer-eval command and the reports it writes: the raw parameters' and, where the run
  kept a moving average, the average's."""
  report: Path
  ema_report: Path
  command: list[str]

  def at_step(self, planned: int, step: int) -> Evaluation:
    """The same evaluation of checkpoint `step` instead of the `planned` one (reports renamed)."""
    rename = lambda path: path.with_name(path.name.replace(f"_step{planned}", f"_step{step}", 1))
    return Evaluation(rename(self.report), rename(self.ema_report),
                      [f"--step={step}" if arg == f"--step={planned}" else arg
                       for arg in self.command])


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of the grid and the commands that produce its results."""
  variant: Variant
  seed: int
  workdir: Path
  config: ml_collections.ConfigDict
  train: list[str]
  evals: dict[str, Evaluation]  # test set ('dev', 'long', ...) -> its evaluation
  # Evaluations for another table (--also_min_len), made while the checkpoints exist; a run
  # restored without them is finished all the same.
  extra: tuple[Evaluation, ...] = ()
  keep_model: tuple[str, ...] = ()  # the command that writes KEPT_MODEL (Grid.keep_models)

  @property
  def label(self) -> str:
    return f"{self.variant.name} seed {self.seed}"

  @property
  def final_step(self) -> int:
    """The step the run ends at: train.steps, or where train.patience stopped it."""
    stop = early_stop.stopped_at(self.workdir) if self.config.train.patience else None
    return self.config.train.steps if stop is None else stop

  def settled(self) -> Run:
    """The run with its evaluations of its final step (planned at train.steps, which a run that
    stops early never reaches)."""
    planned, final = self.config.train.steps, self.final_step
    if final == planned:
      return self
    return dataclasses.replace(self, evals={k: e.at_step(planned, final)
                                            for k, e in self.evals.items()},
                              extra=tuple(e.at_step(planned, final) for e in self.extra))


def variant_config(base: ml_collections.ConfigDict, variant: Variant, seed: int
                   ) -> ml_collections.ConfigDict:
  """The base config with the variant's overrides and the seed, validated (errors name the variant)."""
  cfg = ml_collections.ConfigDict(base.to_dict())
  cfg.lock()  # a misspelt key is an error, not a new key
  try:
    cfg.update_from_flattened_dict({**variant.overrides, "seed": seed})
  except (KeyError, AttributeError) as e:
    raise ConfigError(f"variant {variant.name}: unknown config key {e}; every key is listed in "
                      "transformer/config.py") from None
  try:
    return validate(cfg)
  except ConfigError as e:
    raise ConfigError(f"variant {variant.name}: {e}") from None


def flag_value(value) -> str:
  """A config value as ml_collections parses it from --config.KEY=VALUE."""
  return str(value).lower() if isinstance(value, bool) else str(value)


def evaluation(workdir: Path, step: int, test_set: str, args: list[str], min_len: int = 0,
               average_last: int = 1) -> Evaluation:
  """transformer-eval of the run's step (or the mean of its last `average_last` checkpoints) on one
  test set (its flags in `args`) and its reports (`min_len`: the minimum output length the search
  will use, which names them)."""
  averaging = [f"--average_last={average_last}"] if average_last > 1 else []
  return Evaluation(
      evaluate.report_path(workdir, test_set, step, average_last, min_len=min_len),
      evaluate.report_path(workdir, test_set, step, average_last, ema=True, min_len=min_len),
      ["transformer-eval", f"--workdir={workdir}", f"--step={step}", *averaging, *args])


def check_averaging(grid: Grid, variant: Variant, cfg: ml_collections.ConfigDict) -> None:
  """Refuses, before anything trains, a grid that would average more checkpoints than a run keeps."""
  if grid.average_last > cfg.train.keep_checkpoints:
    raise ConfigError(f"grid {grid.name} scores the mean of the last {grid.average_last} "
                      f"checkpoints, but variant {variant.name} keeps "
                      f"{cfg.train.keep_checkpoints} (train.keep_checkpoints): keep at least "
                      f"{grid.average_last} (--base.train.keep_checkpoints={grid.average_last}) or "
                      "average fewer")


def plan(grid: Grid, base: ml_collections.ConfigDict, base_args: list[str], seeds: list[int],
         root: Path, test_set_files: dict[str, dict], min_len: int | None = None) -> list[Run]:
  """Every run of the grid, seed-major, with its workdir and commands; `min_len` (None: the
  config's) is passed to every evaluation."""
  runs = []
  for seed in seeds:
    for variant in grid.variants:
      cfg = variant_config(base, variant, seed)
      check_averaging(grid, variant, cfg)
      workdir = root / variant.name / f"seed{seed}"
      overrides = [f"--config.{k}={flag_value(v)}" for k, v in variant.overrides.items()]
      train = ["transformer-train", *base_args, *overrides, f"--config.seed={seed}",
               f"--workdir={workdir}"]
      step = cfg.train.steps
      split = cfg.data.eval_split
      search = [] if min_len is None else [f"--min_len={min_len}"]
      shortest = cfg.decode.min_len if min_len is None else min_len
      evals = {"dev": evaluation(workdir, step, split, [f"--split={split}", *search], shortest,
                                 grid.average_last)}
      for name, files in test_set_files.items():
        evals[name] = evaluation(workdir, step, evaluate.test_set_name(None, files["source_file"]),
                                 [f"--source_file={files['source_file']}",
                                  f"--reference_file={files['reference_file']}", *search],
                                 shortest, grid.average_last)
      keep = (("transformer-average", f"--workdir={workdir}", f"--last={grid.average_last}",
               f"--output={workdir / KEPT_MODEL}", "--params_only", f"--dtype={grid.keep_models}")
              if grid.keep_models else ())
      runs.append(Run(variant, seed, workdir, cfg, train, evals, keep_model=keep))
  return runs


def selected(runs: list[Run], grid: Grid, names: list[str] | None) -> list[Run]:
  """The runs of the variants `names` (None: all) and always of the grid's first row, whose same
  seed every 'Δ vs' pairs with: e.g. a third seed for the variants two seeds left unsettled."""
  if not names:
    return runs
  known = [v.name for v in grid.variants]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ConfigError(f"--only: no variant {', '.join(unknown)} in grid {grid.name}; its variants "
                      f"are {', '.join(known)}")
  wanted = {known[0], *names}
  return [run for run in runs if run.variant.name in wanted]


def with_extra(runs: list[Run], other: list[Run]) -> list[Run]:
  """`runs`, each also given the evaluations of its run in `other` (the same grid planned with
  another search) as extra ones."""
  extra = {(run.variant.name, run.seed): tuple(run.evals.values()) for run in other}
  return [dataclasses.replace(run, extra=extra[run.variant.name, run.seed]) for run in runs]


def command_lines(runs: list[Run], line: Callable[[list[str]], str] = shlex.join) -> list[str]:
  """One shell line per run: its training, then its evaluations and the keeping of its model (each
  command made a shell line by `line`, e.g. slurm.srun)."""
  return [" && ".join(line(list(c)) for c in [run.train, *(e.command for e in run.evals.values()),
                                              *([run.keep_model] if run.keep_model else [])])
          for run in runs]
