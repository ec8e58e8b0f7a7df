"""Run an experiment grid: train and evaluate every variant and seed, then tabulate and plot.

    transformer-experiment positional --base=configs/multi30k.py --seeds=3
    transformer-experiment table3 --base=configs/multi30k.py --base.train.steps=1200 --seeds=1
    transformer-experiment my_grid.py --base=configs/wmt14_ende.py:base --print_commands

Every run (variant x seed) is its own workdir, ROOT/<variant>/seed<k>, trained with transformer-train
and scored with transformer-eval (the evaluation program, on the base config's dev split and on the
grid's extra test sets). Runs go one after the other, seed by seed, so a partial experiment stays
balanced; `--parallel=N` runs N at a time, for one GPU that several small runs share (on a CPU one
run already uses every core). A run whose last checkpoint reached train.steps is not trained again,
an interrupted one resumes from its last checkpoint, and an evaluation whose report exists is not
repeated: re-running the same command picks up where it stopped. `--print_commands` prints one shell
line per run instead, for a cluster scheduler, and `--print_sbatch` a SLURM job array of them (one
task per run, each requeueing itself at its time limit: transformer/slurm.py); once they have
finished, the same command with `--collect_only` collects the results.
With `--record=DIR` every finished run's results (config, metrics and evaluation reports with their
translations; not its checkpoints) are also kept in DIR/runs/<variant>/seed<k>/, and a run whose
results are kept there is restored from them instead of trained again: a grid that takes many
machines or days resumes from the committed record on a fresh checkout.

Output in ROOT, rewritten after every run the grid trains or scores (so the record of a grid of many
days shows each finished run): results.csv (one row per run), results.md (the paper's Table 3
layout, mean ± std over seeds), curves.png, bleu.png and commands.sh (every run's command line),
and every run in TensorBoard's HParams dashboard (`tensorboard --logdir ROOT`; transformer/sweeps/hparams.py);
`--record=DIR` copies them
(and the extra test sets' descriptions) to DIR, e.g. experiments/results/<name>/.
`--base.KEY=VALUE` overrides the base config for every variant; `--only=A,B` runs those variants
(and the first row) only, e.g. a third seed where two disagree (`--seeds=3 --only=A-h8`).
`--test_dir=DIR` also scores every run on the held-out test sets in DIR (Multi30k's official test
sets, which the project does not bundle), tabulated beside the dev set's with their own Δ and p.
`--min_len=N` scores the same checkpoints with a minimum output length (reports `_min<N>`, tables in
ROOT/min_len<N>/). `--also_min_len=N` scores every run both ways as soon as it is trained, while
its checkpoints exist, and writes both searches' tables (ROOT/min_len<N>/, and the record's
min_len<N>/): a grid whose runs move between machines without their checkpoints needs it.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from transformer import slurm
from transformer.cli import run_program
from transformer.config import validate
from transformer.data import sources, text_files
from transformer.sweeps import by_length, consistency, hparams, records, results, test_sets
from transformer.sweeps.execute import evaluated, keep_results, restore_results, run_all
from transformer.sweeps.grids import Grid, load_grid
from transformer.sweeps.plan import Run, command_lines, plan, selected, variant_config, with_extra

FLAGS = flags.FLAGS
log = logging.getLogger("transformer")


def tables_folder(root: Path, min_len: int | None) -> Path:
  """Where a grid's tables of one search go: ROOT for the config's, ROOT/min_len<N>/ for --min_len."""
  return root if min_len is None else root / f"min_len{min_len}"


def tabulate(runs: list[Run], grid: Grid, base: ml_collections.ConfigDict, files: dict[str, dict],
             held_out: list[str], root: Path, min_len: int | None,
             pairs: dict[tuple[str, int], Path] | None) -> list[Path]:
  """Writes the tables, plots and command lines of `runs` (planned with `min_len`, None: the
  config's search) in tables_folder; returns the files written."""
  tables = tables_folder(root, min_len)
  table = results.collect(runs)
  references = {"dev": sources.load_split(base.data, base.data.eval_split).target}
  references.update({name: text_files.read_lines(f["reference_file"]) for name, f in files.items()})
  results.add_significance(table, runs, references, pairs)
  dev_sources = None
  if grid.by_length:
    dev_sources = sources.load_split(base.data, base.data.eval_split).source
    by_length.add_buckets(table, runs, dev_sources, references["dev"], results.translations)
  written = results.write(table, grid, tables, base.decode.min_len if min_len is None else min_len,
                          dev_sources, {name: references[name] for name in held_out})
  if min_len is None:  # the dashboard shows the config's search, as the main table
    hparams.write(table, runs, grid, root, [*grid.test_sets, *held_out])
  commands = tables / "commands.sh"
  commands.write_text(f"# {grid.name}: every run's commands (train && evaluate), one line each\n"
                      + "\n".join(command_lines(runs)) + "\n")
  written.append(commands)
  written += [root / "test_sets" / f"{name}.json" for name in grid.test_sets]  # test_sets.build's
  log.info("Wrote %s", ", ".join(str(p) for p in written))
  return written


def base_arguments(argv: list[str]) -> list[str]:
  """transformer-train's --config flags for the runner's --base and --base.KEY=VALUE flags."""
  args = []
  for i, arg in enumerate(argv):
    if arg.startswith("--base=") or arg.startswith("--base."):
      args.append("--config" + arg[len("--base"):])
    elif arg == "--base" and i + 1 < len(argv):
      args.append(f"--config={argv[i + 1]}")
  return args


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    raise app.UsageError("pass one grid: a built-in name (table3, positional) or a grid .py file")
  if FLAGS.base is None:
    raise app.UsageError("pass --base=configs/multi30k.py (the config every variant changes)")
  if FLAGS.seeds < 1:
    raise app.UsageError(f"--seeds must be at least 1, got {FLAGS.seeds}")
  if FLAGS.parallel < 1:
    raise app.UsageError(f"--parallel must be at least 1 (runs at a time), got {FLAGS.parallel}")
  for name in ("min_len", "also_min_len"):
    if getattr(FLAGS, name) is not None and getattr(FLAGS, name) < 0:
      raise app.UsageError(f"--{name} must be >= 0 (0 = an empty translation is allowed), got "
                           f"{getattr(FLAGS, name)}")
  if FLAGS.also_min_len is not None and FLAGS.min_len is not None:
    raise app.UsageError("pass --min_len=N (score with N instead of the config's search) or "
                         "--also_min_len=N (score both ways), not both")
  started = time.time()
  grid = load_grid(argv[1])
  root = Path(FLAGS.root or f"runs/experiments/{grid.name}")
  seeds = list(range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds))
  base = validate(FLAGS.base)
  for variant in grid.variants:  # every variant checked before anything runs
    variant_config(base, variant, seeds[0])
  held_out = (test_sets.held_out(FLAGS.test_dir, base.data.src_lang, base.data.tgt_lang,
                                 check=not FLAGS.print_commands) if FLAGS.test_dir else {})
  if FLAGS.print_commands:  # names the test sets' files without building them (nor needing data)
    files = {name: test_sets.planned(name, base, root / "test_sets") for name in grid.test_sets}
    files.update(held_out)
    runs = plan(grid, base, base_arguments(sys.argv), seeds, root, files, FLAGS.min_len)
    print("\n".join(command_lines(selected(runs, grid, FLAGS.only))))
    return
  if FLAGS.print_sbatch:  # a job array, one task per run; the test sets built first, here
    slurm.check_mesh(base, slurm.options(FLAGS.sbatch))
    consistency.writable(root, None)
    files = {name: test_sets.build(name, base, seeds[0], root / "test_sets")
             for name in grid.test_sets}
    runs = plan(grid, base, base_arguments(sys.argv), seeds, root,
                {**files, **held_out}, FLAGS.min_len)
    print(slurm.script(grid.name, command_lines(selected(runs, grid, FLAGS.only), slurm.srun),
                       FLAGS.sbatch), end="")
    return
  consistency.writable(root, FLAGS.record)
  files = {name: test_sets.build(name, base, seeds[0], root / "test_sets")
           for name in grid.test_sets}
  files.update(held_out)
  runs = plan(grid, base, base_arguments(sys.argv), seeds, root, files, FLAGS.min_len)
  to_run = selected(runs, grid, FLAGS.only)
  shortest = None  # the runs scored with --also_min_len: extra evaluations, their own tables
  if FLAGS.also_min_len is not None:
    shortest = plan(grid, base, base_arguments(sys.argv), seeds, root, files, FLAGS.also_min_len)
    to_run = with_extra(to_run, shortest)
  pairs = results.read_pairs(Path(FLAGS.pairs), runs) if FLAGS.pairs else None
  log.info("Experiment %s: %d variants x %d seeds = %d runs in %s", grid.name, len(grid.variants),
           len(seeds), len(runs), root)
  if FLAGS.only:
    log.info("--only: running %d of them (%s and the first row); the tables show every run found",
             len(to_run), ", ".join(FLAGS.only))
  record = Path(FLAGS.record) if FLAGS.record else None
  consistency.check(runs, grid.name, root, record)
  if record and (restored := restore_results(runs, record)):
    log.info("Restored %d finished runs from %s (results only: their checkpoints are not kept)",
             restored, record / "runs")

  def write_tables() -> None:  # the config's search; scored where each run ended (train.patience)
    written = tabulate([run.settled() for run in runs], grid, base, files, list(held_out), root,
                       FLAGS.min_len, pairs)
    if record:
      records.record(written, record, f"Experiment `{grid.name}`",
                     time.time() - started, ["transformer-experiment", *sys.argv[1:]])

  failures = [] if FLAGS.collect_only else run_all(to_run, record, FLAGS.parallel, write_tables)
  runs = [run.settled() for run in runs]
  shortest = shortest and [run.settled() for run in shortest]
  if record and FLAGS.collect_only:
    for run in filter(evaluated, runs):
      keep_results(run, record)
  write_tables()
  if shortest:
    written = tabulate(shortest, grid, base, files, list(held_out), root, FLAGS.also_min_len, pairs)
    if record:
      records.record(written, record / f"min_len{FLAGS.also_min_len}", f"Experiment `{grid.name}`",
                     time.time() - started, ["transformer-experiment", *sys.argv[1:]], record)
  print((tables_folder(root, FLAGS.min_len) / "results.md").read_text())
  if failures:
    sys.exit("transformer-experiment: error: some runs failed:\n  " + "\n  ".join(failures))


def run() -> None:
  config_flags.DEFINE_config_file("base", None, "The config every variant changes, e.g. "
                                  "configs/multi30k.py; --base.KEY=VALUE overrides it for all.")
  flags.DEFINE_integer("seeds", 3, "Seeds per variant (config.seed = first_seed, first_seed + 1, ...).")
  flags.DEFINE_integer("first_seed", 0, "The first seed.")
  flags.DEFINE_string("root", None, "Experiment folder (default runs/experiments/<grid name>).")
  flags.DEFINE_integer("parallel", 1, "Runs trained and evaluated at a time. On one GPU several "
                       "small runs share it (each process given 0.9/N of its memory, unless "
                       "XLA_PYTHON_CLIENT_MEM_FRACTION is set); on a CPU keep 1: two runs train no "
                       "faster than one using every core.")
  flags.DEFINE_bool("print_commands", False, "Print one shell line per run (train, then evaluate) "
                    "for a scheduler, and exit.")
  slurm.define_flags()
  flags.DEFINE_bool("collect_only", False, "Only tabulate and plot the runs found in the folder.")
  flags.DEFINE_list("only", None, "Train and evaluate only these variants (and the first row, "
                    "which 'Δ vs' pairs with), e.g. --seeds=3 --only=A-h8 for a third seed where "
                    "two disagree; the tables still show every run of the grid found.")
  flags.DEFINE_string("pairs", None, "A JSON file {\"VARIANT/seedS\": \"BASE_WORKDIR\"} (paths "
                      "relative to it): compare those runs with that base run instead of the first "
                      "row's of their seed, e.g. a base retrained on the machine that trained them "
                      "(float32 training differs in the last bits between CPUs).")
  flags.DEFINE_integer("min_len", None, "Evaluate with transformer-eval --min_len=N (at least N "
                       "tokens per translation; 1 rules out the empty one) instead of the config's "
                       "search; the tables go to ROOT/min_len<N>/, beside the default search's.")
  flags.DEFINE_integer("also_min_len", None, "Also score every run with transformer-eval "
                       "--min_len=N as soon as it is trained, while its checkpoints exist (reports "
                       "_min<N>, kept in the record with the rest), and write that search's tables "
                       "too, in ROOT/min_len<N>/ (and the record's min_len<N>/): both searches from "
                       "a grid whose runs move between machines without their checkpoints.")
  flags.DEFINE_string("test_dir", None, "Also score every run on the held-out test sets in this "
                      "folder (Multi30k's test_2016_flickr, test_2017_flickr and test_2017_mscoco, "
                      "the release's raw files, .gz or plain: not bundled, download them once), "
                      "each with the paired bootstrap against the first row.")
  flags.DEFINE_string("record", None, "Also copy the tables, plots, commands and test-set "
                      "descriptions here, e.g. experiments/results/<name> (the repository's record), "
                      "and keep every finished run's results in its runs/ folder (restored from "
                      "there on a fresh checkout instead of trained again).")
  run_program("transformer-experiment", main, takes_arguments=True)


if __name__ == "__main__":
  run()
