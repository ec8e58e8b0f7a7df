"""Every table of figures in README.md and docs/, generated from the records in experiments/results.

    python -m experiments.tables            # rewrite every table between its markers
    python -m experiments.tables --check    # list the tables that disagree with their records

A page holds a table as `<!-- NAME:begin -->` ... `<!-- NAME:end -->`; NAME is one of TABLES, each
a function of the record folders it names, registered by the module that holds it: results.py
(translation quality: the README's results, Table 3, the positional study), speed.py (measured
speeds) and compiled.py (programs compiled for hardware that is not here). tests/test_docs_tables.py
fails when a page and its records disagree, and when a page has a table of figures outside such
markers. A figure changes by changing its record (rerun the recipe that wrote it), then this script.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- ([a-z0-9-]+):begin -->\n(.*?)<!-- \1:end -->", re.S)

TABLES: dict[str, Callable[[], str]] = {}


def table(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
  def register(fn: Callable[[], str]) -> Callable[[], str]:
    TABLES[name] = fn
    return fn
  return register


def mean_sd(values: list[float], digits: int = 2, sign: str = "") -> str:
  """'mean ± sample standard deviation' ('+' for `sign`: the mean with its sign, for differences)."""
  mean = f"{statistics.mean(values):{sign}.{digits}f}"
  return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):.{digits}f}"


def markdown_rows(path: Path) -> dict[str, list[str]]:
  """{first cell: cells} of the first markdown table in a record's results.md."""
  rows = {}
  for line in path.read_text().splitlines():
    if line.startswith("|") and not line.startswith("|---"):
      cells = [c.strip() for c in line.strip("|").split("|")]
      rows[cells[0]] = cells
  return rows


def render(text: str) -> str:
  """The page with every table regenerated; an unknown NAME is an error."""
  def fill(match: re.Match) -> str:
    name = match.group(1)
    if name not in TABLES:
      raise KeyError(f"no table named {name!r} (experiments/tables knows {', '.join(TABLES)})")
    return f"<!-- {name}:begin -->\n{TABLES[name]()}\n<!-- {name}:end -->"
  return MARKER.sub(fill, text)


def stale(pages: list[Path] = PAGES) -> list[str]:
  """'page: table' for each table that differs from what its records give."""
  out = []
  for page in pages:
    text = page.read_text()
    want = render(text)
    if want != text:
      have, new = dict(MARKER.findall(text)), dict(MARKER.findall(want))
      out += [f"{page.relative_to(REPO)}: {name}" for name in have if have[name] != new[name]]
  return out


def main(argv: list[str]) -> int:
  if "--check" in argv:
    wrong = stale()
    print("\n".join(wrong) or "every table agrees with its records")
    return 1 if wrong else 0
  for page in PAGES:
    text = page.read_text()
    new = render(text)
    if new != text:
      page.write_text(new)
      print(f"{page.relative_to(REPO)}: updated")
  return 0


# The modules that hold the tables register them on import.
from experiments.tables import compiled, results, speed  # noqa: E402,F401
