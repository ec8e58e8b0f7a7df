"""Which Table 3 conclusions change with the training length: two records of the same grid compared.

    python -m experiments.analyses.table3_lengths \
        experiments/results/table3_multi30k/results.csv \
        experiments/results/table3_multi30k_full/results.csv [--output=FILE.md]

For each variant of the second (longer) table that the first also has: each length's Δ against the
first row on the dev set (mean ± spread over seeds, as transformer-experiment computes it: each seed
against the same seed of the first row), the seeds' paired-bootstrap p-values, and a verdict per
length: 'better' or 'worse' where every seed moves the same way with p < 0.05, 'unsettled' where they
do not, 'too few seeds' below two. Then the conclusions that changed between the lengths, and the
variants whose seeds disagree on the sign at the longer length, with how many seeds each has: those
with two get a third (`transformer-experiment ... --seeds=3 --only=NAMES`); with three, the mean
decides.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from absl import app, flags

from transformer.cli import run_program
from transformer.sweeps.results import format_difference, format_p_values

SIGNIFICANT = 0.05  # p below which a seed's difference counts as more than the test sentences' luck


def read_table(path: str | Path) -> dict[str, list[tuple[float | None, float | None]]]:
  """variant -> [(dev Δ, dev p) per seed], in the file's order; None where a run has no value."""
  value = lambda text: float(text) if text not in ("", None) else None
  variants: dict[str, list[tuple[float | None, float | None]]] = {}
  with open(path, newline="") as f:
    for row in csv.DictReader(f):
      variants.setdefault(row["variant"], []).append((value(row.get("dev_delta")),
                                                      value(row.get("dev_p"))))
  return variants


def verdict(seeds: Sequence[tuple[float | None, float | None]]) -> str:
  """'better' / 'worse' when every seed's Δ has that sign with p < 0.05, else 'unsettled'."""
  measured = [(d, p) for d, p in seeds if d is not None and p is not None]
  if len(measured) < 2:
    return "too few seeds"
  if all(d > 0 and p < SIGNIFICANT for d, p in measured):
    return "better"
  if all(d < 0 and p < SIGNIFICANT for d, p in measured):
    return "worse"
  return "unsettled"


def deltas(seeds: Sequence[tuple[float | None, float | None]]) -> list[float]:
  """The seeds' measured Δ values (runs not yet finished left out)."""
  return [d for d, _ in seeds if d is not None]


def signs_disagree(seeds: Sequence[tuple[float | None, float | None]]) -> bool:
  measured = deltas(seeds)
  return any(d > 0 for d in measured) and any(d < 0 for d in measured)


def compare(short: dict, long: dict) -> tuple[list[str], list[str], list[str]]:
  """(markdown table lines, variants whose verdict changed, variants whose long seeds disagree)."""
  lines = ["| variant | Δ short | p short | verdict short | Δ long | p long | verdict long |",
           "|---|---|---|---|---|---|---|"]
  changed, disagree = [], []
  for name in list(long)[1:]:  # the first row is what the others are compared with
    if name not in short:
      continue
    before, after = verdict(short[name]), verdict(long[name])
    lines.append(f"| {name} | {format_difference([d for d, _ in short[name]])} | "
                 f"{format_p_values([p for _, p in short[name]])} | {before} | "
                 f"{format_difference([d for d, _ in long[name]])} | "
                 f"{format_p_values([p for _, p in long[name]])} | {after} |")
    if before != after and "too few seeds" not in (before, after):
      changed.append(f"{name}: {before} -> {after}")
    if signs_disagree(long[name]):
      disagree.append(name)
  return lines, changed, disagree


def report(short_path: str, long_path: str) -> str:
  long = read_table(long_path)
  lines, changed, disagree = compare(read_table(short_path), long)
  seeds = {name: len(deltas(long[name])) for name in disagree}
  counted = [f"{name} ({count} seeds)" for name, count in seeds.items()]
  two = [name for name, count in seeds.items() if count < 3]
  text = [f"Short: `{short_path}`; long: `{long_path}`. Verdicts: every seed's dev Δ of one sign "
          f"with paired-bootstrap p < {SIGNIFICANT}.", "", *lines, "",
          "Changed with the length: " + ("; ".join(changed) if changed else "none"),
          "Seeds disagree on the sign at the long length: " + (", ".join(counted) or "none")
          + (f"; a third seed for those with two: --seeds=3 --only={','.join(two)}" if two else "")]
  return "\n".join(text) + "\n"


def main(argv: list[str]) -> None:
  if len(argv) != 3:
    raise app.UsageError("pass two results.csv files: the shorter runs', then the longer runs'")
  for path in argv[1:]:
    if not Path(path).is_file():
      raise app.UsageError(f"{path}: no such file; pass the results.csv of an experiment record")
  text = report(argv[1], argv[2])
  print(text, end="")
  if flags.FLAGS.output:
    Path(flags.FLAGS.output).write_text(text)


if __name__ == "__main__":
  flags.DEFINE_string("output", None, "Also write the comparison to this markdown file.")
  run_program("table3_lengths", main, takes_arguments=True, compilation_cache=False)
