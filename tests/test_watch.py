"""transformer-eval --watch: every new checkpoint evaluated exactly once, the best tracked, a clean stop."""

import json

import pytest
from helpers import tiny_run_config

from transformer.evaluation.evaluate import evaluate
from transformer.evaluation.watch import watch
from transformer.metrics import read_metrics
from transformer.training import checkpoints
from transformer.training.train import train_and_evaluate


def watch_run(workdir, **kwargs):
  """What transformer-eval --watch --beam_size=1 runs."""
  return watch(str(workdir), lambda step: evaluate(str(workdir), step=step, beam_size=1),
               poll_seconds=0.01, search_tag="_greedy", **kwargs)


@pytest.mark.slow
def test_watcher_evaluates_each_new_checkpoint_once_and_stops(tmp_path):
  cfg = tiny_run_config(tmp_path)
  cfg.train.steps, cfg.train.checkpoint_every, cfg.train.eval_every = 4, 2, 4
  workdir = tmp_path / "run"
  train_and_evaluate(cfg, str(workdir))
  assert watch_run(workdir) == [2, 4]  # stops: step 4 is the last

  cfg.train.steps = 6  # training resumes; only the new checkpoint is evaluated
  train_and_evaluate(cfg, str(workdir))
  assert watch_run(workdir) == [6]
  records = read_metrics(workdir, "bleu")
  assert sorted(r["step"] for r in records) == [2, 4, 6]
  best = json.loads((workdir / "eval" / "best.json").read_text())
  assert best["bleu"] == pytest.approx(max(r["bleu"] for r in records), abs=1e-5)  # jsonl rounds
  assert best["step"] == max(records, key=lambda r: r["bleu"])["step"]

  # A run still going (its config asks for more steps) with no new checkpoint: --idle_minutes stops.
  run_config = json.loads((workdir / checkpoints.CONFIG_FILE).read_text())
  run_config["train"]["steps"] = 100
  (workdir / checkpoints.CONFIG_FILE).write_text(json.dumps(run_config))
  assert watch_run(workdir, idle_minutes=1e-4) == []
  assert len(read_metrics(workdir, "bleu")) == 3
  # Steps scored with greedy search are not done for the config's beam search, whose reports keep
  # their own names beside greedy's.
  kept = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert kept[-1] == 6
  assert watch(str(workdir), lambda step: evaluate(str(workdir), step=step), poll_seconds=0.01,
               idle_minutes=1e-4) == kept
  assert {p.name for p in (workdir / "eval").glob("*_step6*.json")} == {
      "validation_step6.json", "validation_step6_greedy.json"}
