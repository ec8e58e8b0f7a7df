"""Tables of figures in the docs are generated from their records: a page that disagrees fails."""

import json

from experiments.analyses import input_pipeline_table


def test_data_page_input_table_is_the_records():
  """docs/data.md's input-side table is what its record's JSON files give, to the character."""
  want = input_pipeline_table.table(input_pipeline_table.PAGE.parents[1] / "experiments" / "results"
                                    / "input_pipeline")
  assert want, "the record is empty"
  assert input_pipeline_table.page_block() == want, (
      "docs/data.md disagrees with experiments/results/input_pipeline; regenerate it with "
      "`python -m experiments.analyses.input_pipeline_table --write`")


def test_input_table_reads_what_the_record_says(tmp_path):
  (tmp_path / "prepare_4.5m.json").write_text(json.dumps({
      "vocabulary": {"seconds": 60.0}, "peak_rss_gib": {"this_process": 3.94, "largest_worker": 0.2},
      "train": {"seconds": 300.0, "pairs_read": 4500000, "workers": 2,
                "dropped": {"empty": 9000, "too_long": 4500, "length_ratio": 9000}}}))
  (tmp_path / "standin.json").write_text(json.dumps(
      {"injected": {"empty": 9000, "too_long": 4500, "length_ratio": 9000}}))
  text = input_pipeline_table.table(tmp_path)
  assert "| both | **6.0 min** |" in text  # 60 s + 300 s
  assert "| dropped: empty / over-long / length ratio > 9 | 9,000 / 4,500 / 9,000 |" in text
  assert "| injected by the generator | 9,000 / 4,500 / 9,000 |" in text
