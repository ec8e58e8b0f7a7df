"""Where a training run's wall time goes: the steps, compiling, validation, checkpoints, waiting for
data, the start-up before the loop, and the evaluations after training, from what the programs wrote.

    python -m experiments.analyses.wall_time RUN [RUN ...] [--output=FILE.md]

Reads each workdir's metrics.jsonl 'summary' records (one per process that trained the run: a
resumed run has several, and the share of a process stopped before its end is not in any) and the
evaluation reports' `total_sec` (transformer-eval: every test set, raw and moving average), and
prints a markdown table, one row per run, with the sum over all rows last; with --output the table
goes to FILE.md with how it was made. Runs from before the trainer split its time are skipped with
a line saying so.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from transformer.metrics import read_metrics
from transformer.sweeps import records

PARTS = {"steps": "steps_sec", "compiling": "compile_sec", "validation": "validation_sec",
         "checkpoints": "checkpoint_sec", "data wait": "data_wait_sec"}


def split(workdir: Path) -> dict[str, float] | None:
  """Seconds per part of the run's training processes, their start-up, and its evaluations."""
  summaries = [r for r in read_metrics(workdir, "summary") if "steps_sec" in r]
  if not summaries:
    return None
  out = {name: sum(r[key] for r in summaries) for name, key in PARTS.items()}
  out["start-up"] = sum(r.get("startup_sec") or 0.0 for r in summaries)
  out["steps trained"] = sum(r["steps"] - r["resumed_from"] for r in summaries)
  out["evaluation"] = sum(json.loads(p.read_text()).get("total_sec", 0.0)
                          for p in (workdir / "eval").glob("*.json"))
  return out


def table(rows: dict[str, dict[str, float]]) -> str:
  """Markdown: each part's minutes and share of the run's wall time (training + evaluation)."""
  names = [*PARTS, "start-up", "evaluation"]
  lines = ["| run | steps trained | wall time | " + " | ".join(names) + " |",
           "|" + "---|" * (len(names) + 3)]
  total = {name: sum(r[name] for r in rows.values()) for name in [*names, "steps trained"]}
  for label, row in [*rows.items(), ("all", total)]:
    wall = sum(row[name] for name in names)
    cells = [label, f"{row['steps trained']:,.0f}", f"{wall / 60:.1f} min"]
    cells += [f"{row[name] / 60:.1f} min ({row[name] / wall:.1%})" for name in names]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="training workdirs")
  parser.add_argument("--output", help="write the table here, with how it was made")
  args = parser.parse_args()
  started = time.time()
  rows = {}
  for run in map(Path, args.runs):
    found = split(run)
    if found is None:
      print(f"{run}: no summary with the time split (trained before the trainer recorded it, or "
            "not finished); skipped")
      continue
    rows[str(run)] = found
  if not rows:
    raise SystemExit("no run with the time split")
  text = table(rows)
  print(text)
  if args.output:
    output = Path(args.output)
    lines = ["# Where the runs' wall time goes", "",
             *records.provenance(["python", "-m", "experiments.analyses.wall_time", *args.runs,
                                  f"--output={args.output}"], time.time() - started), "",
             text, "", "Start-up: the training processes' seconds before their loop (imports, "
             "data, state). Evaluation: transformer-eval after training, every test set, raw "
             "parameters and moving average. Compiling: JAX's tracing, lowering and compilation or "
             "persistent-cache reads, wherever they happened in the loop.", ""]
    output.write_text("\n".join(lines))


if __name__ == "__main__":
  main()
