"""Every program as a user without root's powers: an output it may not write is one line naming
the path and what to do, found before the long work (nothing decoded, trained or compiled for
nothing) and with nothing changed; a run it may only read is read.

The tests run as root (CI does), whom permissions never stop; each program here runs without the
capabilities that let root write anywhere (`setpriv` dropping CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH and CAP_FOWNER from its bounding set), or as the user it is, and the module
is skipped with the reason where neither can be had.
"""

import concurrent.futures
import importlib.util
import os
import shutil
import stat
import subprocess
import sys

import pytest
from helpers import REPO, snapshot

DROP = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.fixture(scope="module")
def as_user(tmp_path_factory):
  """The command prefix that runs a program without root's powers over files."""
  if os.geteuid() != 0:
    return []
  locked = tmp_path_factory.mktemp("locked")
  locked.chmod(0o500)
  try:
    done = subprocess.run([*DROP, "touch", str(locked / "x")], capture_output=True)
  except FileNotFoundError:
    pytest.skip("setpriv (util-linux) is missing: cannot run as a user without root's powers")
  if done.returncode == 0 or b"Permission denied" not in done.stderr:
    pytest.skip(f"dropping root's capabilities did not take here: {done.stderr.decode().strip()}")
  return DROP


def read_only(path):
  """Takes write permission from `path` and everything under it."""
  for p in [path, *path.rglob("*")]:
    p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def places(two_step_run, tmp_path_factory):
  """{'run': a read-only copy of a trained run, 'ro': a read-only folder, 'rw': a writable one}."""
  tmp = tmp_path_factory.mktemp("permissions")
  shutil.copytree(two_step_run, tmp / "run")
  for name in ("ro", "rw"):
    (tmp / name).mkdir()
  (tmp / "rw" / "run_config.py").write_text(  # the run's own config, to train it on
      "import json, ml_collections\ndef get_config():\n  return ml_collections.ConfigDict("
      f"json.load(open({str(tmp / 'run' / 'config.json')!r})))\n")
  (tmp / "rw" / "in.en").write_text("A dog runs.\n")
  read_only(tmp / "run")
  read_only(tmp / "ro")
  yield {name: tmp / name for name in ("run", "ro", "rw")}
  for p in [tmp / "run", *(tmp / "run").rglob("*"), tmp / "ro"]:
    p.chmod(p.stat().st_mode | stat.S_IWUSR)  # for pytest's clean-up


def run_as(as_user, module, *args, stdin=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([*as_user, sys.executable, "-m", module, *args], cwd=REPO, env=env,
                        input=stdin, capture_output=True, text=True, timeout=600)


TRAIN = ("--config=configs/multi30k.py", "--config.model.num_layers=1", "--config.model.d_model=32",
         "--config.model.d_ff=64", "--config.model.num_heads=4")
# name: (module, arguments, the error line's words, words of the work's output, which must not come)
REFUSED = {
    "train into a folder it may not write": (
        "transformer.training.train", (*TRAIN, "--workdir={ro}/new",
                                       "--config.data.vocab_cache_dir={rw}/vocab_cache"),
        "cannot write in {ro}/new (Permission denied): point --workdir at a directory", "Data:"),
    "train on with a read-only run": (
        "transformer.training.train", ("--config={rw}/run_config.py", "--workdir={run}"),
        "cannot write in {run} (Permission denied): point --workdir", "Data:"),
    "evaluate a read-only run": (
        "transformer.evaluation.evaluate", ("--workdir={run}",),
        "cannot write in {run}/eval (Permission denied): pass --report_dir=DIR to write the "
        "reports there (the run stays untouched)", "Translating"),
    "watch a read-only run": (
        "transformer.evaluation.evaluate", ("--workdir={run}", "--watch"),
        "--watch keeps its record in the run (eval/, metrics.jsonl): make the run writable",
        "Watching"),
    "reports into a folder it may not write": (
        "transformer.evaluation.evaluate", ("--workdir={run}", "--report_dir={ro}/reports"),
        "cannot write in {ro}/reports (Permission denied): point --report_dir", "Translating"),
    "translations into a folder it may not write": (
        "transformer.evaluation.translate", ("--workdir={run}", "--input_file={rw}/in.en",
                                            "--output_file={ro}/out.de"),
        "cannot write in {ro} (Permission denied): point --output_file into a directory",
        "Translated"),
    "average into a folder it may not write": (
        "transformer.evaluation.average", ("--workdir={run}", "--last=1", "--output={ro}/avg"),
        "cannot write in {ro}/avg (Permission denied): point --output", "averaged"),
    "export into a folder it may not write": (
        "transformer.evaluation.export", ("--workdir={run}", "--format=huggingface",
                                          "--output={ro}/hf"),
        "cannot write in {ro} (Permission denied): point --output", "wrote"),
    "plot into a folder it may not write": (
        "transformer.visualisation.plot", ("{run}", "--output={ro}/c.png"),
        "cannot write in {ro} (Permission denied): point --output into a directory", "group(s)"),
    "attention maps into a read-only run": (
        "transformer.visualisation.attention_maps", ("--workdir={run}", "--source=A dog."),
        "cannot write in {run}/attention (Permission denied): point --output_dir", "Translation"),
    "a grid into a folder it may not write": (
        "transformer.sweeps.run", ("positional", "--base=configs/multi30k.py", "--seeds=1",
                                   "--root={ro}/grid"),
        "cannot write in {ro}/grid (Permission denied): point --root", "Test set"),
    "a benchmark's result into a folder it may not write": (
        "transformer.accelerators.benchmark", ("--config=configs/multi30k.py",
                                               "--output={ro}/b.json"),
        "cannot write in {ro} (Permission denied): point --output into a directory",
        "Compiling"),
    "a compile report into a folder it may not write": (
        "transformer.accelerators.compile", ("--config=configs/multi30k.py", "--topology=8xH100",
                                             "--output={ro}/c.json"),
        "cannot write in {ro} (Permission denied): point --output into a directory", "Compil"),
    "prepare's report into a folder it may not write": (
        "transformer.training.prepare", ("--config=configs/multi30k.py", "--report={ro}/r.json"),
        "cannot write in {ro} (Permission denied): point --report into a directory", "vocabulary"),
    "a stand-in corpus into a folder it may not write": (
        "transformer.data.standin", ("--out={ro}/corpus", "--pairs=10"),
        "cannot write in {ro}/corpus (Permission denied): point --out", "stand-in corpus"),
}


@pytest.fixture(scope="module")
def refused(as_user, places):
  """Every REFUSED case, three at a time: name -> (result, expected words, before, after)."""
  def one(case):
    module, args, words, _ = case
    before = snapshot(*places.values())
    out = run_as(as_user, module, *(a.format(**places) for a in args))
    return out, words.format(**places), before, snapshot(*places.values())
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    return dict(zip(REFUSED, pool.map(one, REFUSED.values())))


@pytest.mark.parametrize("name", REFUSED)
def test_an_output_it_may_not_write_is_one_line_before_the_work(name, refused):
  out, words, before, after = refused[name]
  program = out.stderr.strip().splitlines()[-1].split(": error: ")
  assert out.returncode == 2 and len(program) == 2, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  assert words in program[1], program[1]
  assert REFUSED[name][3] not in out.stdout + out.stderr.replace(program[1], ""), out.stderr
  assert after == before  # nothing written, changed or removed


def test_a_run_it_may_only_read_is_evaluated_translated_averaged_drawn_and_exported(as_user,
                                                                                   places):
  run, rw = places["run"], places["rw"]
  before = snapshot(run)
  reports = run_as(as_user, "transformer.evaluation.evaluate", f"--workdir={run}",
                   f"--report_dir={rw}/reports")
  assert reports.returncode == 0, reports.stderr[-3000:]
  assert "sacreBLEU" in reports.stdout and (rw / "reports" / "validation_step2.json").is_file()
  translated = run_as(as_user, "transformer.evaluation.translate", f"--workdir={run}",
                      stdin="A dog runs.\nTwo men sit.\n")
  assert translated.returncode == 0 and len(translated.stdout.splitlines()) == 2, translated.stderr
  averaged = run_as(as_user, "transformer.evaluation.average", f"--workdir={run}", "--last=1",
                    f"--output={rw}/avg")
  assert averaged.returncode == 0 and (rw / "avg" / "config.json").is_file(), averaged.stderr
  drawn = run_as(as_user, "transformer.visualisation.attention_maps", f"--workdir={run}",
                 "--source=A dog.", "--target=Ein Hund.", f"--output_dir={rw}/maps")
  assert drawn.returncode == 0 and (rw / "maps" / "attention.npz").is_file(), drawn.stderr
  plotted = run_as(as_user, "transformer.visualisation.plot", str(run), f"--output={rw}/c.png")
  assert plotted.returncode == 0 and (rw / "c.png").is_file(), plotted.stderr
  for extra, fmt in (("ctranslate2", "ctranslate2"), ("transformers", "huggingface")):
    if importlib.util.find_spec(extra):
      exported = run_as(as_user, "transformer.evaluation.export", f"--workdir={run}",
                        f"--format={fmt}", f"--output={rw}/{fmt}")
      assert exported.returncode == 0, exported.stderr[-3000:]
  assert snapshot(run) == before


def test_a_compilation_cache_it_may_not_write_is_one_warning_and_the_work_goes_on(as_user,
                                                                                   places):
  out = run_as(as_user, "transformer.evaluation.translate", f"--workdir={places['run']}",
               f"--compilation_cache={places['ro']}/cache", stdin="A dog runs.\n")
  assert out.returncode == 0 and len(out.stdout.splitlines()) == 1, out.stderr[-3000:]
  assert out.stderr.count("running without the compilation cache") == 1, out.stderr[-3000:]
  assert f"cannot write in {places['ro']}/cache (Permission denied)" in out.stderr
  assert "Traceback" not in out.stderr and not (places["ro"] / "cache").exists()
