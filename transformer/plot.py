"""PNG figures that compare runs: curves grouped by variant, and bars with error bars.

matplotlib (the Agg backend: no display needed) draws them; the experiment runner uses these for its
dev-loss and BLEU figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

Curve = Sequence[tuple[float, float]]


def curves_by_group(groups: Mapping[str, Sequence[Curve]], path: Path, xlabel: str, ylabel: str,
                    title: str = "") -> Path:
  """One colour per group (variant), one thin line per member (seed) and their mean drawn thick."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, (name, curves) in enumerate(groups.items()):
    colour = colours[i % len(colours)]
    for curve in curves:
      if curve:
        x, y = zip(*curve)
        ax.plot(x, y, color=colour, alpha=0.35, linewidth=0.8)
    common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves))) if curves else []
    if common:
      mean = [np.mean([dict(c)[x] for c in curves]) for x in common]
      ax.plot(common, mean, color=colour, linewidth=2, label=f"{name} (n={len(curves)})")
  ax.set_xlabel(xlabel)
  ax.grid(alpha=0.3)
  return _save(fig, ax, path, ylabel, title, legend=bool(groups))


def bars_with_error(values: Mapping[str, Mapping[str, Sequence[float]]], path: Path, ylabel: str,
                    title: str = "") -> Path:
  """Grouped bars: one group per key of `values` (variant), one bar per inner key (test set), each
  the mean of its values with the sample standard deviation as the error bar and the value printed."""
  groups = list(values)
  series = sorted({s for inner in values.values() for s in inner},
                  key=lambda s: (s != "dev", s))
  width = 0.8 / max(len(series), 1)
  fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(groups) * max(len(series), 1)), 4.5))
  for j, name in enumerate(series):
    means, stds, xs = [], [], []
    for i, group in enumerate(groups):
      data = list(values[group].get(name, []))
      if data:
        xs.append(i + (j - (len(series) - 1) / 2) * width)
        means.append(float(np.mean(data)))
        stds.append(float(np.std(data, ddof=1)) if len(data) > 1 else 0.0)
    bars = ax.bar(xs, means, width, yerr=stds, capsize=4, label=name)
    ax.bar_label(bars, labels=[f"{m:.1f}" for m in means], fontsize="small", padding=2)
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
