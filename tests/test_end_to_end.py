"""Train a tiny model on a slice of the bundled data, resume it, and evaluate it as a user would."""

import json
import os
import shutil
import subprocess

import matplotlib.image
import numpy as np
import pytest
from helpers import cli_overrides, run_cli, tiny_run_config

from transformer import hardware, version
from transformer.evaluation.evaluate import evaluate
from transformer.metrics import read_metrics
from transformer.training.train import train_and_evaluate


def tensorboard_scalars(logdir):
  """{tag: [(step, value), ...]} as TensorBoard reads the event files of one run directory."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  events = EventAccumulator(str(logdir))
  events.Reload()
  return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def assert_same_points(got, expected):
  """The same steps, and values equal up to TensorBoard's float32."""
  assert [step for step, _ in got] == [step for step, _ in expected]
  np.testing.assert_allclose([v for _, v in got], [v for _, v in expected], rtol=1e-6)


def check_evaluation(workdir):
  """The evaluation program, as its own process, with a beam of 2 (reports named _beam2)."""
  out = run_cli("transformer.evaluation.evaluate", f"--workdir={workdir}", "--beam_size=2")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "sacreBLEU" in out.stdout and "step 8" in out.stdout
  report = json.loads((workdir / "eval" / "validation_step8_beam2.json").read_text())
  assert report["checkpoint_step"] == 8 and report["sentences"] == 40
  assert 0.0 <= report["sacrebleu"]["bleu"] <= 100.0
  assert report["sacrebleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  assert report["decode"] == {"search": "beam", "beam_size": 2, "alpha": 0.6, "nbest": 1,
                              "max_extra_len": 5}
  paper = report["tokenized_bleu"]
  assert 0.0 <= paper["bleu"] <= 100.0 and paper["lines"] == 40 and paper["case"] == "cased"
  assert paper["tokenizer"].startswith("unicode punctuation + moses(de) + compound splitting")
  hypotheses = (workdir / "eval" / "validation_step8_beam2.hyp.txt").read_text().splitlines()
  assert len(hypotheses) == 40
  assert read_metrics(workdir, "bleu")[-1]["bleu"] == report["sacrebleu"]["bleu"]
  return report


def check_tensorboard(workdir, report):
  # TensorBoard shows the same numbers: training's in the workdir (the resumed process's steps
  # follow the first's, none twice), the evaluation program's BLEU in eval/.
  scalars = tensorboard_scalars(workdir)
  for tag, key in (("train/loss", "loss"), ("train/learning_rate", "learning_rate"),
                   ("train/grad_norm", "grad_norm"), ("train/tokens_per_sec", "tokens_per_sec"),
                   ("train/tflops_per_sec", "tflops_per_sec")):
    assert_same_points(scalars[tag], [(r["step"], r[key]) for r in read_metrics(workdir, "train")])
  assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6, 8]
  assert "train/mfu" not in scalars  # no peak FLOP/s is known for a CPU
  for key in ("nll", "accuracy", "perplexity"):
    assert_same_points(scalars[f"eval/{key}"],
                       [(r["step"], r[key]) for r in read_metrics(workdir, "eval")])
  bleu_scalars = tensorboard_scalars(workdir / "eval")
  assert sorted(bleu_scalars) == [  # a search other than the config's beam 4 is named
      "bleu/validation_beam2", "chrf/validation_beam2", "lc_tok_bleu/validation_beam2",
      "tokenized_bleu/validation_beam2"]
  assert_same_points(bleu_scalars["bleu/validation_beam2"], [(8, report["sacrebleu"]["bleu"])])
  assert_same_points(bleu_scalars["chrf/validation_beam2"], [(8, report["chrf"]["chrf"])])
  assert_same_points(bleu_scalars["tokenized_bleu/validation_beam2"],
                     [(8, report["tokenized_bleu"]["bleu"])])
  assert_same_points(bleu_scalars["lc_tok_bleu/validation_beam2"],
                     [(8, report["lc_tok_bleu"]["bleu"])])


def test_train_resume_and_evaluate(tmp_path):
  cfg = tiny_run_config(tmp_path)
  workdir = tmp_path / "run"
  summary = train_and_evaluate(cfg, str(workdir))
  assert summary["steps"] == 6 and summary["resumed_from"] == 0
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["3", "6"]
  assert (workdir / "vocab.model").is_file() and (workdir / "config.json").is_file()
  train_records = read_metrics(workdir, "train")
  assert [r["step"] for r in train_records] == [2, 4, 6]
  assert all(r["loss"] > 0 and r["tokens_per_sec"] > 0 for r in train_records)
  assert [r["step"] for r in read_metrics(workdir, "eval")] == [3, 6]

  # The command line resumes from step 6 and trains to step 8 with the same vocabulary.
  vocab_bytes = (workdir / "vocab.model").read_bytes()
  overrides = cli_overrides(cfg, **{"train.steps": 8})
  out = run_cli("transformer.training.train", "--config=configs/multi30k.py", f"--workdir={workdir}",
                *overrides)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Resumed from the checkpoint at step 6" in out.stderr
  assert "step 8/8" in out.stderr
  assert (workdir / "vocab.model").read_bytes() == vocab_bytes
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["6", "8"]
  # Each start names the machine that trained from there; a finished run started again trains
  # nothing and records no machine.
  starts = read_metrics(workdir, "start")
  assert [r["step"] for r in starts] == [0, 6]
  assert all(r["machine"].startswith(hardware.cpu_id() + ", ") for r in starts)
  assert {r["commit"] for r in starts} == {version.commit()}  # and the code that trained it
  finished = cfg.copy_and_resolve_references()
  finished.train.steps = 8
  assert train_and_evaluate(finished, str(workdir))["resumed_from"] == 8
  assert len(read_metrics(workdir, "start")) == 2

  report = check_evaluation(workdir)
  check_tensorboard(workdir, report)

  # Checkpoint averaging: the last 2 make a new workdir that the evaluation program reads like a
  # training one.
  averaged = tmp_path / "averaged"
  out = run_cli("transformer.evaluation.average", f"--workdir={workdir}", "--last=2", f"--output={averaged}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads((averaged / "average.json").read_text())["averaged_steps"] == [6, 8]
  out = run_cli("transformer.evaluation.evaluate", f"--workdir={averaged}", "--beam_size=2")
  assert out.returncode == 0, out.stderr[-3000:]
  from_file = json.loads((averaged / "eval" / "validation_step8_beam2.json").read_text())
  # transformer-translate: stdin to stdout in order, an empty line stays empty, a long line is
  # truncated with a warning.
  long_line = " ".join(["a man rides a horse"] * 20)
  lines = ["A dog runs.", "", long_line, "Two men play football."]
  out = run_cli("transformer.evaluation.translate", f"--workdir={workdir}", "--beam_size=1",
                input_text="\n".join(lines) + "\n")
  assert out.returncode == 0, out.stderr[-3000:]
  translations = out.stdout.split("\n")
  assert len(translations) == 5 and translations[4] == "" and translations[1] == ""
  assert "1 input lines were longer than 40 tokens and were truncated" in out.stderr

  # --watch evaluates the one checkpoint not evaluated yet with its search (6; 8 was above) and
  # stops: 8 is the last.
  out = run_cli("transformer.evaluation.evaluate", f"--workdir={workdir}", "--watch", "--poll_seconds=0.1",
                "--beam_size=2")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "step 6: sacreBLEU" in out.stderr and "step 8: sacreBLEU" not in out.stderr
  assert "Training has finished (step 8 evaluated); stopping" in out.stderr

  on_the_fly = evaluate(str(workdir), beam_size=2, average_last=2)  # --average_last=2
  assert on_the_fly["averaged_steps"] == [6, 8]
  assert on_the_fly["files"][1].endswith("validation_step8_avg2_beam2.json")
  assert on_the_fly["sacrebleu"]["bleu"] == pytest.approx(from_file["sacrebleu"]["bleu"])

  # The pictures (their contents: tests/test_visualisation.py): the run compared with its average,
  # and the attention maps of the model's own translation of one sentence.
  out = run_cli("transformer.visualisation.plot", str(workdir), str(averaged), f"--output={tmp_path / 'c.png'}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "2 run(s) in 2 group(s): run, averaged" in out.stdout
  assert matplotlib.image.imread(tmp_path / "c.png").ndim == 3
  out = run_cli("transformer.visualisation.attention_maps", f"--workdir={workdir}", "--source=A dog runs.",
                "--target=Ein Hund rennt.")
  assert out.returncode == 0, out.stderr[-3000:]
  own = run_cli("transformer.visualisation.attention_maps", f"--workdir={workdir}", "--source=A dog runs.",
                f"--output_dir={tmp_path / 'own'}")  # the target: the model's own translation
  translation = own.stderr.split("Translation by the checkpoint at step 8: ")[1].splitlines()[0]
  if translation.strip():
    assert own.returncode == 0, own.stderr[-3000:]
  else:  # eight steps of training may well translate to nothing
    assert own.stderr.strip().splitlines()[-1] == (
        "transformer-attention-maps: error: the checkpoint at step 8 translates the source to an empty "
        "sentence; pass --target=\"...\" to draw the attention of a translation")
  pictures = workdir / "attention"
  assert sorted(p.name for p in pictures.iterdir()) == [
      "attention.npz", "cross_attention.png", "decoder_self_attention.png",
      "encoder_self_attention.png", "heads", "positional_encoding.png"]
  assert len(list((pictures / "heads").glob("*.png"))) == 3 * 1 * 4  # kinds x layers x heads
  assert matplotlib.image.imread(pictures / "cross_attention.png").ndim == 3

  # Every mistake's one-line error: tests/test_bad_inputs.py.


def test_console_scripts_explain_themselves():
  """`transformer-<program> --help` (the installed console scripts) shows the program's usage and
  its flags, though the script is not the module that defines them."""
  for script, expected, usage in (
      ("transformer-eval", "--average_last: Average the parameters", "--workdir=runs/m30k"),
      ("transformer-attention-maps", "--source: The source sentence.", "--workdir=runs/m30k"),
      ("transformer-compile", "--topology: The slice or cluster to compile for",
       "--config=configs/wmt14_ende.py:big --topology=v5p-32")):
    out = subprocess.run([shutil.which(script), "--help"], capture_output=True, text=True,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert expected in out.stdout, out.stdout + out.stderr[-2000:]
    assert f"{script} {usage}" in out.stdout
    assert "--progress: <auto|bar|lines|off>" in out.stdout or script != "transformer-eval"
    # programs that run what they compile keep it in JAX's persistent cache; compile runs nothing
    assert ("--compilation_cache:" in out.stdout) == (script != "transformer-compile")


def test_info_prints_counts_and_flops():
  out = run_cli("transformer.accelerators.model_info", "--config=configs/wmt14_ende.py:base")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "63,082,496" in out.stdout and "analytic formula: 63,082,496 (matches)" in out.stdout
  assert "65M (paper, 'base')" in out.stdout
  assert "training FLOPs per target token: 0.381 GFLOP" in out.stdout
  out = run_cli("transformer.accelerators.model_info", "--config=configs/multi30k.py", "--config.model.num_heads=3")
  assert out.returncode != 0
  assert "config.model.d_model (256) must be divisible by config.model.num_heads (3)" in out.stderr


@pytest.mark.slow
def test_a_small_model_learns_to_translate_its_training_sentences(tmp_path):
  """The whole pipeline learns: overfit 64 short pairs, then translate them back near-perfectly."""
  cfg = tiny_run_config(tmp_path, train_lines=64, eval_lines=64)
  for name in ("train", "val"):  # evaluate on the training sentences themselves
    for lang in ("en", "de"):
      (tmp_path / f"{name}.{lang}").write_text((tmp_path / f"train.{lang}").read_text())
  cfg.model.update(num_layers=2, d_model=64, d_ff=128, dropout=0.0)
  cfg.data.vocab_size = 400
  cfg.train.update(steps=400, warmup_steps=100, learning_rate=0.2, label_smoothing=0.0,
                   log_every=100, eval_every=400, checkpoint_every=400)
  workdir = tmp_path / "run"
  train_and_evaluate(cfg, str(workdir))
  assert read_metrics(workdir, "eval")[-1]["accuracy"] > 0.95
  report = evaluate(str(workdir), beam_size=4)
  assert report["sacrebleu"]["bleu"] > 80.0


@pytest.mark.slow
def test_the_same_commands_run_on_eight_devices(tmp_path):
  cfg = tiny_run_config(tmp_path)
  workdir = tmp_path / "run8"
  out = run_cli("transformer.training.train", "--config=configs/multi30k.py", f"--workdir={workdir}",
                *cli_overrides(cfg, **{"train.steps": 4}), devices=8)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "8 devices (cpu)" in out.stderr and "step 4/4" in out.stderr
  out = run_cli("transformer.evaluation.evaluate", f"--workdir={workdir}", "--beam_size=2", devices=8)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "sacreBLEU" in out.stdout


@pytest.mark.slow
def test_checkpoints_on_a_wall_clock_cadence(tmp_path):
  cfg = tiny_run_config(tmp_path)
  cfg.train.steps, cfg.train.log_every, cfg.train.eval_every = 6, 2, 6
  cfg.train.checkpoint_every, cfg.train.keep_checkpoints = 1000, 5
  cfg.train.checkpoint_minutes = 1e-9  # due at every progress line
  train_and_evaluate(cfg, str(tmp_path / "run"))
  assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == [2, 4, 6]
  cfg.train.steps, cfg.train.checkpoint_minutes = 10, 0.0  # off: the step cadence and the end only
  train_and_evaluate(cfg, str(tmp_path / "run"))
  assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == [2, 4, 6, 10]
