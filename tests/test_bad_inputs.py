"""Every mistake a user can make ends in one clear line, a non-zero exit, and nothing written.

Each case runs a program as a user would (`python -m transformer.<program> ...`), checks that it
exits with status 2 (cli.run_program's status for a user's mistake), that its last line is the
program's one-line error with the expected message (and no traceback anywhere), and that every file
it could have touched is byte for byte as before: a new workdir is not created, an existing run is
not changed.
"""

import concurrent.futures
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import cli_overrides, run_cli, snapshot, tiny_run_config

from transformer.data import token_cache
from transformer.data import vocab as vocab_lib
from transformer.model import positions
from transformer.training.train import train_and_evaluate


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny finished run (checkpoints at steps 3 and 6) and its config; cases copy it to change it."""
  tmp = tmp_path_factory.mktemp("trained")
  cfg = tiny_run_config(tmp)
  cfg.data.batching, cfg.data.pack_length = "pack", 40
  train_and_evaluate(cfg, str(tmp / "run"))
  return cfg, tmp / "run"


def grid_of(tmp, run, seeds=(0,), folder="copy", warmup=None):
  """A one-variant grid file, a base config file that is the run's config, and runs of it for
  `seeds` in tmp/<folder>/base/seed<k>/ (config.json only, `warmup` steps if given)."""
  (tmp / "grid.py").write_text("from transformer.sweeps.grids import Grid, Variant\n"
                               "def get_grid():\n  return Grid('one', [Variant('base')])\n")
  (tmp / "base.py").write_text("import json, ml_collections\ndef get_config():\n  return "
                               f"ml_collections.ConfigDict(json.load(open({str(run / 'config.json')!r})))\n")
  for seed in seeds:
    stored = json.loads((run / "config.json").read_text())
    stored["seed"] = seed
    if warmup:
      stored["train"]["warmup_steps"] = warmup
    (tmp / folder / "base" / f"seed{seed}").mkdir(parents=True)
    (tmp / folder / "base" / f"seed{seed}" / "config.json").write_text(json.dumps(stored))


GRID = ("{tmp}/grid.py", "--base={tmp}/base.py", "--seeds=1")

PROGRAMS = {"training.train": "transformer-train", "evaluation.evaluate": "transformer-eval",
            "evaluation.translate": "transformer-translate", "visualisation.plot": "transformer-plot",
            "visualisation.attention_maps": "transformer-attention-maps",
            "evaluation.average": "transformer-average",
            "accelerators.benchmark": "transformer-benchmark", "sweeps.run": "transformer-experiment",
            "evaluation.export": "transformer-export", "accelerators.compile": "transformer-compile",
            "accelerators.model_info": "transformer-info",
            "training.prepare": "transformer.training.prepare"}


@dataclasses.dataclass(frozen=True)
class Case:
  program: str        # transformer.<program>
  args: tuple         # '{run}': the workdir, '{new}': a directory that does not exist, '{tmp}'
  message: str        # expected in the error line
  train_config: bool = False  # prepend --config and the tiny run's overrides
  prepare: Callable | None = None  # (tmp, run) -> None: makes the bad input
  stdin: bytes | None = None


def copy_run(tmp, run, drop=()):
  shutil.copytree(run, tmp / "copy")
  for name in drop:
    path = tmp / "copy" / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def write_lines(path, lines, raw_line=None):
  data = "".join(line + "\n" for line in lines).encode()
  if raw_line is not None:
    number, raw = raw_line
    parts = data.split(b"\n")
    parts[number - 1] = raw
    data = b"\n".join(parts)
  Path(path).write_bytes(data)


def keep_params(tmp, run):
  from transformer.evaluation.average import average_checkpoints
  average_checkpoints(str(run), 2, str(tmp / "kept"), params_only=True)


def damage_all_checkpoints(tmp, run):
  copy_run(tmp, run)
  for step in ("3", "6"):
    shutil.rmtree(tmp / "copy" / "checkpoints" / step / "state" / "d", ignore_errors=True)
    for manifest in (tmp / "copy" / "checkpoints" / step / "state").rglob("manifest.ocdbt"):
      manifest.write_bytes(b"broken")


def truncate_arrays(tmp, run):
  """A copy of the run whose checkpoint 6 has its array files cut to 100 bytes (a copy that stopped
  short)."""
  copy_run(tmp, run)
  for data in (tmp / "copy" / "checkpoints" / "6" / "state").rglob("ocdbt.process_0/d/*"):
    os.truncate(data, 100)


def break_metadata(tmp, run):
  """A copy of the run whose checkpoint 6's array metadata is cut in the middle of its JSON."""
  copy_run(tmp, run)
  metadata = tmp / "copy" / "checkpoints" / "6" / "state" / "_METADATA"
  metadata.write_bytes(metadata.read_bytes()[:10])


def with_model(tmp, run, **model):
  """A copy of the run whose stored config names another model (its checkpoints unchanged)."""
  copy_run(tmp, run)
  stored = json.loads((tmp / "copy" / "config.json").read_text())
  stored["model"].update(model)
  (tmp / "copy" / "config.json").write_text(json.dumps(stored))


def other_vocabulary(tmp, run):
  copy_run(tmp, run)
  lines = (tmp.parent / "train.en").read_text().splitlines()  # the fixture's training text
  vocab_lib.train_vocab(lines, tmp / "copy" / "vocab.model", vocab_size=200)


def same_size_other_vocabulary(tmp, run):
  """A copy of the run whose vocabulary has as many pieces, trained on other text."""
  copy_run(tmp, run)
  lines = (tmp.parent / "train.de").read_text().splitlines()
  vocab_lib.train_vocab(lines, tmp / "copy" / "vocab.model", vocab_size=300)


# A config file that fails from the inside, in each way, and the programs that take one.
TRAIN_FLAGS = ("training.train", "config", ("--workdir={tmp}/new",))
CONFIG_FAILURES = [
    ("raises a RuntimeError", "def get_config():\n  raise RuntimeError('my data is not mounted')\n",
     "RuntimeError: my data is not mounted (line 2 of {tmp}/c.py)", TRAIN_FLAGS),
    ("raises an OSError", "def get_config():\n  return open('/nonexistent/dir/paths.txt')\n",
     "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/dir/paths.txt' (line 2 "
     "of {tmp}/c.py)", TRAIN_FLAGS),
    ("raises a KeyError", "import os\ndef get_config():\n  return os.environ['MY_DATA_DIR_UNSET']\n",
     "KeyError: 'MY_DATA_DIR_UNSET' (line 3 of {tmp}/c.py)", TRAIN_FLAGS),
    ("returns None", "def get_config():\n  config = 1\n",
     "its get_config() returned None, not an ml_collections.ConfigDict; end it with `return "
     "config`", TRAIN_FLAGS),
    ("names what does not exist", "def get_config():\n  return undefined_name\n",
     "NameError: name 'undefined_name' is not defined (line 2 of {tmp}/c.py)", TRAIN_FLAGS),
    ("imports what is not installed", "import not_a_module\ndef get_config():\n  return 1\n",
     "ModuleNotFoundError: No module named 'not_a_module' (line 1 of {tmp}/c.py)", TRAIN_FLAGS),
    ("raises a ValueError", "def get_config():\n  raise ValueError('bad size')\n",
     "bad size (line 2 of {tmp}/c.py)", TRAIN_FLAGS),
    ("raises a KeyError", "import os\ndef get_config():\n  return os.environ['MY_DATA_DIR_UNSET']\n",
     "KeyError: 'MY_DATA_DIR_UNSET' (line 3 of {tmp}/c.py)",
     ("accelerators.benchmark", "config", ())),
    ("returns None", "def get_config():\n  pass\n", "its get_config() returned None",
     ("accelerators.compile", "config", ("--topology=v5e-8",))),
    ("raises a RuntimeError", "def get_config():\n  raise RuntimeError('no data here')\n",
     "RuntimeError: no data here (line 2 of {tmp}/c.py)", ("training.prepare", "config", ())),
    ("names what does not exist", "def get_config():\n  return undefined_name\n",
     "NameError: name 'undefined_name' is not defined (line 2 of {tmp}/c.py)",
     ("accelerators.model_info", "config", ())),
    ("raises an OSError", "def get_config():\n  return open('/nonexistent/dir/paths.txt')\n",
     "FileNotFoundError: [Errno 2] No such file or directory", ("sweeps.run", "base",
                                                               ("positional", "--seeds=1"))),
]

CASES = {
    # ------------------------------------------------------------------ config and flags (train)
    "unknown config key": Case("training.train", ("--config.model.foo=1",),
                               "unknown config key 'foo' (--config.model.foo)", True),
    "unknown flag": Case("training.train", ("--epochs=3",), "Unknown command line flag 'epochs'", True),
    "wrong type": Case("training.train", ("--config.model.d_model=abc",),
                       "flag --config.model.d_model=abc: invalid literal for int()", True),
    "wrong type (bool)": Case("training.train", ("--config.model.scan_layers=maybe",),
                              "Non-boolean argument to boolean flag", True),
    "d_model not divisible by heads": Case(
        "training.train", ("--config.model.num_heads=5",),
        "config.model.d_model (32) must be divisible by config.model.num_heads (5)", True),
    "zero size": Case("training.train", ("--config.model.num_layers=0",),
                      "config.model.num_layers must be a positive integer, got 0", True),
    "negative size": Case("training.train", ("--config.data.tokens_per_batch=-512",),
                          "config.data.tokens_per_batch must be a positive integer, got -512",
                          True),
    "unknown positional": Case(
        "training.train", ("--config.model.positional=fourier",),
        f"config.model.positional must be one of {', '.join(map(repr, positions.kinds()))}; got "
        "'fourier'", True),
    "another kind's hyper-parameter": Case(
        "training.train", ("--config.model.positional=t5", "--config.model.relative_clip=8"),
        "config.model.relative_clip is a hyper-parameter of positional='relative', but this run's "
        "positional is 't5'", True),
    "unknown norm": Case("training.train", ("--config.model.norm=sandwich",),
                         "config.model.norm must be one of 'post', 'pre'; got 'sandwich'", True),
    "missing config file": Case("training.train", ("--config=configs/missing.py", "--workdir={new}"),
                                "cannot load --config=configs/missing.py: [Errno 2] No such file"),
    "config file with a syntax error": Case(
        "training.train", ("--config={tmp}/broken.py", "--workdir={new}"),
        "cannot load --config={tmp}/broken.py: invalid syntax at line 1",
        prepare=lambda tmp, run: (tmp / "broken.py").write_text("def get_config(:\n")),
    "config file without get_config": Case(
        "training.train", ("--config={tmp}/empty.py", "--workdir={new}"),
        "cannot load --config={tmp}/empty.py: it defines no get_config() function",
        prepare=lambda tmp, run: (tmp / "empty.py").write_text("SIZE = 1\n")),
    "config path is a directory": Case("training.train", ("--config={tmp}", "--workdir={new}"),
                                       "cannot load --config={tmp}: [Errno 21] Is a directory"),
    **{f"config file whose get_config() {how} ({program.split('.')[-1]})": Case(
        program, (f"--{flag}={{tmp}}/c.py", *extra), f"cannot load --{flag}={{tmp}}/c.py: {said}",
        prepare=lambda tmp, run, code=code: (tmp / "c.py").write_text(code))
       for how, code, said, (program, flag, extra) in CONFIG_FAILURES},
    # ------------------------------------------------------------------------------ data (train)
    "missing data file": Case("training.train", ("--config.data.train_src={tmp}/nope.en",),
                              "data file not found: {tmp}/nope.en", True),
    "unequal line counts": Case(
        "training.train", ("--config.data.train_tgt={tmp}/short.de",),
        "has 300 lines but {tmp}/short.de has 299; parallel files must have one sentence per line",
        True, prepare=lambda tmp, run: write_lines(
            tmp / "short.de", (tmp.parent / "train.de").read_text().splitlines()[:299])),
    "invalid UTF-8": Case(
        "training.train", ("--config.data.train_src={tmp}/latin1.en",),
        "{tmp}/latin1.en:7: invalid UTF-8", True, prepare=lambda tmp, run: write_lines(
            tmp / "latin1.en", (tmp.parent / "train.en").read_text().splitlines(),
            raw_line=(7, "Caf\xe9 au lait".encode("latin-1")))),
    "all lines filtered out": Case("training.train", ("--config.data.max_len=1",), "is left after filtering",
                                   True),
    "TFDS dataset not prepared": Case(
        "training.train", ("--config.data.source=tfds", "--config.data.tfds_name=wmt14_translate/de-en",
                  "--config.data.tfds_data_dir={tmp}/tfds"),
        "wmt14_translate/de-en is not prepared in {tmp}/tfds", True),
    "missing validation file": Case("training.train", ("--config.data.eval_tgt={tmp}/nope.de",),
                                    "data file not found: {tmp}/nope.de (the validation split)",
                                    True),
    # ------------------------------------------------------------ a token cache named on its own
    "token cache of another vocabulary": Case(
        "accelerators.benchmark", ("--config=configs/multi30k.py", "--input_pipeline",
                                   "--token_cache={tmp}/synthetic"),
        "was built for a vocabulary of 37000 pieces and max_len 256, the config has 8000 and 128",
        prepare=lambda tmp, run: token_cache.write_synthetic(tmp / "synthetic", 100)),
    "token cache with an empty index.npy": Case(
        "accelerators.benchmark", ("--config=configs/multi30k.py", "--input_pipeline",
                                   "--token_cache={tmp}/cache"),
        "the cache is corrupt; rebuild it with `python -m transformer.training.prepare "
        "--config=configs/multi30k.py` (the config's training cache) or `python -m "
        "transformer.data.standin --synthetic_ids --out={tmp}/cache --pairs=N` (a synthetic one)",
        prepare=lambda tmp, run: (
            token_cache.from_pairs(tmp / "cache", [[5, 6]] * 10, [[7]] * 10),
            (tmp / "cache" / "index.npy").write_bytes(b""))),
    # ---------------------------------------------------------------------- an existing run (train)
    "workdir holds another config": Case(
        "training.train", ("--workdir={run}", "--config.model.d_model=64"),
        "holds a run with a different config (model.d_model: 32 -> 64); use a new --workdir, the "
        "original values, or --allow_config_change", True),
    "allowed config change that cannot load the checkpoint": Case(
        "training.train", ("--workdir={run}", "--config.model.d_ff=128", "--allow_config_change"),
        "checkpoint 6 in {run}/checkpoints does not match this model", True),
    "vocabulary does not match the run": Case(
        "training.train", ("--workdir={run}", "--config.data.vocab_size=200", "--allow_config_change"),
        "{run}/vocab.model has 300 pieces, but config.data.vocab_size is 200", True),
    "given vocabulary of another size": Case(
        "training.train", ("--config.data.vocab_file={run}", "--config.data.vocab_size=200"),
        "config.data.vocab_file={run} has 300 pieces, but config.data.vocab_size is 200: set "
        "--config.data.vocab_size=300", True),
    "workdir is a file": Case("training.train", ("--workdir={tmp}/file",),
                              "--workdir={tmp}/file is a file, not a directory", True,
                              prepare=lambda tmp, run: (tmp / "file").write_text("notes\n")),
    "every checkpoint broken (train)": Case(
        "training.train", ("--workdir={tmp}/copy",),
        "no checkpoint in {tmp}/copy/checkpoints can be restored: step 6 (", True,
        prepare=damage_all_checkpoints),
    # ---------------------------------------------------------------------------------- evaluation
    "not a workdir": Case("evaluation.evaluate", ("--workdir={new}",), "is not a training workdir"),
    "no workdir": Case("evaluation.evaluate", (), "pass --workdir=DIR, the directory transformer-train wrote"),
    "no checkpoint": Case("evaluation.evaluate", ("--workdir={tmp}/copy",),
                          "no checkpoint in {tmp}/copy/checkpoints; train first",
                          prepare=lambda tmp, run: copy_run(tmp, run, drop=["checkpoints"])),
    "step that does not exist": Case("evaluation.evaluate", ("--workdir={run}", "--step=5"),
                                     "no checkpoint for step 5 in {run}/checkpoints; available "
                                     "steps: 3, 6"),
    "vocabulary missing": Case("evaluation.evaluate", ("--workdir={tmp}/copy",),
                               "vocabulary file not found: {tmp}/copy/vocab.model",
                               prepare=lambda tmp, run: copy_run(tmp, run, drop=["vocab.model"])),
    "vocabulary of another run": Case("evaluation.evaluate", ("--workdir={tmp}/copy",),
                                      "{tmp}/copy/vocab.model has 200 pieces, but "
                                      "config.data.vocab_size is 300", prepare=other_vocabulary),
    "reference with another line count": Case(
        "evaluation.evaluate", ("--workdir={run}", "--source_file={tmp}/val.en",
                     "--reference_file={tmp}/val.de"),
        "{tmp}/val.en has 40 lines but {tmp}/val.de has 39",
        prepare=lambda tmp, run: [write_lines(tmp / f"val.{lang}", (
            tmp.parent / f"val.{lang}").read_text().splitlines()[:n]) for lang, n in
                                  (("en", 40), ("de", 39))]),
    "source without reference": Case("evaluation.evaluate", ("--workdir={run}", "--source_file={tmp}/x.en"),
                                     "pass both --source_file and --reference_file, or neither"),
    "bad beam size": Case("evaluation.evaluate", ("--workdir={run}", "--beam_size=0"),
                          "--beam_size must be >= 1 (1 = greedy search), got 0"),
    "n-best list longer than the beam": Case("evaluation.evaluate", ("--workdir={run}", "--beam_size=2",
                                                          "--nbest=3"),
                                             "--nbest must be between 1 and --beam_size (2), got 3"),
    "negative length penalty": Case("evaluation.evaluate", ("--workdir={run}", "--alpha=-0.5"),
                                    "--alpha (the length-penalty exponent) must be >= 0, got -0.5"),
    "negative minimum length": Case("evaluation.evaluate", ("--workdir={run}", "--min_len=-1"),
                                    "--min_len must be >= 0 (0 = an empty translation is allowed), "
                                    "got -1"),
    "ensemble with another vocabulary": Case("evaluation.evaluate", ("--workdir={run}",
                                                          "--ensemble={tmp}/copy"),
                                             "--ensemble: {tmp}/copy has a different vocabulary "
                                             "from {run}", prepare=same_size_other_vocabulary),
    "every checkpoint broken (evaluate)": Case(
        "evaluation.evaluate", ("--workdir={tmp}/copy",),
        "no checkpoint in {tmp}/copy/checkpoints can be restored: step 6 (",
        prepare=damage_all_checkpoints),
    "a truncated checkpoint": Case(
        "evaluation.evaluate", ("--workdir={tmp}/copy", "--step=6"),
        "checkpoint 6 in {tmp}/copy/checkpoints cannot be restored: the file holding the array ",
        prepare=truncate_arrays),
    "a checkpoint whose metadata is cut short": Case(
        "evaluation.evaluate", ("--workdir={tmp}/copy", "--step=6"),
        "checkpoint 6 in {tmp}/copy/checkpoints cannot be restored: a metadata file is damaged "
        "(not valid JSON", prepare=break_metadata),
    "training on a params-only workdir": Case(
        "training.train", ("--workdir={tmp}/kept",),
        "--workdir={tmp}/kept keeps a model's parameters only (transformer-average --params_only), "
        "no optimizer state to resume", True, prepare=keep_params),
    "evaluating a params-only workdir at another step": Case(
        "evaluation.evaluate", ("--workdir={tmp}/kept", "--step=3"),
        "{tmp}/kept keeps only the parameters of step 6 (the mean of its last 2 checkpoints), not "
        "of step 3: drop --step", prepare=keep_params),
    "averaging more checkpoints than exist": Case(
        "evaluation.average", ("--workdir={run}", "--last=3", "--output={new}"),
        "cannot average the last 3 checkpoints: {run}/checkpoints has 2 (steps 3, 6)"),
    # ----------------------------------------------------------------------------------- translate
    "translate empty input": Case("evaluation.translate", ("--workdir={run}",),
                                  "no input sentences in standard input", stdin=b""),
    "translate invalid UTF-8": Case("evaluation.translate", ("--workdir={run}",),
                                    "standard input is not valid UTF-8 (byte 3)",
                                    stdin=b"Caf\xe9\n"),
    "translate on a negative number of CPU devices": Case(
        "evaluation.translate", ("--workdir={run}", "--cpu_devices=-1"), "--cpu_devices must be >= 0"),
    "translate a missing file": Case("evaluation.translate", ("--workdir={run}", "--input_file={tmp}/no.en"),
                                     "data file not found: {tmp}/no.en"),
    "sampling temperature of zero": Case("evaluation.translate", ("--workdir={run}", "--sample",
                                                       "--temperature=0"),
                                         "--temperature must be > 0, got 0", stdin=b"A dog.\n"),
    "sampling option without --search=sample": Case(
        "evaluation.translate", ("--workdir={run}", "--top_p=0.9"), "--top_p applies only with --search=sample",
        stdin=b"A dog.\n"),
    "an unknown search": Case("evaluation.translate", ("--workdir={run}", "--search=nucleus"),
                              "value should be one of <beam|greedy|sample>", stdin=b"A dog.\n"),
    "scoring targets of another line count": Case(
        "evaluation.translate", ("--workdir={run}", "--score={tmp}/targets.de"),
        "2 source lines but 1 target lines", stdin=b"A dog.\nA cat.\n",
        prepare=lambda tmp, run: write_lines(tmp / "targets.de", ["Ein Hund."])),
    # --------------------------------------------------------------------------------------- grids
    "grid resumed with another base config": Case(
        "sweeps.run", (*GRID, "--base.train.steps=5", "--root={tmp}/copy"),
        "the grid's folder holds base seed 0 ({tmp}/copy/base/seed0) trained with another config "
        "than this command's: train.steps: 6 -> 5", prepare=grid_of),
    "grid resumed with fewer seeds": Case(
        "sweeps.run", (*GRID, "--root={tmp}/copy"),
        "the grid's folder {tmp}/copy holds runs this command leaves out of its tables: base/seed1 "
        "(pass --seeds/--first_seed to include seed(s) 1)",
        prepare=lambda tmp, run: grid_of(tmp, run, seeds=(0, 1))),
    "grid record whose kept runs disagree": Case(
        "sweeps.run", (*GRID, "--root={tmp}/copy/exp", "--record={tmp}/copy/record"),
        "the grid's record holds base seed 0 ({tmp}/copy/record/runs/base/seed0) trained with "
        "another config than this command's: train.warmup_steps: 9 -> 4",
        prepare=lambda tmp, run: grid_of(tmp, run, folder="copy/record/runs", warmup=9)),
    "grid without a held-out test set": Case(
        "sweeps.run", (*GRID, "--root={tmp}/copy", "--test_dir={tmp}"),
        "6 test file(s) missing in {tmp}: test_2016_flickr.en.gz, test_2016_flickr.de.gz, ",
        prepare=grid_of),
    "grid with no runs at a time": Case(
        "sweeps.run", (*GRID, "--root={tmp}/copy", "--parallel=0"),
        "--parallel must be at least 1 (runs at a time), got 0", prepare=grid_of),
    "grid scored with two minimum lengths": Case(
        "sweeps.run", (*GRID, "--root={tmp}/copy", "--min_len=1", "--also_min_len=2"),
        "pass --min_len=N (score with N instead of the config's search) or --also_min_len=N "
        "(score both ways), not both", prepare=grid_of),
    # ------------------------------------------------------------------------------------ export
    "export of a non-workdir": Case("evaluation.export", ("--workdir={tmp}", "--format=huggingface",
                                                          "--output={new}"),
                                    "{tmp}/config.json not found: {tmp} is not a training workdir"),
    "export into a directory in use": Case(
        "evaluation.export", ("--workdir={run}", "--format=huggingface", "--output={tmp}/copy"),
        "--output={tmp}/copy exists and is not empty; choose a new directory",
        prepare=lambda tmp, run: (tmp / "copy").mkdir() or (tmp / "copy" / "notes.txt").write_text("mine")),
    "export of positions Marian cannot hold": Case(
        "evaluation.export", ("--workdir={tmp}/copy", "--format=huggingface", "--output={new}"),
        "Marian cannot hold 'rotary' positions: it adds one position table to each stack's "
        "embeddings, and 'rotary' acts inside attention",
        prepare=lambda tmp, run: with_model(tmp, run, positional="rotary")),
    "export of a pre-LN model to Marian": Case(
        "evaluation.export", ("--workdir={tmp}/copy", "--format=huggingface", "--output={new}"),
        "Marian's layers are post-LayerNorm; this model is pre-LayerNorm (config.model.norm)",
        prepare=lambda tmp, run: with_model(tmp, run, norm="pre")),
    # ------------------------------------------------------------------------- pictures of a run
    "plot a directory without metrics": Case("visualisation.plot", ("{tmp}", "--output={tmp}/c.png"),
                                             "no metrics.jsonl in {tmp}: pass the workdirs that "
                                             "transformer-train wrote"),
    "attention of an empty source": Case("visualisation.attention_maps", ("--workdir={run}", "--source= "),
                                         "--source is empty; pass a sentence"),
    "attention of an over-long source": Case(
        "visualisation.attention_maps", ("--workdir={run}", "--source=" + "a man rides a horse " * 20),
        "tokens long (with </s>); this model's runs take at most 40 (config.data.max_len)"),
    "attention of an empty target": Case("visualisation.attention_maps", ("--workdir={run}", "--source=A dog.",
                                                       "--target="),
                                         "--target is empty; pass the translation to draw"),
    "attention of a non-workdir": Case("visualisation.attention_maps", ("--workdir={tmp}", "--source=A dog."),
                                       "{tmp}/config.json not found: {tmp} is not a training "
                                       "workdir"),
}


def run_case(case, cfg, run, tmp_path):
  """Makes the case's bad input under `tmp_path`, runs the program; returns (result, before, after)
  with snapshots of every file the program could touch."""
  tmp = tmp_path / "inputs"
  tmp.mkdir()
  for f in run.parent.glob("*.??"):  # the fixture's text files, read as tmp.parent / 'train.en'
    shutil.copy(f, tmp_path / f.name)
  if case.prepare:
    case.prepare(tmp, run)
  fill = lambda text: text.format(run=run, new=tmp_path / "new", tmp=tmp)
  args = [fill(a) for a in case.args]
  if case.train_config:
    defaults = [a for a in cli_overrides(cfg, **{"data.batching": "pack", "data.pack_length": 40})
                if a.split("=")[0] not in {x.split("=")[0] for x in args}]
    if not any(a.startswith("--workdir=") for a in args):
      args.append(f"--workdir={tmp_path / 'new'}")
    args = ["--config=configs/multi30k.py", *defaults, *args]
  watched = (run, tmp_path / "new", tmp / "copy")
  before = snapshot(*watched)
  out = run_cli(f"transformer.{case.program}", *args, input_bytes=case.stdin)
  return out, fill(case.message), before, snapshot(*watched)


@pytest.fixture(scope="module")
def outcomes(trained, tmp_path_factory):
  """Every case, three at a time (each is a process that mostly starts up): name -> outcome."""
  cfg, run = trained
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    futures = {name: pool.submit(run_case, case, cfg, run,
                                 tmp_path_factory.mktemp(name.replace(" ", "_")[:40]))
               for name, case in CASES.items()}
    return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_clear_line_and_writes_nothing(name, outcomes):
  out, message, before, after = outcomes[name]
  stderr = out.stderr.decode() if isinstance(out.stderr, bytes) else out.stderr
  assert out.returncode == 2, stderr[-3000:]
  assert "Traceback" not in stderr and "<bound method" not in stderr, stderr[-3000:]
  last = stderr.strip().splitlines()[-1]
  program = {"evaluate": "transformer-eval", "attention_maps": "transformer-attention-maps"}.get(
      CASES[name].program,
                                                 PROGRAMS[CASES[name].program])
  assert last.startswith(f"{program}: error: "), stderr[-3000:]
  assert message in last, last
  assert after == before  # nothing written, overwritten or deleted


def test_an_unexpected_error_keeps_its_traceback_and_exits_1(tmp_path):
  """Our bugs are not dressed up as user errors: the traceback stays and the status is 1."""
  script = tmp_path / "broken_program.py"
  script.write_text("from transformer.cli import run_program\n"
                    "def main(argv):\n  raise RuntimeError('a bug of ours')\n"
                    "run_program('broken-program', main)\n")
  out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
  assert out.returncode == 1
  assert "Traceback" in out.stderr and out.stderr.strip().endswith("RuntimeError: a bug of ours")
