"""Validation BLEU against minutes of training: the default run's curve, over seeds, beside a peer's.

    python -m experiments.analyses.quality_per_minute runs/d0 runs/d1 [--output_dir=DIR --minutes=10,20,30,40]

For each workdir (one seed each, trained with the same config), the checkpoint closest below 10, 20,
30 and 40 minutes of training (the run's own clock, metrics.jsonl) and the last one are scored with
the default evaluation (transformer-eval's beam search), with the moving average of the parameters
and without it; a report already in WORKDIR/eval is reused. Writes quality_per_minute.md (one row per
time, each seed's BLEU, mean and spread) and quality_per_minute.png, with the reference toolkit's
points from issue 18 drawn beside ours. Those were timed on a slower VM than later ones: `--clock_scale`
puts runs timed elsewhere on its clock (the ratio of the two machines' times for the same run).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from absl import app, flags

from transformer.cli import run_program
from transformer.evaluation.evaluate import evaluate, report_path
from transformer.metrics import read_metrics, training_clock
from transformer.training import checkpoints

FLAGS = flags.FLAGS

# The peer from issue 18: an established PyTorch toolkit, same data, model size and machine.
PEER = {"label": "PyTorch toolkit (issue 18), last checkpoint",
        "points": [(10, 6.8), (20, 26.1), (30, 27.5), (40, 30.7)],
        "averaged": (40, 34.0)}


def checkpoint_minutes(workdir: Path) -> dict[int, float]:
  """{checkpoint step: minutes of training at that step} (interpolated between progress lines)."""
  train = read_metrics(workdir, "train")
  clock = training_clock(train)
  steps = [r["step"] for r in train]
  saved = checkpoints.manager(workdir, read_only=True).all_steps()
  return {s: float(np.interp(s, [0, *steps], [0.0, *clock])) / 60 for s in sorted(saved)}


def time_label(minutes: float) -> str:
  return f"{minutes:g} min"


def pick_steps(minutes_at: dict[int, float], times: Sequence[float]) -> dict[str, int]:
  """{label: step}: the last checkpoint at or before each time, and the final checkpoint."""
  picked = {}
  for t in times:
    before = [s for s, m in minutes_at.items() if m <= t + 1e-9]
    if before:
      picked[time_label(t)] = max(before)
  picked["end"] = max(minutes_at)
  return picked


def score(workdir: Path, step: int, ema: bool, compiled: dict) -> dict:
  """transformer-eval's report for (step, ema), computed once and read back after."""
  cfg_split = checkpoints.load_run_config(workdir).data.eval_split
  path = report_path(workdir, cfg_split, step, ema=ema)
  if path.is_file():
    return json.loads(path.read_text())
  return evaluate(str(workdir), step=step, compiled_cache=compiled, ema=ema)


def spread(values: Sequence[float]) -> str:
  if len(values) < 2:
    return f"{values[0]:.2f}"
  return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main(argv: list[str]) -> None:
  workdirs = [Path(w) for w in argv[1:]]
  if not workdirs:
    raise app.UsageError("pass one or more training workdirs (one seed each)")
  if FLAGS.clock_scale <= 0:
    raise app.UsageError(f"--clock_scale must be positive (a ratio of two machines' times), got "
                         f"{FLAGS.clock_scale:g}")
  times = [float(t) for t in FLAGS.minutes]
  compiled: dict = {}
  # label -> {seed's index: (min, step, ema, raw)}; a seed with no checkpoint by then has no entry
  rows: dict[str, dict[int, tuple[float, int, float, float]]] = {
      label: {} for label in [*map(time_label, times), "end"]}
  for i, workdir in enumerate(workdirs):
    minutes_at = {s: m * FLAGS.clock_scale for s, m in checkpoint_minutes(workdir).items()}
    for label, step in pick_steps(minutes_at, times).items():
      ema, raw = (score(workdir, step, e, compiled)["sacrebleu"]["bleu"] for e in (True, False))
      rows[label][i] = (minutes_at[step], step, ema, raw)
      print(f"{workdir}: {label}: step {step} at {minutes_at[step]:.1f} min: BLEU {ema:.2f} "
            f"(moving average), {raw:.2f} (raw)", flush=True)
  out = Path(FLAGS.output_dir)
  out.mkdir(parents=True, exist_ok=True)
  lines = ["| time | " + " | ".join(f"{w.name}: step (min), BLEU avg / raw" for w in workdirs)
           + " | mean ± sd, moving average | mean ± sd, raw |", "|---" * (len(workdirs) + 3) + "|"]
  for label, by_seed in rows.items():
    if not by_seed:
      continue
    cells = [f"{by_seed[i][1]} ({by_seed[i][0]:.1f}), **{by_seed[i][2]:.2f}** / {by_seed[i][3]:.2f}"
             if i in by_seed else "– (no checkpoint kept by then)" for i in range(len(workdirs))]
    per_seed = list(by_seed.values())
    lines.append(f"| {label} | " + " | ".join(cells) + f" | {spread([r[2] for r in per_seed])} | "
                 f"{spread([r[3] for r in per_seed])} |")
  if FLAGS.clock_scale != 1:
    lines.append(f"\nMinutes on the clock of the peer's machine: this machine's × {FLAGS.clock_scale:g}.")
  (out / "quality_per_minute.md").write_text("\n".join(lines) + "\n")
  fig, ax = plt.subplots(figsize=(6.4, 4))
  for i, workdir in enumerate(workdirs):
    points = sorted((r[i][0], r[i][2], r[i][3]) for r in rows.values() if i in r)
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=f"C{i}",
            label=f"{workdir.name}, moving average")
    ax.plot([p[0] for p in points], [p[2] for p in points], "x--", color=f"C{i}", alpha=0.6,
            label=f"{workdir.name}, raw parameters")
  ax.plot(*zip(*PEER["points"]), "s:", color="gray", label=PEER["label"])
  ax.plot(*PEER["averaged"], "D", color="gray", label="PyTorch toolkit, last 5 averaged")
  ax.set_xlabel("minutes of training (2-core CPU)" if FLAGS.clock_scale == 1 else
                f"minutes of training on the peer's 2-core CPU (this machine's x {FLAGS.clock_scale:g})")
  ax.set_ylabel("validation sacreBLEU")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "quality_per_minute.png", dpi=120)
  print(f"wrote {out / 'quality_per_minute.md'} and {out / 'quality_per_minute.png'}")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  flags.DEFINE_string("output_dir", "experiments/results/default_multi30k", "Where the table and "
                      "the figure go.")
  flags.DEFINE_list("minutes", ["10", "20", "30", "40"], "Training times to read the curve at.")
  flags.DEFINE_float("clock_scale", 1.0, "Multiply every run's minutes by this before reading the curve: "
                     "puts runs timed on a faster machine on the clock of the slower one the peer's points "
                     "were timed on (their ratio of times for the same run, e.g. 1.70).")
  run_program("experiments.analyses.quality_per_minute", main, takes_arguments=True)


if __name__ == "__main__":
  run()
