"""Multi30k's official test sets, scored once per run, beside the literature's numbers.

    python -m experiments.recipes.multi30k_test_sets RUN[,RUN...] [RUN[,RUN...] ...] --test_dir=DIR \
        [--output_dir=experiments/results/multi30k_test_sets] [--average_last=N] [--report_dir=DIR] \
        [--beam_size=B --alpha=A --length_penalty=fairseq ...]

The runs are seeds of one recipe and one language pair (their configs say which); a comma-separated
RUN,RUN,... is one seed of an ensemble recipe, its runs decoded together (transformer-eval's
--ensemble; they must share the vocabulary). Each is scored
with transformer-eval's search (the moving average of its last checkpoint, as the README's figures,
or with --average_last=N the mean of its last N checkpoints, as the literature scores;
the runs' decode config unless transformer-eval's search flags say otherwise; named in the table)
on its validation split and on the held-out sets (test_sets.HELD_OUT): sacreBLEU and
the literature's lowercased, normalised, Moses-tokenised BLEU (bleu.lc_tok_bleu, multi-bleu.perl on
the release's lc.norm.tok convention). Writes --output_dir/<src>-<tgt>/results.md: each seed, the mean,
and the published numbers beside them (LITERATURE, with their sources).

The test sets are not bundled (the project ships the training and validation data only) and nothing
here downloads at run time; with a network, fetch them once into DIR:

    for f in test_2016_flickr test_2017_flickr test_2017_mscoco; do for l in en de fr; do
      curl -LO https://github.com/multi30k/dataset/raw/master/data/task1/raw/$f.$l.gz; done; done

Choose recipes on validation; this table is for the choice already made.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from absl import flags

from transformer.cli import run_program
from transformer.decoding import translator
from transformer.errors import ConfigError
from transformer.evaluation import evaluate as evaluate_lib
from transformer.sweeps import records, test_sets
from transformer.training.workdir import load_runs

# direction -> [(system, source, lc-tok BLEU on test2016, test2017, mscoco as published: text)]
LITERATURE = {
    "en-de": [
        ("Transformer-Tiny, text only", "Wu et al., 2021, ACL, 'Good for Misconceived Reasons', "
         "their Table 1 (41.02 with its command in github.com/LividWo/Revisit-MMT, "
         "README-baseline.md)", ("41.02", "33.36", "29.88")),
        ("best image-free system (synthetic images)", "Guo et al., 2023, EMNLP, 'Bridging the Gap "
         "between Synthetic and Authentic Images for Multimodal Machine Translation'",
         ("42.50", "36.04", "31.95")),
    ],
    "en-fr": [
        ("best image-free system (synthetic images)", "Guo et al., 2023, EMNLP (as above)",
         ("63.71", "56.17", "46.43")),
    ],
}

FLAGS = flags.FLAGS


def one_direction(configs: Sequence[Any]) -> str:
  """'src-tgt' of the runs' configs, which must all translate the same way (seeds of one recipe)."""
  directions = sorted({f"{c.data.src_lang}-{c.data.tgt_lang}" for c in configs})
  if len(directions) != 1:
    raise ConfigError(f"the runs translate different directions ({', '.join(directions)}); pass "
                      "the seeds of one recipe")
  return directions[0]


def one_search(configs: Sequence[Any], overrides: dict[str, Any]) -> dict[str, Any]:
  """The search (SearchSettings.describe()) that every run decodes with, given the search flags'
  `overrides`; seeds whose configs decode differently would make one table of two searches."""
  searches = {tuple(translator.SearchSettings.from_config(c, **overrides).describe().items())
              for c in configs}
  if len(searches) != 1:
    raise ConfigError("the runs' configs decode differently (decode.*); pass the search flags "
                      "(--beam_size, --alpha, ...) to score them alike, or the seeds of one recipe")
  return dict(searches.pop())


def seed_label(configs: Sequence[Any]) -> str:
  """'seed 0' for a run, 'seeds 0+1' for an ensemble of runs (one seed of an ensemble recipe)."""
  seeds = [str(c.seed) for c in configs]
  return f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + "+".join(seeds)


def report_folder(report_dir: str | None, number: int, count: int) -> str | None:
  """Where seed `number` of `count` writes its reports: None (its first run's eval/), or
  `report_dir`, a subfolder per seed where there are several (their file names would collide)."""
  if not report_dir:
    return None
  folder = Path(report_dir) / f"seed{number}" if count > 1 else Path(report_dir)
  folder.mkdir(parents=True, exist_ok=True)
  return str(folder)


def scores(report: dict) -> dict[str, float]:
  return {"sacrebleu": report["sacrebleu"]["bleu"], "lc_tok": report["lc_tok_bleu"]["bleu"],
          "bp": report["lc_tok_bleu"]["brevity_penalty"]}


def table(direction: str, seeds: Sequence[str], results: dict[str, list[dict[str, float]]],
          search: dict[str, Any]) -> str:
  """Markdown: a row per evaluation set; each seed's lc-tok BLEU, their mean, the mean sacreBLEU and
  brevity penalty, and the published lc-tok BLEU of LITERATURE[direction] on the test sets; under
  it the search (a report's 'decode') and the sources."""
  published = LITERATURE.get(direction, [])
  head = (["set"] + [f"lc-tok BLEU, {s}" for s in seeds] + ["**mean**", "sacreBLEU (mean)",
          "brevity penalty (mean)"] + [system for system, _, _ in published])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, per_seed in results.items():
    mean = {key: statistics.mean(r[key] for r in per_seed) for key in ("lc_tok", "sacrebleu", "bp")}
    test = test_sets.HELD_OUT.index(name) if name in test_sets.HELD_OUT else None
    cells = ([name] + [f"{r['lc_tok']:.2f}" for r in per_seed] + [f"**{mean['lc_tok']:.2f}**",
             f"{mean['sacrebleu']:.2f}", f"{mean['bp']:.3f}"] +
             [numbers[test] if test is not None else "–" for _, _, numbers in published])
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Search: " + ", ".join(f"{key} {value}" for key, value in search.items()) + "."]
  lines += [""] + [f"- {system}: {source}." for system, source, _ in published]
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  workdirs = argv[1:]
  if not workdirs or not FLAGS.test_dir:
    raise ConfigError("usage: python -m experiments.recipes.multi30k_test_sets RUN[,RUN...] "
                      "--test_dir=DIR")
  start = time.time()
  runs = {members: load_runs(members.split(","), None, FLAGS.average_last) for members in workdirs}
  configs = [loaded[0].config for loaded in runs.values()]
  direction, cfg = one_direction(configs), configs[0]
  sets = {cfg.data.eval_split: {}} | test_sets.held_out(FLAGS.test_dir, cfg.data.src_lang,
                                                        cfg.data.tgt_lang)
  if FLAGS.ensemble:
    raise ConfigError("--ensemble does not apply here: name an ensemble's runs as RUN,RUN")
  search = translator.search_overrides()
  described = one_search(configs, search)
  results: dict[str, list[dict[str, float]]] = {}
  for number, (members, loaded) in enumerate(runs.items()):
    cache: dict = {}  # per seed: a compiled search belongs to its runs' models
    reports = report_folder(FLAGS.report_dir, number, len(runs))
    for name, where in sets.items():
      found = scores(evaluate_lib.evaluate(str(loaded[0].workdir), loaded=loaded,
                                           compiled_cache=cache, report_dir=reports, **where,
                                           **search))
      results.setdefault(name, []).append(found)
      print(json.dumps({"workdir": members, "set": name, **found}), flush=True)
  seeds = [seed_label([run.config for run in loaded]) for loaded in runs.values()]
  folder = Path(FLAGS.output_dir) / direction
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / "results.md"
  path.write_text(table(direction, seeds, results, described))
  print(path.read_text())
  records.record([path], folder, f"Multi30k {direction}: validation and the official test sets, "
                 "beside the literature", time.time() - start)


def define_flags() -> None:
  """The program's flags, defined when it runs (not on import: other programs' modules, imported
  beside this one by the tests, define flags of the same names)."""
  flags.DEFINE_string("test_dir", None, "Folder holding test_2016_flickr.en.gz, ... (raw release "
                      "files; .gz or plain).")
  flags.DEFINE_string("output_dir", "experiments/results/multi30k_test_sets", "Where the table goes "
                      "(a record folder per language pair).")
  flags.DEFINE_string("report_dir", None, "Write each set's translations and report here instead "
                      "of the first run's eval/ (a subfolder per seed where there are several); "
                      "kept models in a record are read-only runs.")
  flags.DEFINE_integer("average_last", 1, "Score the mean of each run's last N checkpoints "
                       "(transformer-eval --average_last; the literature's recipe: 10).",
                       lower_bound=1)
  translator.define_search_flags()  # transformer-eval's: --beam_size, --alpha, ..., --cpu_devices


if __name__ == "__main__":
  define_flags()
  run_program("experiments.recipes.multi30k_test_sets", main, takes_arguments=True)
