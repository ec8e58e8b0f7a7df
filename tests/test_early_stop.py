"""train.patience: fairseq's early-stop rule, a run that stops by it, and its resumption."""

import json

import pytest
from helpers import tiny_run_config

from transformer.metrics import read_metrics
from transformer.training.early_stop import patience_stop, stopped_at, validation_losses
from transformer.training.train import train_and_evaluate


def test_fairseqs_patience_rule_stops_after_that_many_validations_without_a_new_best():
  losses = [(1, 3.0), (2, 2.0), (3, 2.5), (4, 2.0), (5, 1.9), (6, 2.1), (7, 2.2), (8, 2.0)]
  assert patience_stop(losses, patience=2) == 4   # 3 and 4 do not beat 2.0 (an equal loss neither)
  assert patience_stop(losses, patience=3) == 8   # 5 is a new best; 6, 7, 8 are not
  assert patience_stop(losses, patience=4) is None  # the rule never fires: the run trains on
  assert patience_stop(losses[:5], patience=1) == 3


def _bouncing_config(tmp_path):
  """A tiny run validated every step at a learning rate so high that its validation loss stops
  improving within its first few steps."""
  cfg = tiny_run_config(tmp_path)
  cfg.train.steps, cfg.train.warmup_steps, cfg.train.learning_rate = 60, 2, 20.0
  cfg.train.eval_every, cfg.train.log_every, cfg.train.checkpoint_every = 1, 4, 5
  cfg.train.keep_checkpoints, cfg.train.patience = 3, 3
  return cfg


def test_a_run_stops_where_the_rule_says_and_a_second_start_does_nothing(tmp_path):
  cfg = _bouncing_config(tmp_path)
  whole = tmp_path / "whole"
  summary = train_and_evaluate(cfg, str(whole))
  losses = validation_losses(whole)
  stop = patience_stop(losses, 3)
  assert stop is not None and 2 < stop < cfg.train.steps, losses
  assert stopped_at(whole) == stop and summary["steps"] == stop
  assert [step for step, _ in losses] == list(range(1, stop + 1))  # nothing validated after it
  assert max(int(p.name) for p in (whole / "checkpoints").iterdir() if p.name.isdigit()) == stop
  assert read_metrics(whole, "train")[-1]["step"] == stop  # its last steps' progress record
  records = len(read_metrics(whole))
  again = train_and_evaluate(cfg, str(whole))
  assert again["resumed_from"] == stop and len(read_metrics(whole)) == records


@pytest.mark.slow
def test_a_resumed_run_stops_where_an_uninterrupted_one_does(tmp_path):
  """Stopped by its step budget before the rule fires, then continued: the rule replays the
  validations before the resume (a fresh count would stop later) and fires where it did."""
  cfg = _bouncing_config(tmp_path)
  whole = tmp_path / "whole"
  train_and_evaluate(cfg, str(whole))
  stop, losses = stopped_at(whole), validation_losses(whole)
  assert stop is not None and stop > 2
  parts = tmp_path / "parts"
  first = cfg.copy_and_resolve_references()
  first.train.steps = 2
  train_and_evaluate(first, str(parts))
  train_and_evaluate(cfg, str(parts))
  assert stopped_at(parts) == stop
  assert validation_losses(parts) == losses  # bit for bit: the same parameters


def _grid(tmp_path, patience):
  from transformer.sweeps.grids import Grid, Variant
  from transformer.sweeps.plan import plan
  cfg = tiny_run_config(tmp_path)
  cfg.train.patience = patience
  grid = Grid("g", [Variant("base"), Variant("wide", {"model.d_ff": 128})], average_last=2)
  return plan(grid, cfg, ["--config=c.py"], [0], tmp_path / "exp", {}), cfg


def test_a_grid_scores_a_run_that_stopped_early_at_its_stop(tmp_path):
  runs, cfg = _grid(tmp_path, patience=3)
  base, wide = runs
  assert base.evals["dev"].report.name == "validation_step6_avg2.json"
  base.workdir.mkdir(parents=True)
  (base.workdir / "metrics.jsonl").write_text(json.dumps({"event": "early_stop", "step": 4}) + "\n")
  settled = base.settled()
  assert settled.final_step == 4 and wide.final_step == 6 == wide.settled().final_step
  assert settled.evals["dev"].report.name == "validation_step4_avg2.json"
  assert settled.evals["dev"].ema_report.name == "validation_step4_avg2_ema.json"
  assert "--step=4" in settled.evals["dev"].command and "--step=6" not in settled.evals["dev"].command
  assert wide.settled() is wide  # no stop: as planned


def test_without_patience_an_early_stop_record_is_not_read(tmp_path):
  (base, _), _ = _grid(tmp_path, patience=0)
  base.workdir.mkdir(parents=True)
  (base.workdir / "metrics.jsonl").write_text(json.dumps({"event": "early_stop", "step": 4}) + "\n")
  assert base.settled().final_step == 6


@pytest.mark.slow
def test_a_grid_run_that_stops_early_is_scored_there_and_not_trained_again(tmp_path):
  import csv
  import os
  import subprocess
  import sys

  from helpers import REPO
  cfg = _bouncing_config(tmp_path)
  cfg.train.checkpoint_every = 1  # the last two, averaged, are the stop's and the one before
  (tmp_path / "c.json").write_text(cfg.to_json())
  config = tmp_path / "c.py"
  config.write_text("import json, ml_collections\ndef get_config():\n  return "
                    f"ml_collections.ConfigDict(json.load(open({str(tmp_path / 'c.json')!r})))\n")
  grid = tmp_path / "grid.py"
  grid.write_text("from transformer.sweeps.grids import Grid, Variant\ndef get_grid():\n"
                  "  return Grid('g', [Variant('base')], average_last=2, select_on='dev')\n")
  command = [sys.executable, "-m", "transformer.sweeps.run", str(grid), f"--base={config}",
             "--seeds=1", f"--root={tmp_path / 'exp'}", f"--record={tmp_path / 'record'}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]
  workdir = tmp_path / "exp" / "base" / "seed0"
  stop = stopped_at(workdir)
  assert stop is not None and stop < cfg.train.steps
  assert (workdir / "eval" / f"validation_step{stop}_avg2.json").is_file()
  with (tmp_path / "exp" / "results.csv").open() as f:
    (row,) = csv.DictReader(f)
  assert (row["finished"], row["steps_done"]) == ("True", str(stop)) and row["dev_bleu"] != ""
  assert "Chosen on dev" in (tmp_path / "exp" / "results.md").read_text()
  again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert again.returncode == 0 and "evaluated already" in again.stderr, again.stderr[-3000:]
