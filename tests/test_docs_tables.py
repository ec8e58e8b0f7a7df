"""Tables of figures in README.md and docs/ are generated from their records: a page that disagrees
with a record fails, and so does a table of figures written by hand outside the markers."""

import json
import re

import pytest

from experiments import tables
from experiments.tables import results, speed

# A measured-looking figure: two decimals (BLEU), a ratio, or a number with a unit of time, memory,
# speed or share. Dataset sizes and config values (37,000 BPE, 3,003 lines) are not figures.
FIGURE = re.compile(r"\d+\.\d\d|\d(\.\d+)?×|\b\d+(\.\d+)? ?(ms|s|min|h|GiB|MiB|GB|MB|tokens/s|"
                    r"sentences/s|TFLOP/s|%)(?![\w/])")


@pytest.mark.parametrize("page", tables.PAGES, ids=lambda p: p.name)
def test_every_table_on_the_page_is_what_its_records_give(page):
  text = page.read_text()
  assert tables.render(text) == text, (
      f"{page.name} disagrees with its records: {tables.stale([page])}; regenerate with "
      "`python -m experiments.tables`")


@pytest.mark.parametrize("page", tables.PAGES, ids=lambda p: p.name)
def test_no_table_of_figures_outside_the_markers(page):
  outside = tables.MARKER.sub("", page.read_text())
  outside = re.sub(r"```.*?```", "", outside, flags=re.S)  # commands, not tables
  rows = [line for line in outside.splitlines() if line.startswith("|") and FIGURE.search(line)]
  assert not rows, f"{page.name} has figures in a hand-written table:\n" + "\n".join(rows)


def test_the_figure_pattern_tells_measurements_from_facts():
  assert FIGURE.search("| base | 50.6 ms (48.2–52.1) | 494k |")
  assert FIGURE.search("| learned | 37.42 ± 0.18 |")
  assert FIGURE.search("| float32 | 1.37× |")
  assert not FIGURE.search("| `configs/wmt14_ende.py:base` | newstest2014 (3,003) | 37,000 BPE |")


def test_every_table_is_used_and_every_marker_known():
  used = {name for page in tables.PAGES for name, _ in tables.MARKER.findall(page.read_text())}
  assert used == set(tables.TABLES), (set(tables.TABLES) - used, used - set(tables.TABLES))


def test_a_changed_record_makes_the_page_stale(tmp_path, monkeypatch):
  page = tmp_path / "page.md"
  page.write_text("before\n<!-- paper:begin -->\nsomething old\n<!-- paper:end -->\nafter\n")
  monkeypatch.setattr(tables, "REPO", tmp_path)
  assert tables.stale([page]) == ["page.md: paper"]
  page.write_text(tables.render(page.read_text()))
  assert tables.stale([page]) == []
  assert "| this implementation | not run yet |" in page.read_text()
  page.write_text("<!-- nosuch:begin -->\n<!-- nosuch:end -->\n")
  with pytest.raises(KeyError, match="no table named 'nosuch'"):
    tables.render(page.read_text())


def test_the_paper_row_fills_from_a_wmt_record(tmp_path, monkeypatch):
  record = tmp_path / "wmt14" / "ende-base"
  record.mkdir(parents=True)
  (record / "result.json").write_text(json.dumps({"pair": "en-de", "model": "base",
                                                  "tokenized_bleu": 27.61}))
  monkeypatch.setattr(results, "RESULTS", tmp_path)
  monkeypatch.setattr(results, "REPO", tmp_path)
  assert "| this implementation | 27.6 ([record](wmt14/ende-base)) | not run yet |" in results.paper()


def test_input_table_reads_what_the_record_says(tmp_path):
  (tmp_path / "prepare_4.5m.json").write_text(json.dumps({
      "vocabulary": {"seconds": 60.0}, "peak_rss_gib": {"this_process": 3.94, "largest_worker": 0.2},
      "train": {"seconds": 300.0, "pairs_read": 4500000, "workers": 2,
                "dropped": {"empty": 9000, "too_long": 4500, "length_ratio": 9000}}}))
  (tmp_path / "standin.json").write_text(json.dumps(
      {"injected": {"empty": 9000, "too_long": 4500, "length_ratio": 9000}}))
  text = speed._input_pipeline_table(tmp_path)
  assert "| both | **6.0 min** |" in text  # 60 s + 300 s
  assert "| dropped: empty / over-long / length ratio > 9 | 9,000 / 4,500 / 9,000 |" in text
  assert "| injected by the generator | 9,000 / 4,500 / 9,000 |" in text


def test_a_results_csv_machine_is_shortened_to_its_cpu_and_its_family_and_model_numbers():
  assert results._cpu_name("Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167), 1 cpu "
                          "device(s), JAX 0.10.2") == "Intel Xeon (family 6 model 167)"
  assert results._cpu_name("AMD EPYC (AuthenticAMD family 25 model 1), 1 cpu device(s), JAX 0.10.2"
                          ) == "AMD EPYC (family 25 model 1)"
  assert results._cpu_name("AMD EPYC") == "AMD EPYC"


def test_a_recipes_hours_alone_leave_out_the_intervals_it_shared_or_compiled(tmp_path):
  """Training hours at the pace of the fastest tenth of a run's intervals: here a run whose
  intervals took 1 s a step alone and 2 s shared, restarted once (the new process's first
  interval, from 0, compiles and is left out)."""
  clock, records = 0.0, []
  for step in range(100, 2100, 100):  # 20 intervals: steps 100..2000, a restart after 1000
    if step == 1100:
      clock = 0.0
    clock += 100 * (1.0 if step % 300 == 0 else 2.0) + (30.0 if step in (100, 1100) else 0.0)
    records.append({"event": "train", "step": step, "elapsed": clock})
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert results._alone_hours(tmp_path) == pytest.approx(2000 * 1.0 / 3600)
