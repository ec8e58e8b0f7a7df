"""PNG figures that compare runs: training curves of workdirs, and bars with error bars.

    transformer-plot runs/m30k runs/m30k_learned --output=compare.png
    transformer-plot runs/experiments/positional/*/seed* --output=positional.png

`compare_runs` reads each workdir's metrics.jsonl and draws one row of panels per metric (train loss,
dev loss, BLEU per test set) against steps (left) and training hours (right). Runs are grouped by
name, and a workdir called seed<N> takes its parent's name, so an experiment's seeds of a variant share
a colour: a thin line per seed, their mean drawn thick. matplotlib (the Agg backend: no display
needed) draws; the experiment runner uses the same functions for its figures.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from transformer.errors import UserError  # noqa: E402
from transformer.files import writable_file  # noqa: E402
from transformer.metrics import (  # noqa: E402
  METRICS_FILE,
  read_metrics,
  training_clock,
  whole_intervals,
)
from transformer.training import checkpoints  # noqa: E402

Curve = Sequence[tuple[float, float]]
# (label, event, key) of the loss panels; BLEU panels follow, one per test set.
LOSS_METRICS = (("train loss (label-smoothed)", "train", "loss"),
                ("dev loss (nats per token)", "eval", "nll"))
X_AXES = (("step", 0), ("training hours", 1))  # (label, index of x in a run curve's points)


# ------------------------------------------------------------------------------ curves of workdirs

def run_curves(workdir: str | Path, min_len: int | None = None
               ) -> dict[str, list[tuple[float, float, float]]]:
  """{metric label: [(step, training hours, value), ...]} from a workdir's metrics.jsonl: BLEU of
  every search, or only of the one with `min_len` (0: the searches that allow an empty output).

  A step logged twice (a run resumed from an earlier checkpoint) keeps its last value. Training hours
  add up every process that trained the run; eval and BLEU points take the training time at their
  step (interpolated between progress lines).
  """
  records = read_metrics(workdir)
  cfg = _run_config(workdir)
  train = [r for r in records if r["event"] == "train"]
  clock = dict(zip((r["step"] for r in train), training_clock(train)))  # a repeated step: the last
  steps = sorted(clock)
  hours = lambda step: (float(np.interp(step, steps, [clock[s] for s in steps])) / 3600 if clock
                        else float("nan"))
  curves: dict[str, list[tuple[float, float, float]]] = {}
  for label, event, key in LOSS_METRICS:
    logged = [r for r in records if r["event"] == event]
    logged = (whole_intervals(logged, cfg.train.log_every if cfg else 1) if event == "train" else
              _last_per_step(logged))
    points = [(r["step"], hours(r["step"]), r[key]) for r in logged if key in r]
    if points:
      curves[label] = points
  bleu = [r for r in records if r["event"] == "bleu" and r.get("averaged", 1) == 1
          and min_len in (None, r.get("min_len", 0))]
  dev = cfg.data.eval_split if cfg else None  # its BLEU panel comes first
  searches = sorted({(r["test_set"], r.get("min_len", 0)) for r in bleu},
                    key=lambda s: (s[0] != dev, s))
  for test_set, min_len in searches:  # a minimum output length (--min_len) is its own curve
    for ema in (False, True):  # and so is the parameters' moving average
      same_set = _last_per_step([r for r in bleu if r["test_set"] == test_set
                                 and r.get("min_len", 0) == min_len and r.get("ema", False) == ema])
      if same_set:
        label = (f"BLEU ({test_set}{f', min_len {min_len}' if min_len else ''}"
                 f"{', moving average' if ema else ''})")
        curves[label] = [(r["step"], hours(r["step"]), r["bleu"]) for r in same_set]
  return curves


def _run_config(workdir: str | Path):
  """The run's config (None if config.json is unreadable: then no part-interval is merged and no
  BLEU panel goes first)."""
  try:
    return checkpoints.load_run_config(workdir)
  except UserError:
    return None


def _last_per_step(records: list[dict]) -> list[dict]:
  by_step = {r["step"]: r for r in records}
  return [by_step[step] for step in sorted(by_step)]


def run_label(workdir: str | Path) -> str:
  """A workdir's name in the legend; seed<N> folders take their parent's (the variant's) name."""
  path = Path(workdir).resolve()
  return path.parent.name if re.fullmatch(r"seed\d+", path.name) else path.name


def compare_runs(groups: Mapping[str, Sequence[str | Path]], path: Path, title: str = "",
                 min_len: int | None = None) -> plt.Figure:
  """Writes the comparison figure of `groups` ({label: workdirs}) to `path` (BLEU of the searches
  `run_curves` keeps for `min_len`); returns the figure (closed) so callers can inspect its panels."""
  curves = {label: [run_curves(w, min_len) for w in workdirs] for label, workdirs in groups.items()}
  metrics = [m for m, _, _ in LOSS_METRICS if any(m in c for runs in curves.values() for c in runs)]
  for runs in curves.values():  # BLEU panels in the runs' own order (their dev split first)
    for run in runs:
      metrics += [m for m in run if m not in metrics]
  if not metrics:
    raise UserError("no training or evaluation records in metrics.jsonl of "
                     + ", ".join(str(w) for ws in groups.values() for w in ws))
  fig, axes = plt.subplots(len(metrics), len(X_AXES), figsize=(11, 3.2 * len(metrics)),
                           squeeze=False)
  for row, metric in enumerate(metrics):
    for col, (xlabel, index) in enumerate(X_AXES):
      by_group = {label: [[(p[index], p[2]) for p in c[metric]] for c in runs if metric in c]
                  for label, runs in curves.items()}
      draw_groups(axes[row, col], by_group)
      axes[row, col].set_xlabel(xlabel)
      axes[row, col].set_ylabel(metric)
  if title:
    fig.suptitle(title)
  if len(groups) > 6:  # a long legend goes beside the panels, not over the first one
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper right", fontsize="small")
    fig.tight_layout(rect=(0, 0, 0.83, 1))
  else:
    axes[0, 0].legend(fontsize="small")
    fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return fig


# ---------------------------------------------------------------------------------------- drawing

def draw_groups(ax: plt.Axes, groups: Mapping[str, Sequence[Curve]]) -> None:
  """One colour per group (variant), one thin line per member (seed) and their mean drawn thick
  where the members share x values (steps); a lone member is drawn thick itself."""
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  if len(groups) > len(colours):  # a big grid: 20 colours before any repeats
    colours = list(plt.get_cmap("tab20").colors)
  for i, (name, curves) in enumerate(groups.items()):
    colour = colours[i % len(colours)]
    curves = [c for c in curves if c]
    if not curves:
      continue
    marker = "o" if max(len(c) for c in curves) <= 12 else None  # sparse points (BLEU): show them
    label = f"{name} (n={len(curves)})"
    common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves)))
    if len(curves) > 1:
      for curve in curves:
        ax.plot(*zip(*curve), color=colour, alpha=0.35, linewidth=0.8, marker=marker, markersize=3)
    if len(curves) == 1 or common:
      xs = common if len(curves) > 1 else [x for x, _ in curves[0]]
      mean = [np.mean([dict(c)[x] for c in curves]) for x in xs]
      ax.plot(xs, mean, color=colour, linewidth=2, label=label, marker=marker, markersize=4)
    else:  # no shared x values (training hours of several seeds): label the thin lines
      ax.plot([], [], color=colour, linewidth=0.8, label=label)
  ax.grid(alpha=0.3)


def bars_with_error(values: Mapping[str, Mapping[str, Sequence[float]]], path: Path, ylabel: str,
                    title: str = "") -> Path:
  """Grouped bars: one group per key of `values` (variant), one bar per inner key (test set), each
  the mean of its values with the sample standard deviation as the error bar and the value printed."""
  groups = list(values)
  series = sorted({s for inner in values.values() for s in inner},
                  key=lambda s: (s != "dev", s))
  width = 0.8 / max(len(series), 1)
  bars = len(groups) * max(len(series), 1)
  fig, ax = plt.subplots(figsize=(min(16, max(5, 1.1 * bars)), 4.5))  # many bars: narrower ones
  for j, name in enumerate(series):
    means, stds, xs = [], [], []
    for i, group in enumerate(groups):
      data = list(values[group].get(name, []))
      if data:
        xs.append(i + (j - (len(series) - 1) / 2) * width)
        means.append(float(np.mean(data)))
        stds.append(float(np.std(data, ddof=1)) if len(data) > 1 else 0.0)
    drawn = ax.bar(xs, means, width, yerr=stds, capsize=4 if bars <= 16 else 2, label=name)
    ax.bar_label(drawn, labels=[f"{m:.1f}" for m in means], padding=2,
                 fontsize="small" if bars <= 16 else "xx-small")
  ax.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 6 else 0, ha="right"
                if len(groups) > 6 else "center")
  ax.grid(axis="y", alpha=0.3)
  return _save(fig, ax, path, ylabel, title, legend=bool(series))


def _save(fig, ax, path: Path, ylabel: str, title: str, legend: bool) -> Path:
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  if legend:
    ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


# ---------------------------------------------------------------------------------- command line

def main(argv: list[str]) -> None:
  workdirs = argv[1:]
  if not workdirs:
    raise app.UsageError("name the training workdirs to compare: transformer-plot runs/a runs/b")
  missing = [w for w in workdirs if not (Path(w) / METRICS_FILE).is_file()]
  if missing:
    raise UserError(f"no {METRICS_FILE} in {', '.join(missing)}: pass the workdirs that "
                    "transformer-train wrote")
  groups: dict[str, list[str]] = {}
  for workdir in workdirs:
    groups.setdefault(run_label(workdir), []).append(workdir)
  output = writable_file(flags.FLAGS.output, "--output")
  output.parent.mkdir(parents=True, exist_ok=True)
  compare_runs(groups, output, flags.FLAGS.title)
  print(f"{output}: {len(workdirs)} run(s) in {len(groups)} group(s): {', '.join(groups)}")


def run() -> None:
  """Console-script entry point."""
  from transformer.cli import run_program
  flags.DEFINE_string("output", "comparison.png", "The PNG file to write.")
  flags.DEFINE_string("title", "", "A title above the panels.")
  run_program("transformer-plot", main, takes_arguments=True)


if __name__ == "__main__":
  run()
