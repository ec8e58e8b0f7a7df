"""The experiment runner: grids, the long-sentence test set, tables and plots, and a tiny grid end to end."""

import csv
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import matplotlib.image
import ml_collections
import numpy as np
import pytest
import sacrebleu
from helpers import REPO, run_cli, tiny_run_config

from transformer import hardware, version
from transformer.config import ConfigError, base_config
from transformer.data import sources, text_files
from transformer.evaluation import bleu as bleu_lib
from transformer.metrics import MetricWriter, read_metrics
from transformer.model import positions
from transformer.sweeps import records, results, significance, test_sets
from transformer.sweeps.grids import Grid, Variant, load_grid
from transformer.sweeps.plan import check_averaging, command_lines, plan, selected, variant_config
from transformer.sweeps.run import base_arguments


def load_config(path, *args):
  spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


def changed_keys(config, default) -> dict:
  """{'group.key': value} of every config value that differs from `default`'s."""
  return {f"{group}.{key}": value for group, values in config.to_dict().items()
          if isinstance(values, dict) for key, value in values.items()
          if value != default.to_dict()[group][key]}


@pytest.mark.parametrize("base", ["configs/multi30k.py", None])
def test_every_table3_variant_is_a_valid_config(base):
  cfg = load_config(REPO / base) if base else base_config()
  grid = load_grid("table3")
  assert [v.name for v in grid.variants][:5] == ["base", "A-h1", "A-h4", "A-h16", "A-h32"]
  for variant in grid.variants:
    variant_config(cfg, variant, seed=0)


def test_table3_rows_change_what_the_paper_changes():
  grid = {v.name: v for v in load_grid("table3").variants}
  paper_base = base_config()
  cfg = variant_config(paper_base, grid["A-h1"], 0)
  from transformer.model.transformer import ModelConfig
  model = ModelConfig.from_config(cfg.model, 37000)
  assert (model.num_heads, model.key_dim, model.value_dim) == (1, 512, 512)
  model = ModelConfig.from_config(variant_config(paper_base, grid["B-dk16"], 0).model, 37000)
  assert (model.num_heads, model.key_dim, model.value_dim) == (8, 16, 64)
  model = ModelConfig.from_config(variant_config(paper_base, grid["C-d256"], 0).model, 37000)
  assert (model.d_model, model.key_dim) == (256, 32)
  assert variant_config(paper_base, grid["D-ls0.2"], 0).train.label_smoothing == 0.2
  assert variant_config(paper_base, grid["E-learned"], 3).model.positional == "learned"
  assert variant_config(paper_base, grid["E-learned"], 3).seed == 3


def test_bad_variants_and_grids_are_named():
  cfg = base_config()
  with pytest.raises(ConfigError, match="variant odd: config.model.d_model .* divisible"):
    variant_config(cfg, Variant("odd", {"model.num_heads": 7}), 0)
  with pytest.raises(ConfigError, match="variant typo: unknown config key"):
    variant_config(cfg, Variant("typo", {"model.num_head": 7}), 0)
  with pytest.raises(ValueError, match="names variants more than once: a"):
    Grid("g", [Variant("a"), Variant("a")])
  with pytest.raises(ValueError, match="unknown grid 'table4'"):
    load_grid("table4")


def test_a_grid_file_that_imports_what_is_not_installed_is_refused_with_the_reason(tmp_path):
  (tmp_path / "shared_levers.py").write_text("STEPS = 100\n")
  recipe = tmp_path / "mine.py"
  recipe.write_text("from shared_levers import STEPS\n\ndef get_grid():\n  return None\n")
  with pytest.raises(ConfigError, match=r"grid file .*mine.py cannot import shared_levers .*"
                                        r"imports installed packages only"):
    load_grid(str(recipe))


RECIPE_GRIDS = sorted(p.name for p in (REPO / "experiments/recipes").glob("*.py")
                     if "def get_grid" in p.read_text())


@pytest.mark.parametrize("name", RECIPE_GRIDS)
def test_every_recipe_grid_plans_on_the_base_config_its_command_names(name, monkeypatch):
  recipe = REPO / "experiments/recipes" / name
  base = re.search(r"--base=(configs/\w+\.py)", recipe.read_text())
  assert base, f"{name}'s docstring gives no command with --base=configs/..."
  # as transformer-experiment loads it: the project's folder is not on the path
  monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != REPO])
  for module in [m for m in sys.modules if m.split(".")[0] in ("experiments", "configs")]:
    monkeypatch.delitem(sys.modules, module)
  grid = load_grid(str(recipe))
  for variant in grid.variants:  # every key exists, every value validates, enough checkpoints kept
    check_averaging(grid, variant, variant_config(load_config(REPO / base[1]), variant, 0))


def test_the_scaled_table3_changes_the_default_in_every_variant_at_equal_steps():
  from transformer.model.transformer import ModelConfig
  default = load_config(REPO / "configs/multi30k.py")
  grid = load_grid(str(REPO / "experiments/recipes/table3_multi30k.py"))
  configs = {v.name: variant_config(default, v, 0) for v in grid.variants}
  assert {c.train.steps for c in configs.values()} == {1200}
  settings = lambda c: json.dumps({**c.to_dict(), "train": {**c.train.to_dict(), "steps": 0}},
                                  sort_keys=True)
  assert len({settings(c) for c in configs.values()}) == len(configs)  # no variant is the base again
  shape = lambda name: ModelConfig.from_config(configs[name].model, 8000)
  assert [(shape(f"A-h{h}").num_heads, shape(f"A-h{h}").key_dim) for h in (1, 2, 8, 16)] == [
      (1, 256), (2, 128), (8, 32), (16, 16)]  # (A): d_k = d_v = d_model / h, compute constant
  assert (shape("B-dk16").key_dim, shape("B-dk16").value_dim) == (16, 64)
  assert (shape("C-d512").d_model, shape("C-d512").key_dim) == (512, 128)
  assert [v.row for v in grid.variants].count("(C)") == 7


def test_a_grid_file_is_loaded_and_checked(tmp_path):
  good = tmp_path / "warmup.py"
  good.write_text("from transformer.sweeps.grids import Grid, Variant\n"
                  "def get_grid():\n"
                  "  return Grid('warmup', [Variant('w400', {'train.warmup_steps': 400}),\n"
                  "                         Variant('w1600', {'train.warmup_steps': 1600})])\n")
  grid = load_grid(str(good))
  assert [v.overrides["train.warmup_steps"] for v in grid.variants] == [400, 1600]
  bad = tmp_path / "bad.py"
  bad.write_text("GRID = 1\n")
  with pytest.raises(ValueError, match="has no get_grid"):
    load_grid(str(bad))
  with pytest.raises(ValueError, match="not found"):
    load_grid(str(tmp_path / "missing.py"))


def test_commands_carry_the_base_overrides_variant_and_seed(tmp_path):
  argv = ["run.py", "positional", "--base=configs/multi30k.py", "--base.train.steps=600", "--seeds=2"]
  args = base_arguments(argv)
  assert args == ["--config=configs/multi30k.py", "--config.train.steps=600"]
  files = {"long": {"source_file": "x/long.en", "reference_file": "x/long.de"}}
  runs = plan(load_grid("positional"), base_config(), args, [0, 1], tmp_path, files)
  kinds = positions.kinds()  # the grid: every registered kind, the paper's first
  assert [(r.variant.name, r.seed) for r in runs] == [(k, s) for s in (0, 1) for k in kinds]
  learned = runs[len(kinds) + 1]
  assert learned.train == ["transformer-train", *args, "--config.model.positional=learned",
                           "--config.seed=1", f"--workdir={tmp_path}/learned/seed1"]
  eval_dir = tmp_path / "learned/seed1/eval"
  assert learned.evals["dev"] == (eval_dir / "validation_step100000.json",
                                  eval_dir / "validation_step100000_ema.json",
                                  ["transformer-eval", f"--workdir={tmp_path}/learned/seed1",
                                   "--step=100000", "--split=validation"])
  assert learned.evals["long"].command[-2:] == ["--source_file=x/long.en",
                                                "--reference_file=x/long.de"]
  assert learned.evals["long"].report == eval_dir / "long_step100000.json"
  assert learned.evals["long"].ema_report == eval_dir / "long_step100000_ema.json"
  # A minimum output length: every evaluation passes it and writes reports of its own name.
  shortest = plan(load_grid("positional"), base_config(), args, [1], tmp_path, files, min_len=1)[1]
  assert shortest.variant.name == "learned"
  assert shortest.train == learned.train
  assert shortest.evals["dev"] == (eval_dir / "validation_step100000_min1.json",
                                   eval_dir / "validation_step100000_min1_ema.json",
                                   [*learned.evals["dev"].command, "--min_len=1"])
  assert shortest.evals["long"].command == [*learned.evals["long"].command, "--min_len=1"]



def test_a_grid_that_keeps_models_plans_their_averaging_after_the_evaluations(tmp_path):
  grid = Grid("g", [Variant("a")], average_last=10, keep_models="float16")
  cfg = base_config()
  cfg.train.keep_checkpoints = 10
  (run,) = plan(grid, cfg, [], [0], tmp_path, {})
  assert run.keep_model == ("transformer-average", f"--workdir={tmp_path}/a/seed0", "--last=10",
                            f"--output={tmp_path}/a/seed0/model", "--params_only", "--dtype=float16")
  assert command_lines([run])[0].endswith(" && " + shlex.join(run.keep_model))
  assert plan(Grid("g", [Variant("a")]), cfg, [], [0], tmp_path, {})[0].keep_model == ()
  with pytest.raises(ConfigError, match="keep_models is the dtype to keep the runs' parameters in, "
                                        "'float16' or 'float32' .'' for none., got 'bf16'"):
    Grid("g", [Variant("a")], keep_models="bf16")


def test_only_runs_the_named_variants_and_the_first_row_they_are_compared_with(tmp_path):
  grid = load_grid("table3")
  runs = plan(grid, base_config(), [], [0, 1, 2], tmp_path, {})
  chosen = selected(runs, grid, ["A-h4", "C-N2"])
  assert [(r.variant.name, r.seed) for r in chosen] == [
      (name, seed) for seed in (0, 1, 2) for name in ("base", "A-h4", "C-N2")]
  assert selected(runs, grid, None) == runs
  with pytest.raises(ConfigError, match=r"--only: no variant A-h3, D-x in grid table3; its "
                                        r"variants are base, A-h1, "):
    selected(runs, grid, ["A-h3", "A-h4", "D-x"])


def test_record_copies_what_exists_into_the_results_folder(tmp_path):
  root = tmp_path / "runs"
  (root / "test_sets").mkdir(parents=True)
  (root / "results.md").write_text("| table |\n")
  (root / "test_sets/long.json").write_text('{"sentences": 3}\n')
  (root / "results.csv").write_text(f"variant,workdir\nbase,{Path.cwd().resolve()}/runs/x/seed0\n")
  folder = tmp_path / "experiments/results/grid"
  folder.mkdir(parents=True)
  (folder / "README.md").write_text("# old\n\n## Notes\n\nWhat the numbers mean.\n")
  files = [root / "results.md", root / "results.csv", root / "test_sets/long.json", root / "curves.png"]
  records.record(files, folder, "Experiment `grid`", 125.0, ["transformer-experiment", "grid"])
  assert sorted(p.name for p in folder.iterdir()) == [  # no curves yet
      "README.md", "long.json", "results.csv", "results.md"]
  assert (folder / "results.md").read_text() == "| table |\n"
  assert json.loads((folder / "long.json").read_text()) == {"sentences": 3}
  assert (folder / "results.csv").read_text() == "variant,workdir\nbase,runs/x/seed0\n"
  readme = (folder / "README.md").read_text()
  assert readme.startswith("# Experiment `grid`\n")
  for line in ("- command: `transformer-experiment grid`", "- commit: ", "- date: 20", "- JAX 0.",
               "- CPU: ", "- wall time: 2.1 min", "## Notes\n\nWhat the numbers mean.\n"):
    assert line in readme, line


def test_a_records_own_rewritten_files_do_not_mark_its_commit_as_uncommitted(tmp_path, monkeypatch):
  git = lambda *args: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                                     cwd=tmp_path, check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "record").mkdir()
  (tmp_path / "record" / "results.md").write_text("old\n")
  (tmp_path / "code.py").write_text("x = 1\n")
  git("add", "-A")
  git("commit", "-qm", "first")
  monkeypatch.chdir(tmp_path)
  (tmp_path / "record" / "results.md").write_text("new\n")  # what recording writes
  head = git("rev-parse", "--short=12", "HEAD").stdout.decode().strip()
  assert records.commit(tmp_path / "record") == head
  assert records.commit().endswith(" + uncommitted changes")
  records.record([], tmp_path / "record" / "min_len1", "Nested", 60.0, ["cmd"], tmp_path / "record")
  assert f"- commit: {head}\n" in (tmp_path / "record" / "min_len1" / "README.md").read_text()
  (tmp_path / "code.py").write_text("x = 2\n")  # a change to the code is one
  assert records.commit(tmp_path / "record").endswith(" + uncommitted changes")


class WordVocab:
  """A stand-in vocabulary: one token per word."""
  def encode(self, text):
    return [[1] * len(t.split()) for t in text] if isinstance(text, list) else [1] * len(text.split())


def test_long_sentences_join_consecutive_pairs_past_the_training_length():
  source = [f"s{i} " + "w " * (i % 4) for i in range(40)]
  target = [f"t{i}" for i in range(40)]
  long_src, long_tgt = test_sets.join_until_longer(source, target, WordVocab(), longer_than=6,
                                                  max_len=9)
  assert long_src
  position = 0
  for src, tgt in zip(long_src, long_tgt):
    assert 6 < len(src.split()) + 1 <= 9      # tokens with EOS
    first = int(src.split()[0][1:])
    assert first >= position                  # consecutive pairs, in order, none reused
    parts = tgt.split()
    assert parts == [f"t{i}" for i in range(first, first + len(parts))]
    assert src == " ".join(source[i].strip() for i in range(first, first + len(parts)))
    position = first + len(parts)


def test_joined_pairs_read_as_one_sentence_each_side():
  assert test_sets.join_clauses(["A man sits.", "Two dogs run!", "A cat sleeps."], "en") == \
      "A man sits, and two dogs run, and a cat sleeps."
  assert test_sets.join_clauses(["Ein Mann sitzt.", "Männer laufen."], "de") == \
      "Ein Mann sitzt, und Männer laufen."  # German nouns keep their capital
  assert test_sets.join_clauses(["a.", "b"], "xx") == "a. b"  # no conjunction known: spaces
  source, target = test_sets.join_until_longer(["A man sits.", "A dog runs."], ["Ein Mann sitzt.",
                                               "Ein Hund läuft."], WordVocab(), 4, 20, "en", "de")
  assert (source, target) == (["A man sits, and a dog runs."], ["Ein Mann sitzt, und Ein Hund läuft."])


def test_long_set_needs_room_below_max_len(tmp_path):
  cfg = tiny_run_config(tmp_path)
  cfg.data.max_len = 4  # every training source is longer: nothing is kept below it
  vocab_path = tmp_path / "v.model"
  from transformer.data import vocab as vocab_lib
  train = sources.open_split(cfg.data, "train")
  vocab_lib.train_vocab(train.read(range(len(train)))[0], vocab_path, 300, "bpe")
  vocab = vocab_lib.load_vocab(vocab_path)
  with pytest.raises(ValueError, match="no joined dev sentences|lower data.max_len"):
    test_sets.long_sentences(cfg, vocab, tmp_path / "sets")


def fake_rows():
  """Result rows of three seeds of two variants, as results.collect makes them."""
  from transformer.model.transformer import ModelConfig
  rows = []
  for variant, ppl, bleu in (("base", [5.0, 5.2, 5.4], [30.0, 31.0, 32.5]),
                             ("E-learned", [5.1, 5.1, 5.1], [29.0, 30.0, 31.0])):
    overrides = {"model.positional": "learned"} if variant != "base" else {}
    for seed in range(3):
      cfg = variant_config(base_config(), Variant(variant, overrides), seed)
      model = ModelConfig.from_config(cfg.model, 37000)
      row = {"variant": variant, "row": "", "seed": seed, "finished": True,
             "params": 63e6, "dev_ppl": ppl[seed], "dev_bleu": bleu[seed],
             "train_sec": 60.0 * (seed + 1) if variant == "base" else 90.0,
             "eval_sec": 1.0, "dev_ema_bleu": bleu[seed] + 1.0,
             "dev_p": None if variant == "base" else [0.001, 0.2, 0.04][seed],
             "dev_delta": None if variant == "base" else [-1.0, -1.0, -1.5][seed]}
      row.update({name: read(cfg, model) for name, read in results.HYPER_COLUMNS.items()})
      rows.append(row)
  return rows


def test_table_reports_mean_and_sample_std_and_blanks_unchanged_settings():
  grid = Grid("t", [Variant("base"), Variant("E-learned", {"model.positional": "learned"}, "(E)")])
  table = results.markdown_table(fake_rows(), grid).splitlines()
  header = [c.strip() for c in table[0].strip("|").split("|")]
  assert header[2:12] == ["N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls", "positions",
                          "train steps"]
  base = [c.strip() for c in table[2].strip("|").split("|")]
  learned = [c.strip() for c in table[3].strip("|").split("|")]
  assert base[2:8] == ["6", "512", "2048", "8", "64", "64"]
  assert learned[2:10] == [""] * 8 and learned[10] == "learned" and learned[0] == "(E)"
  ppl_mean, ppl_std = np.mean([5.0, 5.2, 5.4]), np.std([5.0, 5.2, 5.4], ddof=1)
  assert base[header.index("PPL (dev)")] == f"{ppl_mean:.2f} ± {ppl_std:.2f}"
  assert learned[header.index("BLEU (dev)")] == "30.00 ± 1.00"
  assert learned[header.index("BLEU (dev, EMA)")] == "31.00 ± 1.00"
  assert learned[header.index("p vs base (dev)")] == "0.001 / 0.200 / 0.040"
  assert base[header.index("p vs base (dev)")] == "–" == base[header.index("Δ vs base (dev)")]
  assert learned[header.index("Δ vs base (dev)")] == f"{-3.5 / 3:+.2f} ± {np.std([1, 1, 1.5], ddof=1):.2f}"
  assert header.index("Δ vs base (dev)") + 1 == header.index("p vs base (dev)")
  assert base[header.index("seeds")] == "3/3"
  assert base[header.index("train min")] == "2.0 ± 1.0" and learned[header.index("train min")] == "1.5 ± 0.0"


def test_finished_steps_ignore_checkpoints_still_being_written(tmp_path):
  assert results.trained_steps(tmp_path) == 0
  for name in ("3", "6", "9.orbax-checkpoint-tmp-123"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert results.trained_steps(tmp_path) == 6


def test_bleu_bars_are_written(tmp_path):
  path = results.plot.bars_with_error({"a": {"dev": [30.0, 31.0], "long": [20.0, 22.0]},
                                       "b": {"dev": [29.0], "long": []}}, tmp_path / "b.png", "BLEU")
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300


def write_short_sentence_config(tmp_path):
  """A tiny run config as a config file, trained on short pairs only (so dev pairs can be longer)."""
  cfg = tiny_run_config(tmp_path, train_lines=600)
  src, tgt = (text_files.read_lines(cfg.data[k]) for k in ("train_src", "train_tgt"))
  keep = [i for i, s in enumerate(src) if len(s.split()) <= 9]
  Path(cfg.data.train_src).write_text("".join(src[i] + "\n" for i in keep))
  Path(cfg.data.train_tgt).write_text("".join(tgt[i] + "\n" for i in keep))
  cfg.data.max_len = 64
  cfg.model.max_len = 96
  cfg.train.eval_every = 2
  (tmp_path / "tiny.json").write_text(cfg.to_json())
  path = tmp_path / "tiny.py"
  path.write_text("import json, ml_collections\n"
                  "def get_config():\n"
                  f"  return ml_collections.ConfigDict(json.load(open({str(tmp_path / 'tiny.json')!r})))\n")
  return path


def run_experiment(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  return subprocess.run([sys.executable, "-m", "transformer.sweeps.run", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=900)


def check_results(root, long_info):
  """results.csv of the tiny grid: both runs finished, workdirs relative to it, scores = reports."""
  with (root / "results.csv").open() as f:
    rows = list(csv.DictReader(f))
  assert [(r["variant"], r["finished"], r["steps_done"], r["workdir"]) for r in rows] == [
      ("sinusoidal", "True", "6", "sinusoidal/seed0"), ("learned", "True", "6", "learned/seed0")]
  for row in rows:
    report = json.loads((root / row["workdir"] / "eval/long_step6.json").read_text())
    assert float(row["long_bleu"]) == pytest.approx(report["sacrebleu"]["bleu"])
    assert report["sacrebleu"]["lines"] == long_info["sentences"]
    assert float(row["dev_ppl"]) > 1
    assert row["commit"] == version.commit()  # the code that trained it, in its row
  return rows


def test_a_records_kept_runs_are_committed_while_workdirs_are_ignored():
  def ignored(path):
    status = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode
    if status == 128:
      pytest.skip("not a git checkout")
    return status == 0
  assert ignored("runs/m30k/metrics.jsonl")
  assert not ignored("experiments/results/a_grid/runs/base/seed0/metrics.jsonl")
  assert not ignored("experiments/results/a_grid/runs/base/seed0/model/params.msgpack")
  assert not ignored("experiments/results/a_grid/runs/base/seed0/model/vocab.model")


@pytest.mark.slow
def test_a_tiny_grid_runs_end_to_end_resumes_and_skips(tmp_path):
  config = write_short_sentence_config(tmp_path)
  root = tmp_path / "exp"
  grid = tmp_path / "positional_pair.py"  # the positional grid's machinery, on two of its kinds
  grid.write_text("from transformer.sweeps.grids import Grid, Variant\n"
                  "def get_grid():\n"
                  "  return Grid('positional', [Variant('sinusoidal', {'model.positional': "
                  "'sinusoidal'}), Variant('learned', {'model.positional': 'learned'}, '(E)')], "
                  "test_sets=('long',), by_length=True)\n")
  common = [str(grid), f"--base={config}", "--seeds=1", f"--root={root}"]

  printed = run_experiment(*common, "--print_commands")
  assert printed.returncode == 0, printed.stderr
  lines = printed.stdout.strip().splitlines()
  assert len(lines) == 2 and "--config.model.positional=learned" in lines[1]
  assert not (root / "test_sets").exists()  # printing the commands builds nothing

  # Interrupt 'learned' half-way: its own training command, stopped at step 3 of 6.
  first = lines[1].split(" && ")[0].split()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  half = subprocess.run([sys.executable, "-m", "transformer.training.train", *first[1:],
                         "--config.train.steps=3"], cwd=REPO, env=env, capture_output=True, text=True)
  assert half.returncode == 0, half.stderr

  done = run_experiment(*common)
  assert done.returncode == 0, done.stderr
  assert "learned seed 0: resuming from step 3 to step 6" in done.stderr
  assert "sinusoidal seed 0: training to step 6" in done.stderr
  assert "Resumed from the checkpoint at step 3" in (root / "learned/seed0/train.log").read_text()
  long_info = json.loads((root / "test_sets/long.json").read_text())
  assert long_info["sentences"] > 0
  assert long_info["source_tokens_min"] > long_info["longest_training_source_tokens"]
  rows = check_results(root, long_info)
  # The paired bootstrap of learned against sinusoidal on each set, from their translations.
  runs = {r["variant"]: root / r["workdir"] for r in rows}
  for name, refs, stem in (("dev", (tmp_path / "val.de").read_text().splitlines(), "validation"),
                           ("long", text_files.read_lines(long_info["reference_file"]), "long")):
    hyps = [(runs[v] / "eval" / f"{stem}_step6.hyp.txt").read_text().split("\n")[:-1]
            for v in ("sinusoidal", "learned")]
    assert float(rows[1][f"{name}_p"]) == pytest.approx(significance.paired_bootstrap(*hyps, refs))
    assert rows[0][f"{name}_p"] == "" == rows[0][f"{name}_delta"]
    # The difference it tests: the moving average's BLEU where both runs have one.
    key = f"{name}_ema_bleu" if rows[1][f"{name}_ema_bleu"] else f"{name}_bleu"
    assert float(rows[1][f"{name}_delta"]) == pytest.approx(float(rows[1][key]) - float(rows[0][key]))
  table = (root / "results.md").read_text()
  assert "| BLEU (long) |" in table and "| learned |" in table and "2 of 2 runs finished" in table
  assert ("| Δ vs sinusoidal (dev) | p vs sinusoidal (dev) | Δ vs sinusoidal (long) "
          "| p vs sinusoidal (long) |") in table
  assert "## BLEU by source length" in table and "| variant | 1-9 words (" in table
  for name in ("curves.png", "bleu.png", "length.png"):
    assert matplotlib.image.imread(root / name).ndim == 3
  assert (root / "commands.sh").read_text().splitlines()[1:] == lines  # what --print_commands said

  reports = sorted((root).glob("*/seed0/eval/*.json"))
  stamps = [p.stat().st_mtime_ns for p in reports]
  again = run_experiment(*common, f"--record={tmp_path / 'record'}")
  assert again.returncode == 0, again.stderr
  assert again.stderr.count("skipping training") == 2
  assert [p.stat().st_mtime_ns for p in reports] == stamps  # nothing evaluated twice
  recorded = sorted(p.name for p in (tmp_path / "record").iterdir())
  assert recorded == ["README.md", "bleu.png", "commands.sh", "curves.png", "length.png", "long.json",
                      "results.csv", "results.md", "runs"]
  assert f"- command: `transformer-experiment {grid}" in (tmp_path / "record/README.md").read_text()
  assert (tmp_path / "record/results.md").read_text() == table

  # The held-out test sets from a folder (here slices of the training text under their names):
  # every run scored on each, nothing trained again, a table with Δ and p against the first row.
  test_dir = tmp_path / "held_out"
  test_dir.mkdir()
  for i, name in enumerate(test_sets.HELD_OUT):
    for lang in ("en", "de"):
      lines = (tmp_path / f"train.{lang}").read_text().splitlines()[10 * i:10 * i + 10]
      (test_dir / f"{name}.{lang}").write_text("\n".join(lines) + "\n")
  common.append(f"--test_dir={test_dir}")
  scored = run_experiment(*common, f"--record={tmp_path / 'record'}")
  assert scored.returncode == 0, scored.stderr
  assert scored.stderr.count("skipping training") == 2 and scored.stderr.count("evaluating -> ") == 6
  with (root / "results.csv").open() as f:
    rows = {r["variant"]: r for r in csv.DictReader(f)}
  refs = (test_dir / "test_2017_mscoco.de").read_text().splitlines()
  hyps = [(root / v / "seed0/eval/test_2017_mscoco_step6.hyp.txt").read_text().split("\n")[:-1]
          for v in ("sinusoidal", "learned")]
  assert float(rows["learned"]["test_2017_mscoco_p"]) == pytest.approx(
      significance.paired_bootstrap(*hyps, refs))
  report = json.loads((root / "learned/seed0/eval/test_2016_flickr_step6.json").read_text())
  assert float(rows["learned"]["test_2016_flickr_bleu"]) == pytest.approx(report["sacrebleu"]["bleu"])
  table = (root / "results.md").read_text()
  assert "## Held-out test sets" in table
  assert ("| variant | test_2016_flickr (10) | Δ vs sinusoidal | p | test_2017_flickr (10) |"
          in table)
  learned_line = next(line for line in table.split("## Held-out")[1].splitlines()
                      if line.startswith("| learned |"))
  assert f"{float(rows['learned']['test_2017_mscoco_p']):.3f}" in learned_line
  # Every run in TensorBoard's HParams dashboard, with the table's numbers.
  _, groups = hparams_dashboard(root)
  sessions = {s.name: {m.name.tag: m.value for m in s.metric_values}
              for g in groups.session_groups for s in g.sessions}
  assert sorted(sessions) == ["learned/seed0", "sinusoidal/seed0"]
  for variant, row in rows.items():
    found = sessions[f"{variant}/seed0"]
    assert found["final/dev_bleu"] == pytest.approx(float(row["dev_bleu"]))
    assert found["final/test_2017_flickr_bleu"] == pytest.approx(float(row["test_2017_flickr_bleu"]))

  # The same checkpoints with a minimum output length, beside the config's search: evaluated again
  # under their own report names, kept in the record, tabulated in min_len1/ (and the record's);
  # nothing trained, the default search's reports and table kept.
  shortest = run_experiment(*common, f"--record={tmp_path / 'record'}", "--also_min_len=1")
  assert shortest.returncode == 0, shortest.stderr
  assert shortest.stderr.count("skipping training") == 2
  assert shortest.stderr.count("evaluating -> ") == 10 and "validation_step6_min1.json" in shortest.stderr
  assert [p.stat().st_mtime_ns for p in reports] == stamps and (root / "results.md").read_text() == table
  with (root / "min_len1/results.csv").open() as f:
    for row in csv.DictReader(f):
      report = json.loads((root / "min_len1" / row["workdir"] / "eval/long_step6_min1.json").read_text())
      assert float(row["long_bleu"]) == pytest.approx(report["sacrebleu"]["bleu"])
      assert report["decode"]["min_len"] == 1
  assert "--min_len=1" in (root / "min_len1/commands.sh").read_text()
  assert (tmp_path / "record/min_len1/results.md").read_text() == (root / "min_len1/results.md").read_text()
  assert not (tmp_path / "record/min_len1/runs").exists()  # the runs are kept once, in the record's runs/
  # --min_len=1 alone now only tabulates what --also_min_len scored.
  tabulated = run_experiment(*common, "--min_len=1")
  assert tabulated.returncode == 0, tabulated.stderr
  assert tabulated.stderr.count("evaluated already") == 2 and "evaluating -> " not in tabulated.stderr

  # A fresh checkout holds the record but no workdirs: the kept results (no checkpoints) are
  # restored, nothing is trained or evaluated again, and the table reads the same.
  kept = tmp_path / "record/runs/learned/seed0"
  assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted([
      "config.json", "metrics.jsonl",
      *[f"eval/{name}_step6{search}.{ext}" for name in ("long", "validation", *test_sets.HELD_OUT)
        for search in ("", "_min1") for ext in ("hyp.txt", "json")]])
  assert not list(kept.rglob("checkpoints"))
  table_csv = (root / "results.csv").read_text()
  shutil.rmtree(root)
  fresh = run_experiment(*common, f"--record={tmp_path / 'record'}")
  assert fresh.returncode == 0, fresh.stderr
  assert "Restored 2 finished runs" in fresh.stderr
  assert fresh.stderr.count("evaluated already") == 2
  assert "training to step" not in fresh.stderr and "evaluating -> " not in fresh.stderr
  assert (root / "results.csv").read_text() == table_csv
  # --pairs: 'learned' compared with another base run (here a copy of itself: Δ 0), noted in the
  # table; the other rows keep their pairing.
  # The copy says another machine trained it, which the table then says too.
  shutil.copytree(root / "learned/seed0", tmp_path / "pairs/own_copy")
  metrics_file = tmp_path / "pairs/own_copy/metrics.jsonl"
  metrics_file.write_text(metrics_file.read_text().replace('"machine": "', '"machine": "another '))
  (tmp_path / "pairs/pairs.json").write_text(json.dumps({"learned/seed0": "own_copy"}))
  paired = run_experiment(*common, "--collect_only", f"--pairs={tmp_path / 'pairs/pairs.json'}")
  assert paired.returncode == 0, paired.stderr
  with (root / "results.csv").open() as f:
    learned = next(r for r in csv.DictReader(f) if r["variant"] == "learned")
  hyps = (root / "learned/seed0/eval/validation_step6.hyp.txt").read_text().split("\n")[:-1]
  refs = (tmp_path / "val.de").read_text().splitlines()
  assert float(learned["dev_delta"]) == 0.0
  assert float(learned["dev_p"]) == pytest.approx(significance.paired_bootstrap(hyps, hyps, refs))
  assert learned["paired_with"] == str(tmp_path / "pairs/own_copy")  # as the pairs file names it
  assert (f"(transformer-experiment --pairs): learned seed 0 with "
          f"`{learned['paired_with']}`.") in (root / "results.md").read_text()
  assert learned["machine"].startswith(hardware.cpu_id() + ", 1 cpu device(s), JAX")
  assert learned["base_machine"] == "another " + learned["machine"]
  assert (f"Compared with a base trained on another machine (float32 training differs between "
          f"machines; their Δ and p include that difference): learned seed 0 "
          f"({learned['machine']}; its base: another {learned['machine']}).") in (
              root / "results.md").read_text()
  assert "its Δ and p include that difference" in paired.stderr
  # Their checkpoints are gone, so a new evaluation of them fails clearly instead of retraining;
  # their --min_len=1 scores came with them from the record.
  again = run_experiment(*common, f"--record={tmp_path / 'record'}", "--min_len=2")
  assert again.returncode != 0 and "training to step" not in again.stderr
  assert ("learned seed 0: its results were restored from the record without checkpoints, so it "
          "cannot be evaluated again (validation_step6_min2.json") in again.stderr
  # As extra evaluations of the main command, they are only missing from their own table.
  extra = run_experiment(*common, f"--record={tmp_path / 'record'}", "--also_min_len=2")
  assert extra.returncode == 0, extra.stderr
  assert ("learned seed 0: no checkpoint of its last step here (results restored from a record), "
          "so not scored for --also_min_len (validation_step6_min2.json") in extra.stderr
  with (root / "min_len2/results.csv").open() as f:
    assert [(r["variant"], r["dev_bleu"]) for r in csv.DictReader(f)] == [("sinusoidal", ""),
                                                                          ("learned", "")]
  assert ("2 of 2 runs finished, 0 of them evaluated with these settings (a run whose last "
          "checkpoint is gone") in (root / "min_len2/results.md").read_text()
  assert not list(root.rglob("checkpoints"))


@pytest.mark.slow
def test_a_grid_keeps_its_runs_models_in_the_record_for_decoding_elsewhere(tmp_path):
  """keep_models: each evaluated run's averaged parameters go into the record beside its results;
  on a fresh checkout they come back with them, and transformer-eval of the kept model (the grid's
  own --step and --average_last) translates as the run did."""
  config = write_short_sentence_config(tmp_path)
  grid = tmp_path / "kept.py"
  grid.write_text("from transformer.sweeps.grids import Grid, Variant\n"
                  "def get_grid():\n"
                  "  return Grid('kept', [Variant('v')], average_last=2, keep_models='float32')\n")
  root, record = tmp_path / "exp", tmp_path / "record"
  common = [str(grid), f"--base={config}", "--seeds=1", f"--root={root}", f"--record={record}"]
  done = run_experiment(*common)
  assert done.returncode == 0, done.stderr
  assert "v seed 0: keeping its parameters -> " in done.stderr
  kept = record / "runs/v/seed0/model"
  assert sorted(p.name for p in kept.iterdir()) == ["config.json", "params.msgpack", "vocab.model"]
  shutil.rmtree(root)
  fresh = run_experiment(*common)
  assert fresh.returncode == 0, fresh.stderr
  assert "Restored 1 finished runs" in fresh.stderr and "training to step" not in fresh.stderr
  assert "keeping its parameters" not in fresh.stderr
  decoded = run_cli("transformer.evaluation.evaluate", f"--workdir={root}/v/seed0/model",
                    "--step=6", "--average_last=2", "--split=validation")
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  name = "validation_step6_avg2.hyp.txt"
  assert (root / "v/seed0/model/eval" / name).read_text() == (root / "v/seed0/eval" / name).read_text()


def test_a_pairs_file_names_runs_of_the_grid_and_existing_base_runs(tmp_path):
  grid = Grid("g", [Variant("base", {}), Variant("wide", {"model.d_ff": 64})])
  runs = plan(grid, tiny_run_config(tmp_path), [], [0, 1], tmp_path / "exp", {})
  (tmp_path / "other_base").mkdir()
  path = tmp_path / "pairs.json"
  path.write_text(json.dumps({"wide/seed1": "other_base"}))
  assert results.read_pairs(path, runs) == {("wide", 1): tmp_path / "other_base"}
  for entries, message in (({"wide/seed2": "other_base"}, "pairs 'wide/seed2', which is no run of "
                             "this grid (runs are named VARIANT/seedS, e.g. base/seed0)"),
                           ({"wide/seed0": "gone"}, "pairs wide/seed0 with gone, which is not a "
                            "folder"),
                           (["wide/seed0"], "must be a JSON object")):
    path.write_text(json.dumps(entries))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
      results.read_pairs(path, runs)
  with pytest.raises(ConfigError, match="cannot read the pairs file"):
    results.read_pairs(tmp_path / "missing.json", runs)


def test_a_base_from_another_machine_or_without_the_runs_report_is_named(tmp_path, caplog):
  caplog.set_level(logging.WARNING, logger="transformer")
  grid = Grid("g", [Variant("base", {}), Variant("wide", {"model.d_ff": 64})])
  base, wide = plan(grid, tiny_run_config(tmp_path), [], [0], tmp_path / "exp", {})
  refs = ["a dog runs across the green grass .", "two cats sleep on a red sofa ."]
  outputs = {"base": refs, "wide": ["a dog runs across the grass .", refs[1]]}
  for run, machines in ((base, ["cpu A"]), (wide, ["cpu B", "cpu B", "cpu C"])):  # wide: resumed
    run.workdir.mkdir(parents=True)
    for step, label in enumerate(machines):
      MetricWriter(run.workdir).write("start", step, machine=label)
    report = run.evals["dev"].report
    report.parent.mkdir()
    hyps = outputs[run.variant.name]
    report.write_text(json.dumps({"sacrebleu": {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score}}))
    report.with_suffix(".hyp.txt").write_text("\n".join(hyps) + "\n")
  rows = [{"machine": results.trained_by(read_metrics(run.workdir))} for run in (base, wide)]
  assert rows[1]["machine"] == "cpu B + cpu C"  # each machine once, in order

  results.add_significance(rows, [base, wide], {"dev": refs})
  assert rows[1]["base_machine"] == "cpu A"
  assert rows[1]["dev_delta"] == pytest.approx(
      sacrebleu.corpus_bleu(outputs["wide"], [refs]).score - 100.0)
  assert rows[1]["dev_p"] == pytest.approx(
      significance.paired_bootstrap(outputs["base"], outputs["wide"], refs))
  assert (f"wide/seed0 was trained on cpu B + cpu C, its base {base.workdir} on cpu A: float32 "
          "training differs between machines") in caplog.text

  caplog.clear()
  base.evals["dev"].report.unlink()
  results.add_significance(rows, [base, wide], {"dev": refs})
  assert rows[1]["dev_delta"] is None and rows[1]["dev_p"] is None  # the translations are still there
  assert (f"wide/seed0: its base has no {base.evals['dev'].report}, so its Δ and p on dev are "
          "left blank") in caplog.text


@pytest.mark.parametrize("metric", ["sacrebleu", "multi-bleu"])
def test_paired_bootstrap_is_koehns_test_on_sacrebleu(rng, metric):
  """The p-value against a hand-written paired bootstrap: the same resamples (sacreBLEU's seed),
  BLEU of each resample from scratch, the centred two-sided count with its +1; with sacreBLEU's
  own tokenizer, and as multi-bleu.perl on text as it is (punctuation left attached: the two
  metrics score these sentences differently)."""
  words = "a man in a red shirt rides a brown horse, on the beach. near the sea".split()
  refs = [" ".join(rng.choice(words, 8)) for _ in range(30)]
  good = [r if rng.random() < 0.6 else " ".join(r.split()[:4]) for r in refs]
  poor = [r if rng.random() < 0.45 else " ".join(r.split()[:4]) for r in refs]
  if metric == "sacrebleu":
    p = significance.paired_bootstrap(poor, good, refs, resamples=200)
    score = lambda hyps, refs: sacrebleu.corpus_bleu(hyps, [refs]).score
  else:
    p = significance.paired_bootstrap(poor, good, refs, resamples=200, metric=bleu_lib.multi_bleu_metric())
    score = lambda hyps, refs: bleu_lib.multi_bleu(hyps, refs, tokenize=lambda line: line)["bleu"]
    assert score(good, refs) != pytest.approx(sacrebleu.corpus_bleu(good, [refs]).score)

  index = np.random.default_rng(12345).choice(len(refs), size=(200, len(refs)), replace=True)
  bleu = lambda hyps, rows: score([hyps[i] for i in rows], [refs[i] for i in rows])
  diffs = np.array([abs(bleu(good, rows) - bleu(poor, rows)) for rows in index])
  observed = abs(score(good, refs) - score(poor, refs))
  expected = (np.sum(diffs - diffs.mean() > observed) + 1) / (len(diffs) + 1)
  assert p == pytest.approx(expected, abs=1e-9)
  assert significance.paired_bootstrap(refs, poor, refs) < 0.01  # perfect against poor: real
  assert significance.paired_bootstrap(poor, list(poor), refs) == 1.0
  with pytest.raises(ValueError, match="one translation per reference: 30 and 29 translations"):
    significance.paired_bootstrap(poor, good[:29], refs)


def test_two_systems_with_the_same_bleu_are_never_significantly_different():
  # Two seeds that both score 0.0 with different (wrong) translations: a zero difference.
  refs = ["ein mann fährt rad", "zwei hunde spielen im schnee", "eine frau liest"] * 10
  one = ["katze"] * 30
  other = ["baum haus"] * 30
  assert sacrebleu.corpus_bleu(one, [refs]).score == sacrebleu.corpus_bleu(other, [refs]).score == 0
  assert significance.paired_bootstrap(one, other, refs) == 1.0
  assert significance.paired_bootstrap(one, other, refs, metric=bleu_lib.multi_bleu_metric()) == 1.0


def test_compare_translations_scores_both_bleus_and_their_p(tmp_path, rng):
  """A system that writes the baseline's translations lowercased: the lowercased tokenized BLEU
  cannot tell them apart (p = 1), cased sacreBLEU can; each score is the library's own."""
  from experiments.analyses.compare_translations import compare

  words = "A man in a red shirt rides a brown horse , on the Beach . Near the Sea".split()
  refs = [" ".join(rng.choice(words, 8)) for _ in range(40)]
  base = [r if rng.random() < 0.6 else " ".join(r.split()[:5]) for r in refs]
  files = [tmp_path / "base.txt", tmp_path / "lower.txt"]
  files[0].write_text("\n".join(base) + "\n")
  files[1].write_text("\n".join(b.lower() for b in base) + "\n")
  first, lower = compare([str(f) for f in files], refs, "de")
  assert first["lc_tok_bleu"] == lower["lc_tok_bleu"] == pytest.approx(
      bleu_lib.lc_tok_bleu(base, refs, "de")["bleu"])
  assert lower["sacrebleu"] == pytest.approx(bleu_lib.sacrebleu_score([b.lower() for b in base], refs)["bleu"])
  assert lower["sacrebleu"] < first["sacrebleu"] and lower["sacrebleu_p"] < 0.01
  assert lower["lc_tok_p"] == 1.0
  assert not first["uncased"] and not lower["uncased"]  # one system writes capitals: cased
  shorter = tmp_path / "shorter.txt"  # both lowercased (a lowercased run's search against another)
  shorter.write_text("\n".join(" ".join(b.lower().split()[:6]) for b in base) + "\n")
  both = compare([str(files[1]), str(shorter)], refs, "de")
  assert [row["uncased"] for row in both] == [True, True]
  assert both[0]["sacrebleu"] == pytest.approx(
      bleu_lib.sacrebleu_score([b.lower() for b in base], refs, lowercase=True)["bleu"])
  assert both[0]["sacrebleu"] > lower["sacrebleu"]  # the capitals of the references no longer miss
  # The lowercased score's two factors, by hand: tokens against the references' and the brevity
  # penalty exp(1 - r / c) of a shorter system divided out.
  hyp_tokens = sum(len(bleu_lib.multi30k_tokenize(h, "de").split())
                   for h in shorter.read_text().splitlines())
  ref_tokens = sum(len(bleu_lib.multi30k_tokenize(r, "de").split()) for r in refs)
  assert hyp_tokens < ref_tokens
  assert both[1]["length_ratio"] == pytest.approx(hyp_tokens / ref_tokens)
  assert both[1]["lc_tok_without_bp"] * math.exp(1 - ref_tokens / hyp_tokens) == pytest.approx(
      both[1]["lc_tok_bleu"])
  (tmp_path / "short.txt").write_text("one line\n")
  with pytest.raises(sources.DataError, match="has 1 lines for 40 references"):
    compare([str(files[0]), str(tmp_path / "short.txt")], refs, "de")
  with pytest.raises(sources.DataError, match="not found: .*missing.txt"):
    compare([str(files[0]), str(tmp_path / "missing.txt")], refs, "de")


def test_the_curve_reads_the_last_checkpoint_before_each_time_on_a_scaled_clock():
  from experiments.analyses.quality_per_minute import pick_steps
  minutes_at = {250: 3.0, 500: 6.1, 750: 9.0, 1000: 12.2}
  assert pick_steps(minutes_at, [6, 10, 20]) == {"6 min": 250, "10 min": 750, "20 min": 1000,
                                                  "end": 1000}
  slower = {s: m * 1.7 for s, m in minutes_at.items()}  # --clock_scale=1.7: 500 at 10.4, 1000 at 20.7
  assert pick_steps(slower, [10, 20]) == {"10 min": 250, "20 min": 750, "end": 1000}
  assert pick_steps(minutes_at, [2]) == {"end": 1000}  # nothing saved by then: only the end


def test_a_clock_scale_that_is_not_positive_is_one_clear_error(tmp_path):
  out = subprocess.run([sys.executable, "-m", "experiments.analyses.quality_per_minute", str(tmp_path),
                        "--clock_scale=0"], cwd=REPO, capture_output=True, text=True, check=False)
  assert out.returncode != 0
  assert "--clock_scale must be positive (a ratio of two machines' times), got 0" in out.stderr


def test_the_held_out_sets_need_every_file_and_the_error_says_where_each_missing_one_is(tmp_path):
  for name in ("test_2016_flickr", "test_2017_flickr"):
    for lang in ("en", "fr"):
      (tmp_path / f"{name}.{lang}.gz").write_bytes(b"")
  (tmp_path / "test_2017_mscoco.en").write_text("a\n")  # plain text is accepted too
  with pytest.raises(ConfigError) as error:
    test_sets.held_out(tmp_path, "en", "fr")
  assert str(error.value) == (
      f"1 test file(s) missing in {tmp_path}: test_2017_mscoco.fr.gz; download them there from "
      "https://github.com/multi30k/dataset/raw/master/data/task1/raw/ (curl -LO "
      "https://github.com/multi30k/dataset/raw/master/data/task1/raw/NAME)")
  (tmp_path / "test_2017_mscoco.fr.gz").write_bytes(b"")
  found = test_sets.held_out(tmp_path, "en", "fr")
  assert list(found) == ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
  assert found["test_2017_mscoco"] == {"source_file": str(tmp_path / "test_2017_mscoco.en"),
                                       "reference_file": str(tmp_path / "test_2017_mscoco.fr.gz")}


def test_the_test_set_table_averages_the_seeds_and_puts_the_literature_beside_the_test_sets():
  from experiments.recipes.multi30k_test_sets import LITERATURE, table
  results = {"validation": [{"lc_tok": 40.0, "sacrebleu": 39.0, "bp": 0.95},
                            {"lc_tok": 41.0, "sacrebleu": 40.0, "bp": 0.97}],
             "test_2017_flickr": [{"lc_tok": 33.0, "sacrebleu": 32.0, "bp": 0.9},
                                  {"lc_tok": 34.5, "sacrebleu": 33.0, "bp": 1.0}]}
  text = table("en-de", ["seed 0", "seed 1"], results, {"search": "beam", "beam_size": 6, "alpha": 1.4})
  assert "\nSearch: search beam, beam_size 6, alpha 1.4.\n" in text
  rows = [line for line in text.splitlines() if line.startswith("| validation") or line.startswith("| test")]
  assert rows[0] == "| validation | 40.00 | 41.00 | **40.50** | 39.50 | 0.960 | – | – |"
  text_only, best = LITERATURE["en-de"][0][2][1], LITERATURE["en-de"][1][2][1]
  assert (text_only, best) == ("33.36", "36.04")  # as published, with the published precision
  assert rows[1] == "| test_2017_flickr | 33.00 | 34.50 | **33.75** | 32.50 | 0.950 | 33.36 | 36.04 |"


def test_the_test_set_reports_go_where_asked_a_folder_per_seed_where_there_are_several(tmp_path):
  from experiments.recipes.multi30k_test_sets import report_folder
  assert report_folder(None, 0, 2) is None  # the first run's eval/, as transformer-eval writes
  assert report_folder(str(tmp_path / "one"), 0, 1) == str(tmp_path / "one")
  assert report_folder(str(tmp_path / "two"), 1, 2) == str(tmp_path / "two/seed1")
  assert (tmp_path / "one").is_dir() and (tmp_path / "two/seed1").is_dir()


def test_the_test_set_table_labels_an_ensemble_by_its_runs_seeds():
  from experiments.recipes.multi30k_test_sets import seed_label
  cfg = load_config(REPO / "configs/multi30k_ensemble.py")
  members = [cfg.copy_and_resolve_references() for _ in range(2)]
  members[1].seed = 1
  assert seed_label(members[:1]) == "seed 0" and seed_label(members) == "seeds 0+1"


@pytest.mark.parametrize("pair,default", [(None, "multi30k.py"), ("en-de", "multi30k.py"),
                                          ("en-fr", "multi30k_enfr.py")])
def test_the_ensemble_recipe_is_the_pairs_default_at_4250_steps_decoded_by_mbr_over_8_hypotheses(
    pair, default):
  default = load_config(REPO / "configs" / default)
  recipe = REPO / "configs/multi30k_ensemble.py"
  member = load_config(recipe, *([pair] if pair else []))
  assert changed_keys(member, default) == {"train.steps": 4250, "decode.beam_size": 8,
                                           "decode.mbr": "chrf"}
  with pytest.raises(ValueError, match="the language pair must be one of en-de, en-fr"):
    load_config(recipe, "de-en")


def test_the_full_length_table3_runs_rows_c_and_d_and_the_unsettled_variants_for_the_whole_default():
  default = load_config(REPO / "configs/multi30k.py")
  grid = load_grid(str(REPO / "experiments/recipes/table3_multi30k_full.py"))
  quarter = {v.name: v for v in load_grid(str(REPO / "experiments/recipes/table3_multi30k.py")).variants}
  names = [v.name for v in grid.variants]
  assert names[0] == "base" and names[-4:] == ["A-h2", "A-h8", "A-h16", "B-dk32"]
  assert [quarter[n].row for n in names[1:5]] == ["(D)"] * 4  # the recipe question first
  assert {n for n in names if quarter[n].row in ("(C)", "(D)")} == {
      n for n, v in quarter.items() if v.row in ("(C)", "(D)")}
  for variant in grid.variants:
    cfg = variant_config(default, variant, 0)
    assert cfg.train.steps == default.train.steps == 4800
    assert variant_config(default, quarter[variant.name], 0).to_dict() == {
        **cfg.to_dict(), "train": {**cfg.train.to_dict(), "steps": 1200}}  # only the length differs


def test_the_test_set_table_takes_the_seeds_of_one_language_pair_only():
  from experiments.recipes.multi30k_test_sets import one_direction
  ende, enfr = load_config(REPO / "configs/multi30k.py"), load_config(REPO / "configs/multi30k_enfr.py")
  assert one_direction([ende, ende]) == "en-de"
  with pytest.raises(ConfigError, match=r"different directions \(en-de, en-fr\); pass the seeds of one recipe"):
    one_direction([ende, enfr])


def test_the_test_set_table_names_one_search_and_refuses_runs_that_decode_differently():
  from experiments.recipes.multi30k_test_sets import one_search
  default, bf16 = load_config(REPO / "configs/multi30k.py"), load_config(REPO / "configs/multi30k_bf16.py")
  assert one_search([bf16, bf16], {})["beam_size"] == 6
  with pytest.raises(ConfigError, match=r"decode differently \(decode\.\*\); pass the search flags"):
    one_search([default, bf16], {})
  alike = one_search([default, bf16], {"beam_size": 6, "alpha": 1.4, "min_len": None})
  assert (alike["search"], alike["beam_size"], alike["alpha"]) == ("beam", 6, 1.4)


def test_the_bf16_recipe_is_the_default_with_bf16_products_dropout_0_2_8000_steps_and_its_search():
  from transformer.config import validate
  default, bf16 = load_config(REPO / "configs/multi30k.py"), load_config(REPO / "configs/multi30k_bf16.py")
  validate(bf16)
  assert changed_keys(bf16, default) == {"model.matmul_dtype": "bfloat16", "model.dropout": 0.2, "train.steps": 8000,
                     "decode.beam_size": 6, "decode.alpha": 1.4}


def test_the_length_figure_draws_the_variants_with_numbers_and_nothing_without(tmp_path):
  from transformer.sweeps import by_length
  grid = Grid("g", [Variant("a"), Variant("b"), Variant("c")], test_sets=("long",), by_length=True)
  labels = [by_length.bucket_label(b) for b in by_length.LENGTH_BUCKETS]
  rows = [{"variant": v, "finished": True, "long_bleu": 5.0 + seed,
           **{f"len{label}_bleu": 10.0 + i + seed for i, label in enumerate(labels)}}
          for v in ("a", "b") for seed in (0, 1)] + [{"variant": "c", "finished": False}]
  path = by_length.figure(rows, grid, tmp_path / "length.png")
  image = matplotlib.image.imread(path)
  assert image.shape[:2] == (540, 960)  # 8 x 4.5 inches at 120 dpi
  assert image[..., :3].std() > 0  # something is drawn
  assert by_length.figure(rows[-1:], grid, tmp_path / "none.png") is None
  assert not (tmp_path / "none.png").exists()


def test_the_length_comparison_calls_a_conclusion_only_when_every_seed_signs_it(tmp_path):
  from experiments.analyses.table3_lengths import compare, read_table, report, verdict
  header = "variant,seed,dev_delta,dev_p\n"
  short, long = tmp_path / "short.csv", tmp_path / "long.csv"
  short.write_text(header + "base,0,,\nbase,1,,\nX,0,1.0,0.01\nX,1,0.5,0.02\nY,0,-1.0,0.2\n"
                   "Y,1,-2.0,0.001\nZ,0,0.3,0.01\nZ,1,,\n")
  long.write_text(header + "base,0,,\nbase,1,,\nX,0,0.4,0.01\nX,1,-0.2,0.3\nY,0,-1.5,0.001\n"
                  "Y,1,-0.5,0.04\nZ,0,1.0,0.001\nZ,1,2.0,0.001\nW,0,1.0,0.001\nW,1,1.0,0.001\n")
  assert verdict([(1.0, 0.01), (0.5, 0.049)]) == "better"
  assert verdict([(1.0, 0.01), (0.5, 0.05)]) == "unsettled"  # p must be below 0.05
  assert verdict([(-1.0, 0.01), (-0.5, 0.001)]) == "worse"
  assert verdict([(1.0, 0.01), (None, None)]) == "too few seeds"
  lines, changed, disagree = compare(read_table(short), read_table(long))
  assert lines[2:] == ["| X | +0.75 ± 0.35 | 0.010 / 0.020 | better | +0.10 ± 0.42 | 0.010 / 0.300 "
                       "| unsettled |",
                       "| Y | -1.50 ± 0.71 | 0.200 / 0.001 | unsettled | -1.00 ± 0.71 | 0.001 / 0.040 "
                       "| worse |",
                       "| Z | +0.30 | 0.010 | too few seeds | +1.50 ± 0.71 | 0.001 / 0.001 | better |"]
  assert changed == ["X: better -> unsettled", "Y: unsettled -> worse"]  # W: not in the short table
  assert disagree == ["X"]
  assert report(short, long).splitlines()[-1] == (
      "Seeds disagree on the sign at the long length: X (2 seeds); a third seed for those with "
      "two: --seeds=3 --only=X")
  long.write_text(long.read_text() + "base,2,,\nX,2,-0.1,0.4\n")  # a third seed: the mean decides
  assert report(short, long).splitlines()[-1] == (
      "Seeds disagree on the sign at the long length: X (3 seeds)")


def hparams_dashboard(logdir):
  """What TensorBoard's HParams dashboard lists for `logdir`: its own handler, reading the files."""
  from tensorboard import context
  from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
  from tensorboard.plugins import base_plugin
  from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups
  mux = plugin_event_multiplexer.EventMultiplexer()
  mux.AddRunsFromDirectory(str(logdir))
  mux.Reload()
  tb = base_plugin.TBContext(data_provider=data_provider.MultiplexerDataProvider(mux, str(logdir)),
                             multiplexer=mux, logdir=str(logdir))
  request = api_pb2.ListSessionGroupsRequest(
      start_index=0, slice_size=100, aggregation_type=api_pb2.AGGREGATION_AVG,
      allowed_statuses=[api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_RUNNING])
  backend = backend_context.Context(tb)
  experiment = backend.experiment_from_metadata(
      context.RequestContext(), "", True, backend.hparams_metadata(context.RequestContext(), ""), None)
  groups = list_session_groups.Handler(context.RequestContext(), backend, "", request).run()
  return experiment, groups


def test_every_run_of_a_grid_is_a_session_of_the_hparams_dashboard_with_its_final_numbers(tmp_path):
  from transformer.sweeps import hparams
  grid = Grid("g", [Variant("sinusoidal", {"model.positional": "sinusoidal"}),
                    Variant("rotary", {"model.positional": "rotary"}),
                    Variant("h8", {"model.num_heads": 8})])
  runs = plan(grid, tiny_run_config(tmp_path), [], [0, 1], tmp_path / "root", {})
  rows = []
  for i, run in enumerate(runs):
    run.workdir.mkdir(parents=True)
    rows.append({"variant": run.variant.name, "seed": run.seed, "finished": i != 5, "steps_done": 6,
                 "dev_ppl": 5.0 + i, "dev_bleu": 30.0 + i, "dev_ema_bleu": 31.0 + i,
                 "long_bleu": None if i == 0 else 9.0 + i, "long_ema_bleu": None})
  for _ in range(2):  # collecting again replaces the sessions, never lists them twice
    hparams.write(rows, runs, grid, tmp_path / "root", ["long"])
  experiment, groups = hparams_dashboard(tmp_path / "root")
  assert {h.name: [v.string_value or v.number_value for v in h.domain_discrete.values]
          for h in experiment.hparam_infos} == {
      "model.positional": ["sinusoidal", "rotary"], "model.num_heads": [4, 8],
      "variant": ["sinusoidal", "rotary", "h8"]}
  assert [m.name.tag for m in experiment.metric_infos] == [
      "final/dev_ppl", "final/dev_bleu", "final/dev_ema_bleu", "final/long_bleu"]
  assert [g.name for g in sorted(groups.session_groups, key=lambda g: g.name)] == [
      "h8", "rotary", "sinusoidal"]
  for group in groups.session_groups:
    mine = [(run, row) for run, row in zip(runs, rows) if run.variant.name == group.name]
    assert group.hparams["model.num_heads"].number_value == mine[0][0].config.model.num_heads
    assert group.hparams["model.positional"].string_value == mine[0][0].config.model.positional
    assert sorted(s.name for s in group.sessions) == [f"{group.name}/seed0", f"{group.name}/seed1"]
    for session in group.sessions:
      row = next(row for run, row in mine if f"{run.variant.name}/seed{run.seed}" == session.name)
      assert session.status == (api_status("STATUS_SUCCESS") if row["finished"]
                                else api_status("STATUS_RUNNING"))
      found = {m.name.tag: m.value for m in session.metric_values}
      assert found == {f"final/{k}": v for k, v in row.items()
                       if k.endswith(("_ppl", "_bleu")) and v is not None}
    averaged = {m.name.tag: m.value for m in group.metric_values}
    assert averaged["final/dev_bleu"] == pytest.approx(sum(r["dev_bleu"] for _, r in mine) / 2)


def api_status(name):
  from tensorboard.plugins.hparams import api_pb2
  return api_pb2.Status.Value(name)


def test_a_grid_refuses_runs_of_another_config_or_left_out_of_its_tables(tmp_path):
  from transformer.sweeps import consistency
  grid = Grid("g", [Variant("sinusoidal", {"model.positional": "sinusoidal"}),
                    Variant("learned", {"model.positional": "learned"})])
  base = tiny_run_config(tmp_path)
  root, record = tmp_path / "root", tmp_path / "record"

  def write_config(folder, cfg):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg.to_json_best_effort())

  runs = plan(grid, base, [], [0, 1], root, {})
  for run in runs:
    write_config(run.workdir, run.config)
  consistency.check(runs, "g", root, record)  # the same grid: nothing to say

  quieter = ml_collections.ConfigDict(base.to_dict())
  quieter.train.eval_every, quieter.train.keep_checkpoints = 1000, 1
  consistency.check(plan(grid, quieter, [], [0, 1], root, {}), "g", root, record)  # bookkeeping

  older = json.loads(runs[1].config.to_json_best_effort())
  del older["train"]["loss_chunks"]  # a key added later: its default reproduces the old behaviour
  (runs[1].workdir / "config.json").write_text(json.dumps(older))
  consistency.check(runs, "g", root, record)

  longer = ml_collections.ConfigDict(base.to_dict())
  longer.train.steps = base.train.steps + 4  # an interrupted or shorter run: continued, no error
  consistency.check(plan(grid, longer, [], [0, 1], root, {}), "g", root, record)
  shorter = ml_collections.ConfigDict(base.to_dict())
  shorter.train.steps = base.train.steps - 2  # runs trained past the plan's end: refused
  with pytest.raises(ConfigError, match=f"train.steps: {base.train.steps} -> {base.train.steps - 2}"):
    consistency.check(plan(grid, shorter, [], [0, 1], root, {}), "g", root, record)

  other = ml_collections.ConfigDict(base.to_dict())
  other.train.learning_rate = 2.0
  with pytest.raises(ConfigError) as error:
    consistency.check(plan(grid, other, [], [0, 1], root, {}), "g", root, record)
  assert (f"the grid's folder holds sinusoidal seed 0 ({runs[0].workdir}) trained with another "
          "config than this command's: train.learning_rate: 1.0 -> 2.0. Pass the --base flags "
          "it was run with") in str(error.value)

  with pytest.raises(ConfigError) as error:
    consistency.check(plan(grid, base, [], [0], root, {}), "g", root, record)
  assert ("holds runs this command leaves out of its tables: learned/seed1, sinusoidal/seed1 "
          "(pass --seeds/--first_seed to include seed(s) 1)") in str(error.value)

  write_config(record / "runs/A-h8/seed0", runs[0].config)
  with pytest.raises(ConfigError) as error:
    consistency.check(runs, "g", root, record)
  assert (f"the grid's record {record / 'runs'} holds runs this command leaves out of its tables: "
          "A-h8/seed0 (they are no variants of grid g)") in str(error.value)
  (record / "runs/A-h8/seed0/config.json").unlink()
  write_config(record / "runs/learned/seed0", runs[0].config)  # a kept run of another variant
  with pytest.raises(ConfigError) as error:
    consistency.check(runs, "g", root, record)
  assert "the grid's record holds learned seed 0" in str(error.value)
  assert "model.positional: 'sinusoidal' -> 'learned'" in str(error.value)


def test_the_wall_time_split_sums_every_training_process_and_the_evaluations(tmp_path):
  from experiments.analyses import wall_time
  run = tmp_path / "run"
  (run / "eval").mkdir(parents=True)
  writer = MetricWriter(run)
  parts = {"compile_sec": 30.0, "validation_sec": 10.0, "checkpoint_sec": 2.0,
           "data_wait_sec": 1.0, "steps_sec": 500.0, "startup_sec": 7.0}
  writer.write("summary", 100, steps=100, resumed_from=0, **parts)
  writer.write("summary", 300, steps=300, resumed_from=100, **{k: 2 * v for k, v in parts.items()})
  writer.close()
  for name, seconds in (("validation_step300.json", 40.0), ("long_step300_ema.json", 20.0)):
    (run / "eval" / name).write_text(json.dumps({"total_sec": seconds}))
  found = wall_time.split(run)
  assert found == {"steps": 1500.0, "compiling": 90.0, "validation": 30.0, "checkpoints": 6.0,
                   "data wait": 3.0, "start-up": 21.0, "steps trained": 300, "evaluation": 60.0}
  text = wall_time.table({"run": found})
  wall = sum(v for k, v in found.items() if k != "steps trained")
  assert f"| run | 300 | {wall / 60:.1f} min | 25.0 min ({1500 / wall:.1%}) |" in text
  assert text.splitlines()[-1].startswith("| all | 300 |")
  assert wall_time.split(tmp_path) is None  # no metrics: skipped


def test_runs_side_by_side_share_the_accelerator_and_one_failure_spares_the_others(tmp_path, monkeypatch):
  from transformer.sweeps import execute as sweep
  from transformer.sweeps.plan import Evaluation, Run
  cfg = ml_collections.ConfigDict({"train": {"steps": 6, "patience": 0}})
  runs = []
  for name in ("a", "b", "c", "d"):
    workdir = tmp_path / name
    report = workdir / "eval" / "validation_step6.json"
    runs.append(Run(Variant(name, {}), 0, workdir, cfg, ["transformer-train", f"--workdir={workdir}"],
                          {"dev": Evaluation(report, report, ["transformer-eval", f"--workdir={workdir}"])}))
  (tmp_path / "d" / "eval").mkdir(parents=True)  # d: evaluated before, nothing to do
  (tmp_path / "d" / "eval" / "validation_step6.json").write_text("{}")
  monkeypatch.setattr(results, "trained_steps", lambda workdir: 0)
  monkeypatch.setattr(results, "recorded_steps", lambda workdir: 0)
  monkeypatch.delenv(sweep.MEMORY_FRACTION, raising=False)
  together = threading.Barrier(2, timeout=30)  # breaks unless two trainings run at once
  third_started = threading.Event()  # must not be set while the first two train: two at a time
  fractions, overlaps = [], []

  def fake_execute(command, log_file, env=None):
    workdir = Path(command[1].removeprefix("--workdir="))
    fractions.append(env[sweep.MEMORY_FRACTION])
    if command[0] == "transformer-train":
      if workdir.name == "c":
        third_started.set()
      else:
        together.wait()
        overlaps.append(third_started.wait(timeout=1))
        together.wait()  # neither frees its slot before both have looked
      return 0
    if workdir.name == "b":
      return 3
    (workdir / "eval").mkdir(parents=True)
    (workdir / "eval" / "validation_step6.json").write_text("{}")
    return 0

  monkeypatch.setattr(sweep, "execute", fake_execute)
  tables = []  # the runs kept when each table was written: after each finished run, one at a time
  on_finished = lambda: tables.append(sorted(p.parent.parent.name for p in
                                             (tmp_path / "record" / "runs").rglob("seed0/eval")))
  failures = sweep.run_all(runs, tmp_path / "record", parallel=2, on_finished=on_finished)
  assert len(failures) == 1 and failures[0].startswith("b seed 0: transformer-eval") and "exited with 3" in failures[0]
  # after a and c, one at a time; not after b, which failed, nor d, which had nothing to do
  assert len(tables) == 2 and {"a", "c"} <= set(tables[1]) and not {"b"} & set(tables[0] + tables[1])
  assert fractions == ["0.450"] * 6
  assert overlaps == [False, False]
  assert sorted(p.parent.parent.name for p in (tmp_path / "record" / "runs").rglob("seed0/eval")) == ["a", "c", "d"]


def test_one_run_at_a_time_inherits_the_environment_and_a_set_memory_fraction_is_kept(monkeypatch):
  from transformer.sweeps import execute as sweep
  monkeypatch.delenv(sweep.MEMORY_FRACTION, raising=False)
  assert sweep.side_by_side_env(1) is None
  assert sweep.side_by_side_env(4)[sweep.MEMORY_FRACTION] == "0.225"
  monkeypatch.setenv(sweep.MEMORY_FRACTION, "0.1")
  assert sweep.side_by_side_env(4) is None


def test_the_pooled_test_takes_every_seed_of_a_variant_as_one_test_set(tmp_path):
  """Each seed's translations after one another, against the base's of the same seeds: the paired
  bootstrap of the concatenation; a variant with one such seed has none."""
  grid = Grid("g", [Variant("base", {}), Variant("wide", {"model.d_ff": 64}),
                    Variant("deep", {"model.num_layers": 2})])
  runs = plan(grid, tiny_run_config(tmp_path), [], [0, 1], tmp_path / "exp", {})
  refs = ["a dog runs across the green grass .", "two cats sleep on a red sofa .",
          "a man rides a bike down the street .", "children play in the park ."]
  worse = {0: ["a dog runs across grass .", *refs[1:]], 1: [*refs[:2], "a man rides down the street .", refs[3]]}
  for run in runs:
    if run.variant.name == "deep" and run.seed == 1:
      continue  # deep has one seed evaluated
    report = run.evals["dev"].report
    report.parent.mkdir(parents=True)
    hyps = refs if run.variant.name == "base" else worse[run.seed]
    report.write_text(json.dumps({"sacrebleu": {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score}}))
    report.with_suffix(".hyp.txt").write_text("\n".join(hyps) + "\n")
  rows = [{"machine": None} for _ in runs]
  results.add_significance(rows, runs, {"dev": refs})
  pooled = significance.paired_bootstrap(refs + refs, worse[0] + worse[1], refs + refs)
  by_run = {(run.variant.name, run.seed): row for run, row in zip(runs, rows)}
  assert by_run["wide", 0]["dev_pooled_p"] == by_run["wide", 1]["dev_pooled_p"] == pytest.approx(pooled)
  assert by_run["wide", 0]["dev_p"] == pytest.approx(significance.paired_bootstrap(refs, worse[0], refs))
  assert by_run["deep", 0]["dev_pooled_p"] is None and by_run["deep", 0]["dev_p"] is not None
  assert by_run["base", 0]["dev_pooled_p"] is None


def test_the_two_level_bootstrap_resamples_seeds_then_sentences_as_written_by_hand(rng):
  """Against a hand-written two-level bootstrap: the same draws (seeds with replacement, then each
  drawn seed's sentences), sacreBLEU's corpus BLEU of every resample from scratch, the centred
  count with its +1."""
  words = "a man in a red shirt rides a brown horse on the beach near the sea".split()
  refs = [" ".join(rng.choice(words, 8)) for _ in range(25)]
  cut = lambda r, keep: r if rng.random() < keep else " ".join(r.split()[:4])
  pairs = [([cut(r, 0.2) for r in refs], [cut(r, keep) for r in refs]) for keep in (0.9, 0.95, 1.0)]
  p = significance.seeds_bootstrap(pairs, refs, resamples=60)

  bleu = lambda hyps, rows: sacrebleu.corpus_bleu([hyps[i] for i in rows],
                                                  [[refs[i] for i in rows]]).score
  everything = range(len(refs))
  observed = np.mean([bleu(s, everything) - bleu(b, everything) for b, s in pairs])
  draws = np.random.default_rng(12345)
  sampled = []
  for _ in range(60):
    seeds = draws.integers(3, size=3)
    sampled.append(np.mean([bleu(pairs[k][1], rows) - bleu(pairs[k][0], rows) for k in seeds
                            for rows in [draws.integers(len(refs), size=len(refs))]]))
  sampled = np.array(sampled)
  expected = (np.sum(np.abs(sampled - sampled.mean()) > abs(observed)) + 1) / 61
  assert p == pytest.approx(expected, abs=1e-9)
  assert p < 0.05  # every seed far ahead
  # One seed far behind the two ahead: the sentences alone would call the pooled mean real, the
  # seeds do not.
  split = pairs[:2] + [([r for r in refs], [cut(r, 0.0) for r in refs])]
  assert significance.seeds_bootstrap(split, refs, resamples=100) > 0.2
  same = [(list(b), list(b)) for b, _ in pairs]
  assert significance.seeds_bootstrap(same, refs) == 1.0
  with pytest.raises(ValueError, match="one translation per reference"):
    significance.seeds_bootstrap([(refs, refs[:3])], refs)


def test_a_grid_chooses_on_the_validation_set_only_and_names_its_choice():
  with pytest.raises(ConfigError, match="chooses on 'test_2016_flickr', which is not its validation "
                                        "set: a recipe is chosen on the validation set only"):
    Grid("levers", [Variant("a"), Variant("b")], select_on="test_2016_flickr")
  with pytest.raises(ConfigError, match=r"\(select_on='dev', 'long'\)"):
    Grid("levers", [Variant("a")], test_sets=("long",), select_on="mscoco")
  assert Grid("levers", [Variant("a")], test_sets=("long",), select_on="long").select_on == "long"
  grid = Grid("t", [Variant("base"), Variant("E-learned", {"model.positional": "learned"})],
              select_on="dev")
  rows = fake_rows()  # base: EMA BLEU 31, 32, 33.5; E-learned: 30, 31, 32
  line = results.chosen(rows, grid)
  assert line.startswith("Chosen on dev (the validation set; the held-out test sets play no "
                         "part): **base**, BLEU 32.17 over 3 seed(s), of 2 variant(s)")
  for row in rows:  # without a moving average everywhere, the raw parameters' BLEU decides
    row["dev_ema_bleu"] = 50.0 if row["variant"] == "E-learned" and row["seed"] else None
  assert "**base**, BLEU 31.17" in results.chosen(rows, grid)
  # A variant ahead by its brevity penalty alone (longer translations, the same words or worse)
  # is named and passed over; ahead in its words too, it is chosen.
  rows = fake_rows()
  for row in rows:
    learned = row["variant"] == "E-learned"
    row["dev_ema_bleu"] = 40.0 if learned else 32.0
    row["dev_ema_without_bp"] = 33.0 if learned else 33.5
  line = results.chosen(rows, grid)
  assert "**base**, BLEU 32.00 over 3 seed(s)" in line
  table = results.markdown_table(rows, grid).splitlines()  # the table shows what it weighed
  header = [c.strip() for c in table[0].strip("|").split("|")]
  assert [[c.strip() for c in line.strip("|").split("|")][header.index("BLEU without BP (dev)")]
          for line in table[2:]] == ["33.50 ± 0.00", "33.00 ± 0.00"]
  assert line.endswith("by length alone (their BLEU without the brevity penalty is not above "
                       "base's 33.50), so not chosen: E-learned (40.00; 33.00).")
  for row in rows:
    row["dev_ema_without_bp"] += 1.0 if row["variant"] == "E-learned" else 0.0
  assert "**E-learned**, BLEU 40.00" in results.chosen(rows, grid)
  assert "length alone" not in results.chosen(rows, grid)


def test_a_reports_bleu_without_its_brevity_penalty_is_its_precisions_geometric_mean():
  refs = ["ein mann fährt mit dem rad durch die stadt", "zwei hunde spielen im tiefen schnee"] * 5
  hyps = ["ein mann fährt mit dem rad", "zwei hunde spielen im schnee"] * 5  # short: BP < 1
  report = {"sacrebleu": bleu_lib.sacrebleu_score(hyps, refs)}
  assert report["sacrebleu"]["brevity_penalty"] < 0.9
  precisions = report["sacrebleu"]["precisions"]
  assert results.without_brevity_penalty(report) == pytest.approx(
      math.exp(sum(math.log(p) for p in precisions) / 4))
  assert results.without_brevity_penalty(None) is None


def test_fairseqs_batching_is_written_as_its_batch_by_size_fills_batches():
  from experiments.analyses.batch_tokens import fairseq_batches
  # Sorted by source then target: pairs 2, 0, 4, 1, 3, counted at their longer sides 4, 3, 4, 5, 6.
  lengths = np.array([[3, 2], [5, 5], [2, 4], [6, 1], [4, 4]])
  batches = [b.tolist() for b in fairseq_batches(lengths, max_tokens=12, multiple=1)]
  assert batches == [[2, 0, 4], [1, 3]]  # 3 x 4 = 12 fits; a fourth at 5 would be 20; 2 x 6 = 12
  # Cut to a multiple of 2: the third pair of the first batch starts the next, whose longest is
  # then pair 1's 5, so pair 3 (6) starts a third batch.
  batches = [b.tolist() for b in fairseq_batches(lengths, max_tokens=12, multiple=2)]
  assert batches == [[2, 0], [4, 1], [3]]


def test_early_stop_reads_a_runs_validations(tmp_path):
  from experiments.analyses.early_stop import one_run
  records = [{"event": "eval", "step": 63 * k, "loss": 3.0 - 0.1 * min(k, 4), "nll": 9.0}
             for k in range(1, 9)]
  records.append({"event": "eval", "step": 63 * 4, "loss": 5.0, "nll": 9.0})  # re-validated: last
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
  row = one_run(tmp_path, patience=3)
  assert row["validations"] == 8 and row["every (steps)"] == "63" and row["loss"] == "loss"
  # Step 252 now holds 5.0: the best is 2.6 at step 315 (k = 5), then 378, 441, 504 do not beat it.
  assert row["best"] == "2.6000 at step 315" and row["stop (patience 3)"] == "step 504"


def test_split_lengths_counts_the_literatures_tokens_of_each_side(tmp_path):
  from experiments.analyses.split_lengths import split_lengths
  (tmp_path / "a.en").write_text("A man rides a bike.\nTwo dogs play.\n")
  (tmp_path / "a.de").write_text("Ein Mann fährt Rad.\nZwei Hunde spielen im Schnee.\n")
  (tmp_path / "b.de").write_text("Ein Mann.\n")
  [row] = split_lengths({"a": (str(tmp_path / "a.en"), str(tmp_path / "a.de"))}, "en", "de")
  # by hand: "a man rides a bike ." + "two dogs play ." = 6 + 4; "ein mann fährt rad ." +
  # "zwei hunde spielen im schnee ." = 5 + 6 (the final full stop split off, as Moses does)
  assert (row["sentences"], row["source_tokens"], row["target_tokens"]) == (2, 10, 11)
  assert row["ratio"] == pytest.approx(1.1)
  with pytest.raises(sources.DataError, match="has 2 lines but .*b.de has 1: pass aligned files"):
    split_lengths({"b": (str(tmp_path / "a.en"), str(tmp_path / "b.de"))}, "en", "de")


def test_every_analysis_and_recipe_module_imports_beside_the_others():
  """Their flags are defined when they run, not on import, so their functions import together
  (two modules' --workdir or --config defined on import would collide in one process)."""
  code = ("import importlib, pkgutil, experiments.analyses as a, experiments.recipes as r\n"
          "for package in (a, r):\n"
          "  for module in pkgutil.iter_modules(package.__path__):\n"
          "    importlib.import_module(f'{package.__name__}.{module.name}')\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
