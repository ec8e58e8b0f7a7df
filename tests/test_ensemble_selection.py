"""Greedy ensemble selection on validation: the search against a brute-force one and a hand-worked
case, and the scorer on real runs."""

import itertools
import shutil

import numpy as np
import pytest

from experiments.analyses import ensemble_selection
from transformer.config import ConfigError
from transformer.training.workdir import load_runs


def test_a_hand_worked_selection_stops_when_no_run_adds():
  scores = {(0,): 1.0, (1,): 3.0, (2,): 2.0, (0, 1): 4.0, (1, 2): 3.5, (0, 1, 2): 3.9}
  rounds = ensemble_selection.forward_selection(3, lambda m: scores[tuple(sorted(m))])
  assert [(r["chosen"], r["members"], r["score"]) for r in rounds] == [
      (1, (1,), 3.0), (0, (1, 0), 4.0), (None, (1, 0), 4.0)]
  assert rounds[1]["tried"] == {0: 4.0, 2: 3.5} and rounds[2]["tried"] == {2: 3.9}
  capped = ensemble_selection.forward_selection(3, lambda m: scores[tuple(sorted(m))], max_members=1)
  assert [r["members"] for r in capped] == [(1,)]
  table = ensemble_selection.table(["a", "b", "c"], rounds)
  assert "| 2 | 4.00* | in | 3.50 | `a` | 4.00 |" in table
  assert "| 3 | in | in | 3.90 | none: stop | 4.00 |" in table


@pytest.mark.parametrize("seed", range(5))
def test_on_an_additive_score_greedy_finds_the_brute_force_best(seed):
  """Where each run adds a fixed amount, the best subset (brute force over all of them) is the runs
  that add more than nothing, and forward selection finds exactly it."""
  gains = np.random.default_rng(seed).normal(size=6)
  score = lambda members: float(sum(gains[i] for i in members))
  subsets = [c for k in range(1, 7) for c in itertools.combinations(range(6), k)]
  best = max(subsets, key=score)
  rounds = ensemble_selection.forward_selection(6, score)
  assert sorted(rounds[-1]["members"]) == sorted(best)
  assert rounds[-1]["score"] == pytest.approx(score(best))


def test_fewer_than_two_runs_is_a_usage_error():
  with pytest.raises(ConfigError, match="at least two runs to choose among"):
    ensemble_selection.main(["ensemble_selection", "runs/a"])


def test_the_scorer_decodes_each_ensemble_once_and_a_copy_adds_nothing(two_step_run, tmp_path):
  """Two copies of one run: each alone scores the same, the first is chosen, and ensembling it with
  its copy (the same distributions averaged) translates alike, so the selection stops at one."""
  copy = tmp_path / "copy"
  shutil.copytree(two_step_run, copy)
  runs = load_runs([two_step_run, copy])
  reports = tmp_path / "reports"
  reports.mkdir()
  score = ensemble_selection.validation_scorer(runs, str(reports), {"beam_size": 1})
  rounds = ensemble_selection.forward_selection(2, score)
  assert rounds[0]["tried"][0] == rounds[0]["tried"][1]
  assert [(r["chosen"], r["members"]) for r in rounds] == [(0, (0,)), (None, (0,))]
  assert rounds[1]["tried"][1] == rounds[0]["score"]
  hyps = sorted(reports.glob("*.hyp.txt"))
  assert len(hyps) == 2  # the single run (its copy: the same report name) and the pair
  assert len({h.read_text() for h in hyps}) == 1
