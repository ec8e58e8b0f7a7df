"""What a training start reads before its first step, what it checks before long work, and the
data wait it reports."""

import time

import pytest
from helpers import tiny_run_config

from transformer.data import text_files
from transformer.data.loader import Loader
from transformer.data.sources import DataError
from transformer.metrics import read_metrics
from transformer.training import train
from transformer.training.train import train_and_evaluate


def no_text(monkeypatch):
  """Makes any reading of a corpus's text an error (metadata stays allowed)."""
  def refuse(*args, **kwargs):
    raise AssertionError("the text was read")
  monkeypatch.setattr(text_files.TextFilePairs, "__init__", refuse)
  monkeypatch.setattr(text_files, "read_lines", refuse)


def test_a_start_with_built_caches_reads_no_text(tmp_path, monkeypatch):
  cfg = tiny_run_config(tmp_path)
  cfg.train.steps = 3
  train_and_evaluate(cfg, str(tmp_path / "first"))  # builds the vocabulary and both caches
  no_text(monkeypatch)
  cfg.train.steps = 4
  assert train_and_evaluate(cfg, str(tmp_path / "first"))["resumed_from"] == 3  # resumed
  assert train_and_evaluate(cfg, str(tmp_path / "second"))["resumed_from"] == 0  # fresh, cached


def test_a_missing_validation_file_is_found_before_anything_is_built(tmp_path):
  cfg = tiny_run_config(tmp_path)
  (tmp_path / "val.de").unlink()
  with pytest.raises(DataError, match=r"data file not found: .*val.de \(the validation split\)"):
    train_and_evaluate(cfg, str(tmp_path / "run"))
  for cache in ("vocab_cache", "token_cache", "run"):
    assert not (tmp_path / cache).exists() or not any((tmp_path / cache).iterdir()), cache


def test_validation_files_that_do_not_pair_up_are_found_before_the_vocabulary_is_trained(tmp_path):
  cfg = tiny_run_config(tmp_path)
  lines = (tmp_path / "val.de").read_text().splitlines()
  (tmp_path / "val.de").write_text("\n".join(lines[:-3]) + "\n")
  with pytest.raises(DataError, match="val.en has 40 lines but .*val.de has 37"):
    train_and_evaluate(cfg, str(tmp_path / "run"))
  assert not (tmp_path / "vocab_cache").exists() or not any((tmp_path / "vocab_cache").iterdir())
  caches = tmp_path / "token_cache"
  assert not caches.exists() or not [c for c in caches.iterdir() if not c.name.startswith(".")]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_trainer_reports_the_share_of_time_it_waited_for_data(tmp_path, monkeypatch, caplog,
                                                                  prefetch):
  cfg = tiny_run_config(tmp_path)
  cfg.train.steps, cfg.train.log_every, cfg.train.eval_every = 4, 2, 100
  cfg.train.device_prefetch = prefetch
  real_batches = Loader.batches
  def slow(self, *args, **kwargs):  # a loader far slower than the tiny model's step
    for item in real_batches(self, *args, **kwargs):
      time.sleep(1.0)
      yield item
  monkeypatch.setattr(Loader, "batches", slow)
  real_validation = train.evaluate_loss
  def slow_validation(*args, **kwargs):  # the one validation (at the last step) takes 0.5 s more
    time.sleep(0.5)
    return real_validation(*args, **kwargs)
  monkeypatch.setattr(train, "evaluate_loss", slow_validation)
  with caplog.at_level("INFO", logger="transformer"):
    summary = train_and_evaluate(cfg, str(tmp_path / "slow"))
  records = read_metrics(tmp_path / "slow", "train")
  waits = [r["data_wait"] for r in records]
  assert len(waits) == 2 and all(0 <= w <= 1 for w in waits)
  # Step 1's batch was read before the loop; step 2 then waited the loader's 1 s, steps 3 and 4
  # 2 s: the share reported, times its interval, is that wait.
  intervals = [records[0]["elapsed"], records[1]["elapsed"] - records[0]["elapsed"]]
  waited = [w * i for w, i in zip(waits, intervals)]
  if prefetch == 0:  # the loop reads each batch itself: it waits the loader's whole time
    assert waited == [pytest.approx(1.0, abs=0.3), pytest.approx(2.0, abs=0.3)]
    assert summary["data_wait_sec"] == pytest.approx(3.0, abs=0.3)
  else:  # the feed reads the next batch while the loop works, so the loop waits the loader's
    # time less its own (the tiny model's steps, a progress line, a checkpoint): most of it
    assert intervals[1] == pytest.approx(2.0, abs=0.3)
    assert 0.5 * 2.0 < waited[1] <= 2.0 + 0.3
    assert 0.5 * 3.0 < summary["data_wait_sec"] <= 3.0 + 0.3
  assert "| data wait " in caplog.text
  # The summary splits the loop's time: the waiting, the validation's 0.5 s (its own
  # compilation counted as compiling), compiling, checkpoints, and the steps as the rest.
  assert 0.5 <= summary["validation_sec"] < 0.8
  assert summary["compile_sec"] > 0 and summary["checkpoint_sec"] >= 0 and summary["steps_sec"] > 0
  parts = ("compile_sec", "validation_sec", "checkpoint_sec", "data_wait_sec", "steps_sec")
  assert sum(summary[k] for k in parts) == pytest.approx(summary["train_time_sec"])
  assert summary["startup_sec"] > 0
  assert read_metrics(tmp_path / "slow", "summary")[-1]["compile_sec"] == pytest.approx(
      summary["compile_sec"], abs=1e-5)
