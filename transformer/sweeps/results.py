"""Collect an experiment's runs into results.csv, a Table-3-style results.md and two figures.

Everything is read back from what the programs wrote in each workdir: config.json, the last
checkpoint's step (where the checkpoints are gone, the last one metrics.jsonl records),
metrics.jsonl ('eval' records for dev perplexity and the loss curve, 'train' records for training
time, 'summary' for parameters, 'start' for the machine that trained it) and transformer-eval's
JSON reports and translations: BLEU of the last checkpoint's parameters and, for runs that keep
one, of their moving average; and beside every variant a paired bootstrap test against the first
variant, seed by seed (transformer/sweeps/significance.py).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer.errors import ConfigError
from transformer.metrics import (
  METRICS_FILE,
  format_duration,
  read_metrics,
  training_clock,
)
from transformer.model.size import analytic_param_count
from transformer.model.transformer import ModelConfig
from transformer.sweeps import by_length, significance
from transformer.sweeps.grids import Grid
from transformer.training import checkpoints
from transformer.visualisation import plot

log = logging.getLogger("transformer")

# Table 3's hyper-parameter columns: header -> how to read it from a run config.
HYPER_COLUMNS = {
    "N": lambda c, m: c.model.num_layers,
    "d_model": lambda c, m: c.model.d_model,
    "d_ff": lambda c, m: c.model.d_ff,
    "h": lambda c, m: c.model.num_heads,
    "d_k": lambda c, m: m.key_dim,
    "d_v": lambda c, m: m.value_dim,
    "P_drop": lambda c, m: c.model.dropout,
    "ε_ls": lambda c, m: c.train.label_smoothing,
    "positions": lambda c, m: c.model.positional,
    "train steps": lambda c, m: c.train.steps,
}


def trained_steps(workdir: Path) -> int:
  """The step of the run's last complete checkpoint (0 if none): a run is done at train.steps.

  Orbax writes a checkpoint under a temporary name and renames it to its step when complete, so the
  folders named by a number are the complete ones.
  """
  folder = workdir / checkpoints.CHECKPOINT_DIR
  steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
  return max(steps, default=0)


def recorded_steps(workdir: Path) -> int:
  """The last step whose checkpoint the run's metrics.jsonl records as saved (0 if none): what a
  run restored from a record (its results without checkpoints) reached."""
  return max((r["step"] for r in read_metrics(workdir, "checkpoint")), default=0)


def trained_by(records: Sequence[dict[str, Any]], field: str = "machine") -> str | None:
  """What trained a run, from its metrics records' 'start' ones: the machine(s) (field 'machine',
  transformer.hardware) or the code's commit(s) ('commit', transformer.version), joined by ' + '
  where a resumed run changed them; None for runs from before these records said."""
  seen = dict.fromkeys(r[field] for r in records if r["event"] == "start" and field in r)
  return " + ".join(seen) or None


def other_machine(row: dict[str, Any]) -> bool:
  """Whether a row's run and its base are known to have been trained on different machines."""
  return bool(row.get("machine") and row.get("base_machine")
              and row["machine"] != row["base_machine"])


def _report(path: Path) -> dict[str, Any] | None:
  return json.loads(path.read_text()) if path.is_file() else None


def without_brevity_penalty(report: dict[str, Any] | None) -> float | None:
  """A report's sacreBLEU with its brevity penalty divided out: the score of its words alone, which
  a search or lever that only lengthens the translations does not raise."""
  if not report or not report["sacrebleu"].get("brevity_penalty"):
    return None
  return report["sacrebleu"]["bleu"] / report["sacrebleu"]["brevity_penalty"]


def collect(runs: Sequence[Any]) -> list[dict[str, Any]]:
  """One record per run (transformer.sweeps.run.Run): its settings and whatever results exist (None where
  missing)."""
  rows = []
  for run in runs:
    cfg = run.config
    model = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
    row: dict[str, Any] = {"variant": run.variant.name, "row": run.variant.row, "seed": run.seed,
                           "workdir": str(run.workdir)}
    row.update({name: read(cfg, model) for name, read in HYPER_COLUMNS.items()})
    records = read_metrics(run.workdir)
    summaries = [r for r in records if r["event"] == "summary"]
    row["params"] = summaries[-1]["parameters"] if summaries else analytic_param_count(model)
    row["machine"], row["commit"] = trained_by(records), trained_by(records, "commit")
    row["steps_done"] = trained_steps(run.workdir) or recorded_steps(run.workdir)  # or a restored run's
    row["finished"] = row["steps_done"] >= run.final_step  # train.steps, or an early stop
    clock = training_clock([r for r in records if r["event"] == "train"])
    row["train_sec"] = round(clock[-1] if clock else 0.0, 1)
    evals = {r["step"]: r for r in records if r["event"] == "eval"}  # a resumed step: the last
    final = evals.get(row["steps_done"])
    row["dev_ppl"] = final["perplexity"] if final else None
    eval_sec = 0.0
    for name, evaluation in run.evals.items():
      report, averaged = _report(evaluation.report), _report(evaluation.ema_report)
      row[f"{name}_bleu"] = report["sacrebleu"]["bleu"] if report else None
      row[f"{name}_ema_bleu"] = averaged["sacrebleu"]["bleu"] if averaged else None
      row[f"{name}_without_bp"] = without_brevity_penalty(report)
      row[f"{name}_ema_without_bp"] = without_brevity_penalty(averaged)
      row[f"{name}_tokenized_bleu"] = report["tokenized_bleu"]["bleu"] if report else None
      row[f"{name}_lc_tok_bleu"] = (report.get("lc_tok_bleu") or {}).get("bleu") if report else None
      row[f"{name}_ema_lc_tok_bleu"] = ((averaged.get("lc_tok_bleu") or {}).get("bleu")
                                        if averaged else None)
      eval_sec += sum(r["total_sec"] for r in (report, averaged) if r)
    row["eval_sec"] = round(eval_sec, 1)
    rows.append(row)
  return rows


def translations(report: Path) -> list[str] | None:
  """The hypotheses transformer-eval wrote beside a report, one per line (None if missing)."""
  path = report.with_suffix(".hyp.txt")
  return path.read_text().split("\n")[:-1] if path.is_file() else None


def read_pairs(path: Path, runs: Sequence[Any]) -> dict[tuple[str, int], Path]:
  """A pairs file: JSON {"VARIANT/seedS": "BASE_WORKDIR", ...}, workdirs relative to the file's
  folder: these runs are compared with that base run instead of the first row's run of their seed
  (e.g. a base retrained on the machine that trained them: float32 training differs in the last
  bits between CPUs, and with it a run's BLEU). Names that are no run of the grid, and base
  workdirs that are missing, are errors."""
  try:
    entries = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise ConfigError(f"cannot read the pairs file {path}: {e}") from None
  if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
    raise ConfigError(f'{path} must be a JSON object {{"VARIANT/seedS": "BASE_WORKDIR", ...}}')
  names = {f"{run.variant.name}/seed{run.seed}": (run.variant.name, run.seed) for run in runs}
  pairs = {}
  for name, workdir in entries.items():
    if name not in names:
      raise ConfigError(f"{path} pairs {name!r}, which is no run of this grid (runs are named "
                        f"VARIANT/seedS, e.g. {next(iter(names), 'base/seed0')})")
    base = path.parent / workdir
    if not base.is_dir():
      raise ConfigError(f"{path} pairs {name} with {workdir}, which is not a folder ({base})")
    pairs[names[name]] = base
  return pairs


def add_significance(rows: list[dict[str, Any]], runs: Sequence[Any],
                     references: dict[str, Sequence[str]],
                     pairs: dict[tuple[str, int], Path] | None = None) -> None:
  """row['<set>_p']: the paired bootstrap p-value of each run against the first variant's run of
  the same seed on that test set (the moving average's translations where both runs have them),
  for the sets in `references`, and row['<set>_delta']: the BLEU difference it tests; None for the
  first variant and where either run lacks the report or its translations. `pairs` (read_pairs)
  names another base run for some runs: its reports of the same names are compared instead
  (row['paired_with']).

  row['<set>_pooled_p'], the same in every row of a variant with two or more such seeds: the test
  of all its seeds at once, each seed's translations and its base's one after another as one test
  set of seeds x sentences (a difference every seed leans to, each too small to be significant on
  its own, can be significant pooled; like each seed's p it resamples sentences, not trainings);
  row['<set>_seeds_p'] beside it: the two-level bootstrap that resamples the trainings too
  (significance.seeds_bootstrap), the test of the mean over seeds."""
  by_key = {(run.variant.name, run.seed): run for run in runs}
  first = runs[0].variant.name if runs else None
  pairs = pairs or {}
  seeds_of: dict[tuple[str, str], list[tuple[list[str], list[str]]]] = {}
  for row, run in zip(rows, runs):
    other = pairs.get((run.variant.name, run.seed))
    baseline = by_key.get((first, run.seed))
    row["paired_with"] = str(other) if other else None
    base_dir = other or (baseline.workdir if baseline is not None and baseline is not run else None)
    row["base_machine"] = trained_by(read_metrics(base_dir, "start")) if base_dir else None
    if other_machine(row):
      log.warning("%s/seed%d was trained on %s, its base %s on %s: float32 training differs "
                  "between machines, so its Δ and p include that difference; pair it with a base "
                  "trained on its machine (--pairs)", run.variant.name, run.seed, row["machine"],
                  base_dir, row["base_machine"])
    for name, refs in references.items():
      row[f"{name}_p"] = row[f"{name}_delta"] = None
      if name not in run.evals or base_dir is None:
        continue
      mine = run.evals[name]
      theirs = ((other / mine.report.relative_to(run.workdir),
                 other / mine.ema_report.relative_to(run.workdir)) if other else
                (baseline.evals[name].report, baseline.evals[name].ema_report))
      both_ema = mine.ema_report.is_file() and theirs[1].is_file()
      mine, theirs = (mine.ema_report, theirs[1]) if both_ema else (mine.report, theirs[0])
      if not (mine.is_file() and theirs.is_file()):
        if mine.is_file():
          log.warning("%s/seed%d: its base has no %s, so its Δ and p on %s are left blank "
                      "(evaluate the base with the same settings)", run.variant.name, run.seed,
                      theirs, name)
        continue
      row[f"{name}_delta"] = (_report(mine)["sacrebleu"]["bleu"]
                              - _report(theirs)["sacrebleu"]["bleu"])
      hyps, base_hyps = translations(mine), translations(theirs)
      if hyps is not None and base_hyps is not None:
        row[f"{name}_p"] = significance.paired_bootstrap(base_hyps, hyps, refs)
        seeds_of.setdefault((run.variant.name, name), []).append((base_hyps, hyps))
  pooled = {key: significance.paired_bootstrap(
                [h for base, _ in found for h in base], [h for _, mine in found for h in mine],
                [r for _ in found for r in references[key[1]]])
            for key, found in seeds_of.items() if len(found) > 1}
  over_seeds = {key: significance.seeds_bootstrap(found, references[key[1]])
                for key, found in seeds_of.items() if len(found) > 1}
  for row, run in zip(rows, runs):
    for name in references:
      row[f"{name}_pooled_p"] = pooled.get((run.variant.name, name))
      row[f"{name}_seeds_p"] = over_seeds.get((run.variant.name, name))


def mean_std(values: Sequence[float | None]) -> tuple[float, float, int] | None:
  """Mean, sample standard deviation (0 for one value) and count of the values present."""
  present = [v for v in values if v is not None]
  if not present:
    return None
  std = statistics.stdev(present) if len(present) > 1 else 0.0
  return statistics.fmean(present), std, len(present)


def format_mean_std(values: Sequence[float | None], digits: int = 2) -> str:
  summary = mean_std(values)
  if summary is None:
    return "–"
  mean, std, n = summary
  return f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def metric_columns(test_set_names: Sequence[str], rows: Sequence[dict[str, Any]] = ()
                   ) -> dict[str, str]:
  """Result columns of the table: header -> row key. The moving average's BLEU where some run has
  it, for the dev set and each test set."""
  columns = {"PPL (dev)": "dev_ppl"}
  for name in ["dev", *test_set_names]:
    columns[f"BLEU ({name})"] = f"{name}_bleu"
    if any(r.get(f"{name}_ema_bleu") is not None for r in rows):
      columns[f"BLEU ({name}, EMA)"] = f"{name}_ema_bleu"
  return columns


def format_difference(values: Sequence[float | None]) -> str:
  """Signed mean (± sample standard deviation over seeds) of per-seed differences, '–' if none."""
  summary = mean_std(values)
  if summary is None:
    return "–"
  mean, std, n = summary
  return f"{mean:+.2f}" if n == 1 else f"{mean:+.2f} ± {std:.2f}"


def format_p_values(values: Sequence[float | None]) -> str:
  """Each seed's p-value, in seed order ('–' where there is none)."""
  shown = [f"{p:.3f}" for p in values if p is not None]
  return " / ".join(shown) if shown else "–"


def markdown_table(rows: list[dict[str, Any]], grid: Grid) -> str:
  """Rows = variants, Table 3's columns; hyper-parameters equal to the first variant's left blank."""
  metrics = metric_columns(grid.test_sets, rows)
  if grid.select_on:  # what a choosing grid weighs beside the BLEU it chooses on (chosen())
    ema = any(r.get(f"{grid.select_on}_ema_without_bp") is not None for r in rows)
    metrics[f"BLEU without BP ({grid.select_on})"] = (f"{grid.select_on}_ema_without_bp" if ema
                                                      else f"{grid.select_on}_without_bp")
  tested = [name for name in ["dev", *grid.test_sets] if any(f"{name}_p" in r for r in rows)]
  first = grid.variants[0].name
  compared = [h for name in tested for h in (f"Δ vs {first} ({name})", f"p vs {first} ({name})")]
  headers = ["", "variant", *HYPER_COLUMNS, *metrics, *compared, "params ×10⁶", "train min",
             "seeds"]
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  reference = None
  previous_row_label = None
  for variant in grid.variants:
    mine = [r for r in rows if r["variant"] == variant.name]
    first = mine[0]
    hyper = [first[name] for name in HYPER_COLUMNS]
    shown = hyper if reference is None else ["" if h == r else h for h, r in zip(hyper, reference)]
    reference = reference or hyper
    label = variant.row if variant.row != previous_row_label else ""
    previous_row_label = variant.row
    finished = [r for r in mine if r["finished"]]
    cells = [label, variant.name, *map(str, shown)]
    cells += [format_mean_std([r[key] for r in finished]) for key in metrics.values()]
    for name in tested:
      cells += [format_difference([r.get(f"{name}_delta") for r in finished]),
                format_p_values([r.get(f"{name}_p") for r in finished])]
    cells += [f"{first['params'] / 1e6:.3g}",
              format_mean_std([r["train_sec"] / 60 for r in finished], digits=1),
              f"{len(finished)}/{len(mine)}"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def held_out_table(rows: list[dict[str, Any]], grid: Grid, references: dict[str, Sequence[str]]
                   ) -> str:
  """Markdown: a row per variant, for each held-out test set its BLEU (the moving average's where
  every finished run has one), the Δ against the first row and each seed's p."""
  first = grid.variants[0].name
  headers = ["variant"]
  for name in references:
    headers += [f"{name} ({len(references[name]):,})", f"Δ vs {first}", "p"]
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  for variant in grid.variants:
    finished = [r for r in rows if r["variant"] == variant.name and r["finished"]]
    cells = [variant.name]
    for name in references:
      ema = finished and all(r.get(f"{name}_ema_bleu") is not None for r in finished)
      key = f"{name}_ema_bleu" if ema else f"{name}_bleu"
      cells += [format_mean_std([r.get(key) for r in finished]),
                format_difference([r.get(f"{name}_delta") for r in finished]),
                format_p_values([r.get(f"{name}_p") for r in finished])]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def chosen(finished: list[dict[str, Any]], grid: Grid) -> str:
  """The line that names the variant a choosing grid picks: the best mean BLEU over its finished
  seeds on `grid.select_on` (the moving average's where every run has one) among the first row and
  the variants whose BLEU without the brevity penalty is above the first row's too. A gain in
  length alone is left out: it is a property of the validation references' length (longer, for
  their sources, than a test set's may be), not of the translations' words."""
  name = grid.select_on
  means, words = {}, {}
  for variant in grid.variants:
    mine = [r for r in finished if r["variant"] == variant.name]
    ema = bool(mine) and all(r.get(f"{name}_ema_bleu") is not None for r in mine)
    summary = mean_std([r.get(f"{name}_ema_bleu" if ema else f"{name}_bleu") for r in mine])
    if summary:
      means[variant.name] = summary
      words[variant.name] = mean_std([r.get(f"{name}_ema_without_bp" if ema else
                                            f"{name}_without_bp") for r in mine])
  if not means:
    return f"Chosen on {name}: no variant has finished runs yet."
  first = grid.variants[0].name
  base_words = words.get(first)
  length_only = sorted(v for v in means if v != first and base_words and words[v]
                       and means[v][0] > means[first][0]
                       and words[v][0] <= base_words[0])
  best = max((v for v in means if v not in length_only), key=lambda v: means[v][0])
  line = (f"Chosen on {name} (the validation set; the held-out test sets play no part): "
          f"**{best}**, BLEU {means[best][0]:.2f} over {means[best][2]} seed(s), of "
          f"{len(means)} variant(s) with finished runs.")
  if length_only:
    line += (" Above the first row's BLEU by length alone (their BLEU without the brevity penalty "
             f"is not above {first}'s {base_words[0]:.2f}), so not chosen: "
             + ", ".join(f"{v} ({means[v][0]:.2f}; {words[v][0]:.2f})" for v in length_only) + ".")
  return line


def write(rows: list[dict[str, Any]], grid: Grid, root: Path, min_len: int = 0,
          dev_sources: Sequence[str] | None = None,
          held_out: dict[str, Sequence[str]] | None = None) -> list[Path]:
  """results.csv, results.md, curves.png and bleu.png in `root`, for the evaluations with at least
  `min_len` tokens per translation (transformer-eval --min_len); with `dev_sources` (a grid
  `by_length`) also BLEU by source length in results.md and length.png; with `held_out` (test set
  name -> its references) a table of the held-out test sets. Workdirs in results.csv are relative
  to `root`, so the file means the same wherever it is copied with its runs' folder."""
  root.mkdir(parents=True, exist_ok=True)
  csv_path = root / "results.csv"
  fields = list(dict.fromkeys(key for row in rows for key in row))
  with csv_path.open("w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({**r, "workdir": os.path.relpath(Path(r["workdir"]).resolve(), root.resolve())}
                     for r in rows)
  paired = [f"{r['variant']} seed {r['seed']} with `{r['paired_with']}`"
            for r in rows if r.get("paired_with")]
  elsewhere = [f"{r['variant']} seed {r['seed']} ({r['machine']}; its base: {r['base_machine']})"
               for r in rows if other_machine(r)]

  finished = [r for r in rows if r["finished"]]
  unscored = [r for r in finished if r.get("dev_bleu") is None]
  train_sec = sum(r["train_sec"] for r in rows)
  eval_sec = sum(r["eval_sec"] for r in rows)
  md = [f"# Experiment `{grid.name}`", "",
        markdown_table(rows, grid), "",
        f"{len(finished)} of {len(rows)} runs finished"
        + (f", {len(finished) - len(unscored)} of them evaluated with these settings (a run whose "
           "last checkpoint is gone, e.g. restored from a record, cannot be evaluated anew)"
           if unscored else "") + ". Mean ± sample standard deviation over seeds; "
        "PPL is the dev perplexity per target subword token at the last step (teacher-forced); BLEU "
        "is sacreBLEU from transformer-eval (beam search, the config's decode settings"
        + (f" with --min_len={min_len}: no translation shorter than {min_len} token(s)" if min_len
           else "") + ") on the "
        + (f"mean of the last {grid.average_last} checkpoints" if grid.average_last > 1 else
           "last checkpoint")
        + " (EMA: the same checkpoint's moving average of the parameters). 'Δ vs' is each "
        "seed's BLEU minus the same seed's first-row BLEU (the moving average's where both have "
        "one), averaged over seeds (± their spread); 'p vs' is the paired bootstrap p-value "
        "(sacreBLEU, 1,000 resamples of the sentences) of each seed's run against the same seed "
        "of the first row, on the moving average's translations where both "
        "have them: below 0.05, that seed's difference is unlikely to be luck of the test sentences "
        "(the seed-to-seed spread is the ± beside the means). 'train min' is the wall-clock training "
        "time per run (compilation and checkpoints included; noisy on a shared machine). Blank "
        "hyper-parameters equal the first row's.",
        f"Compute: training {format_duration(train_sec)}, evaluation {format_duration(eval_sec)} "
        "(sum over runs of their wall clock: time a run was paused or shared the machine "
        "counts).", ""]
  if grid.select_on:
    md[-1:-1] = [chosen(finished, grid), ""]
  if paired:
    md[-1:-1] = ["Paired with another base run instead of the first row's run of their seed "
                 "(transformer-experiment --pairs): " + "; ".join(paired) + ".", ""]
  if elsewhere:
    md[-1:-1] = ["Compared with a base trained on another machine (float32 training differs "
                 "between machines; their Δ and p include that difference): "
                 + "; ".join(elsewhere) + ".", ""]
  if held_out:
    md += ["## Held-out test sets", "", held_out_table(rows, grid, held_out), "",
           "sacreBLEU of the last checkpoint's moving average (the raw parameters' where a run keeps "
           "none) on each official test set (its sentences in brackets), mean ± std over seeds; Δ "
           "and p as above, against the same seed of the first row. The raw parameters' BLEU and "
           "both's lowercased tokenized BLEU (the literature's) are in results.csv.", ""]
  if dev_sources is not None:
    md += ["## BLEU by source length", "",
           by_length.markdown(rows, grid, dev_sources, format_mean_std), "",
           "sacreBLEU of the dev sentences whose source has that many words (their number in "
           "brackets), the moving average's translations where the run keeps one; 'long set': the "
           "long test set's BLEU. Figure: length.png.", ""]
  (root / "results.md").write_text("\n".join(md))

  workdirs = {v.name: [r["workdir"] for r in rows if r["variant"] == v.name
                      and Path(r["workdir"], METRICS_FILE).is_file()] for v in grid.variants}
  if any(workdirs.values()):
    plot.compare_runs({name: dirs for name, dirs in workdirs.items() if dirs}, root / "curves.png",
                      title=f"{grid.name}: training curves (thin: seeds, thick: their mean)",
                      min_len=min_len)
  bleu = {}
  bars = {label: key for label, key in metric_columns(grid.test_sets, rows).items()
          if label.startswith("BLEU")}  # 'BLEU (dev)', 'BLEU (dev, EMA)', ... -> row key
  for variant in grid.variants:
    bleu[variant.name] = {label[len("BLEU ("):-1]: [r[key] for r in finished
                                                   if r["variant"] == variant.name
                                                   and r[key] is not None]
                          for label, key in bars.items()}
  plot.bars_with_error(bleu, root / "bleu.png", ylabel="sacreBLEU",
                       title=f"{grid.name}: BLEU (mean ± std over seeds)")
  if dev_sources is not None:
    by_length.figure(rows, grid, root / "length.png")
  return [p for p in (csv_path, root / "results.md", root / "curves.png", root / "bleu.png",
                      root / "length.png") if p.exists()]
