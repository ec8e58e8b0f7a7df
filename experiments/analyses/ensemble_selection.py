"""Which runs to ensemble: greedy forward selection on the validation set (Caruana et al., 2004).

    python -m experiments.analyses.ensemble_selection RUN RUN RUN ... [--average_last=N] \
        [--max_members=K] [--record=experiments/results/NAME] [--beam_size=B ...]

Scores each run alone on its config's validation split, then, starting from the best one, adds the
run whose joining raises the ensemble's validation sacreBLEU most (transformer-eval's --ensemble:
log-probabilities averaged in one beam search), until no run raises it or K runs are in. The runs
must share one vocabulary (load_runs refuses others); kept models (a grid's `model/` folders,
transformer-average --params_only) serve as runs. Only the validation set is read: the chosen
ensemble's test sets are scored once, afterwards, with the printed multi30k_test_sets command.
Each round's candidates, their scores and the choice go in the table (--record: results.md there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

from absl import flags

from transformer.cli import run_program
from transformer.decoding import translator
from transformer.errors import ConfigError
from transformer.evaluation import evaluate as evaluate_lib
from transformer.sweeps import records
from transformer.training.workdir import LoadedRun, load_runs

FLAGS = flags.FLAGS


def forward_selection(count: int, score: Callable[[tuple[int, ...]], float],
                      max_members: int | None = None) -> list[dict]:
  """Greedy selection of members among `count` candidates (indices), `score` a member tuple's
  validation score: one row per round with every candidate tried ('tried': {index: score}), the
  chosen one and the members after it; stops when no candidate beats the members' score."""
  limit = count if max_members is None else min(max_members, count)
  members: tuple[int, ...] = ()
  best = float("-inf")
  rounds = []
  while len(members) < limit:
    tried = {i: score((*members, i)) for i in range(count) if i not in members}
    chosen = max(tried, key=lambda i: (tried[i], -i))  # ties: the earlier candidate
    if tried[chosen] <= best:
      rounds.append({"tried": tried, "chosen": None, "members": members, "score": best})
      break
    members, best = (*members, chosen), tried[chosen]
    rounds.append({"tried": tried, "chosen": chosen, "members": members, "score": best})
  return rounds


def validation_scorer(runs: Sequence[LoadedRun], report_dir: str, search: dict
                      ) -> Callable[[tuple[int, ...]], float]:
  """score(members): validation sacreBLEU of the ensemble of runs[members] (each set decoded once)."""
  caches: dict[int, dict] = {}  # a compiled search per ensemble size
  seen: dict[tuple[int, ...], float] = {}

  def score(members: tuple[int, ...]) -> float:
    key = tuple(sorted(members))  # an ensemble's members decode alike in any order
    if key not in seen:
      chosen = [runs[i] for i in members]
      report = evaluate_lib.evaluate(str(chosen[0].workdir), loaded=chosen, report_dir=report_dir,
                                     compiled_cache=caches.setdefault(len(chosen), {}), **search)
      seen[key] = report["sacrebleu"]["bleu"]
      print(f"validation sacreBLEU {seen[key]:.2f}: {', '.join(str(r.workdir) for r in chosen)}",
            flush=True)
    return seen[key]
  return score


def select(workdirs: Sequence[str], average_last: int = 1, max_members: int | None = None,
           search: dict | None = None) -> list[dict]:
  """Forward selection among the runs in `workdirs` on their validation split (the rounds, as
  forward_selection's; the last one's 'members' is the ensemble)."""
  runs = load_runs(workdirs, None, average_last)  # one vocabulary, or a clear error
  with TemporaryDirectory() as reports:
    return forward_selection(len(runs), validation_scorer(runs, reports, search or {}), max_members)


def table(names: Sequence[str], rounds: Sequence[dict]) -> str:
  """Markdown: a row per round, every candidate's score, the one chosen and the ensemble's."""
  lines = ["| round | " + " | ".join(f"`{n}`" for n in names) + " | chosen | validation sacreBLEU |",
           "|---|" + "---|" * len(names) + "---|---|"]
  for number, row in enumerate(rounds, 1):
    cells = [f"{row['tried'][i]:.2f}" + ("*" if i == row["chosen"] else "") if i in row["tried"]
             else "in" for i in range(len(names))]
    chosen = f"`{names[row['chosen']]}`" if row["chosen"] is not None else "none: stop"
    lines.append(f"| {number} | " + " | ".join(cells) + f" | {chosen} | {row['score']:.2f} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  workdirs = argv[1:]
  if len(workdirs) < 2:
    raise ConfigError("usage: python -m experiments.analyses.ensemble_selection RUN RUN [RUN ...]: "
                      "at least two runs to choose among")
  start = time.time()
  rounds = select(workdirs, FLAGS.average_last, FLAGS.max_members, translator.search_overrides())
  members = rounds[-1]["members"]
  chosen = ",".join(workdirs[i] for i in members)
  text = (f"# Ensemble chosen on validation\n\n{table(workdirs, rounds)}\n"
          f"Chosen: {len(members)} run(s). Score its test sets once with:\n\n"
          f"    python -m experiments.recipes.multi30k_test_sets {chosen} --test_dir=DIR "
          f"--average_last={FLAGS.average_last}\n")
  print(text)
  if FLAGS.record:
    records.record_table(text, FLAGS.record, "Ensemble chosen on validation", time.time() - start,
                         "experiments.analyses.ensemble_selection")
    print(f"Recorded in {Path(FLAGS.record) / 'results.md'}")


def define_flags() -> None:
  flags.DEFINE_integer("average_last", 1, "Each run's mean of its last N checkpoints (a kept "
                       "model holds its mean already: 1 or its N).", lower_bound=1)
  flags.DEFINE_integer("max_members", None, "At most this many runs in the ensemble.",
                       lower_bound=1)
  records.define_record_flag()
  translator.define_search_flags()


if __name__ == "__main__":
  define_flags()
  run_program("experiments.analyses.ensemble_selection", main, takes_arguments=True)
