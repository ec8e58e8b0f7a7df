"""BLEU by source length: which variants hold up on long sentences, and which fall off.

The dev set's sentences are split by their source's length in words (whitespace-separated) into
LENGTH_BUCKETS, and each bucket is scored on its own (sacreBLEU, the moving average's translations
where the run keeps one); the 'long' test set (sentences longer than any in training) is the last
point. A table and a figure of BLEU against source length, one line per variant.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU

from transformer.sweeps.grids import Grid

LENGTH_BUCKETS = ((1, 9), (10, 12), (13, 15), (16, 20), (21, 1000))  # source words, inclusive


def bucket_label(bucket: tuple[int, int]) -> str:
  low, high = bucket
  return f"{low}+" if high >= 1000 else f"{low}-{high}"


def bucket_bleu(sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]
                ) -> dict[str, float | None]:
  """{bucket label: sacreBLEU of the sentences whose source has that many words} (None if empty)."""
  words = [len(s.split()) for s in sources]
  scores = {}
  for bucket in LENGTH_BUCKETS:
    chosen = [i for i, n in enumerate(words) if bucket[0] <= n <= bucket[1]]
    scores[bucket_label(bucket)] = (BLEU().corpus_score([hypotheses[i] for i in chosen],
                                                        [[references[i] for i in chosen]]).score
                                    if chosen else None)
  return scores


def add_buckets(rows: list[dict[str, Any]], runs: Sequence[Any], sources: Sequence[str],
                references: Sequence[str], translations: Any) -> None:
  """row['len<label>_bleu'] for every run with dev translations; `translations(report)` reads a
  report's hypotheses (results.translations)."""
  for row, run in zip(rows, runs):
    dev = run.evals.get("dev")
    report = dev and (dev.ema_report if dev.ema_report.is_file() else dev.report)
    hyps = translations(report) if report else None
    if hyps is None or len(hyps) != len(sources):
      continue
    for label, score in bucket_bleu(sources, hyps, references).items():
      row[f"len{label}_bleu"] = score


def sentence_counts(sources: Sequence[str]) -> dict[str, int]:
  words = [len(s.split()) for s in sources]
  return {bucket_label(b): sum(b[0] <= n <= b[1] for n in words) for b in LENGTH_BUCKETS}


def markdown(rows: list[dict[str, Any]], grid: Grid, sources: Sequence[str],
             format_mean_std: Any) -> str:
  """Variants x length buckets (+ the 'long' set where the grid has it), mean ± std over seeds."""
  counts = sentence_counts(sources)
  labels = [bucket_label(b) for b in LENGTH_BUCKETS]
  headers = ["variant", *(f"{label} words ({counts[label]})" for label in labels)]
  long_key = next((k for k in ("long_ema_bleu", "long_bleu")
                   if any(r.get(k) is not None for r in rows)), None) if "long" in grid.test_sets else None
  if long_key:
    headers.append("long set")
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  for variant in grid.variants:
    mine = [r for r in rows if r["variant"] == variant.name and r["finished"]]
    cells = [variant.name] + [format_mean_std([r.get(f"len{label}_bleu") for r in mine])
                              for label in labels]
    if long_key:
      cells.append(format_mean_std([r.get(long_key) for r in mine]))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def figure(rows: list[dict[str, Any]], grid: Grid, path: Path) -> Path | None:
  """BLEU against source length, one line per variant (mean over seeds, the seeds' spread shaded)."""
  labels = [bucket_label(b) for b in LENGTH_BUCKETS]
  long_key = "long_ema_bleu" if any(r.get("long_ema_bleu") is not None for r in rows) else "long_bleu"
  points = labels + (["long set"] if "long" in grid.test_sets else [])
  from matplotlib.figure import Figure  # here: a grid's start need not import matplotlib
  fig = Figure(figsize=(8, 4.5))  # drawn without pyplot's windows (Agg writes the file)
  ax = fig.subplots()
  drawn = False
  for variant in grid.variants:
    mine = [r for r in rows if r["variant"] == variant.name and r["finished"]]
    keys = [f"len{label}_bleu" for label in labels] + ([long_key] if len(points) > len(labels) else [])
    values = [[r[k] for r in mine if r.get(k) is not None] for k in keys]
    if not any(values):
      continue
    mean = np.array([np.mean(v) if v else np.nan for v in values])
    spread = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in values])
    ax.plot(range(len(points)), mean, marker="o", label=variant.name)
    ax.fill_between(range(len(points)), mean - spread, mean + spread, alpha=0.15)
    drawn = True
  if not drawn:
    return None
  ax.set_xticks(range(len(points)), [p if p == "long set" else f"{p} words" for p in points])
  ax.set(xlabel="source length", ylabel="sacreBLEU",
         title=f"{grid.name}: BLEU by source length (mean ± std over seeds)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path
