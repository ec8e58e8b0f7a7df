"""metrics.jsonl and the TensorBoard event files beside it, read back as TensorBoard reads them;
the machine that its 'start' records name."""

import importlib.util
import json
import platform
import subprocess
import sys

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer import hardware
from transformer.metrics import (
  MetricWriter,
  read_metrics,
  tensorboard_scalars,
  training_clock,
  whole_intervals,
)


def read_tensorboard(logdir):
  events = EventAccumulator(str(logdir))
  events.Reload()
  return {tag: [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]
          for tag in events.Tags()["scalars"]}


def test_every_record_goes_to_jsonl_and_its_numbers_to_tensorboard(tmp_path):
  with MetricWriter(tmp_path) as writer:
    writer.write("train", 10, loss=np.float32(4.5), learning_rate=1e-3, grad_norm=0.7,
                 tokens_per_sec=1500.0, tflops_per_sec=0.25, mfu=0.41)
    writer.write("eval", 10, nll=3.25, accuracy=0.5, perplexity=25.79)
    writer.write("summary", 10, steps=10, parameters=1000)  # one-off totals: jsonl only
  assert [r["event"] for r in read_metrics(tmp_path)] == ["train", "eval", "summary"]
  assert read_metrics(tmp_path, "train")[0]["loss"] == 4.5
  scalars = read_tensorboard(tmp_path)
  assert sorted(scalars) == ["eval/accuracy", "eval/nll", "eval/perplexity", "train/grad_norm",
                             "train/learning_rate", "train/loss", "train/mfu",
                             "train/tflops_per_sec", "train/tokens_per_sec"]
  train_time = read_metrics(tmp_path, "train")[0]["time"]
  step, value, wall_time = scalars["train/mfu"][0]
  assert (step, wall_time) == (10, pytest.approx(train_time)) and value == pytest.approx(0.41)
  assert scalars["eval/perplexity"][0][:2] == (10, pytest.approx(25.79))


def test_bleu_is_named_by_test_set_averaging_ensemble_minimum_length_and_ema(tmp_path):
  with MetricWriter(tmp_path, tensorboard_dir="eval") as writer:
    writer.write("bleu", 500, test_set="validation", averaged=1, bleu=30.5, tokenized_bleu=31.5,
                 signature="nrefs:1|...", beam_size=4)
    writer.write("bleu", 500, test_set="long", averaged=5, bleu=10.25, tokenized_bleu=11.0)
    writer.write("bleu", 500, test_set="validation", averaged=1, ema=True, bleu=31.0)
    writer.write("bleu", 500, test_set="validation", averaged=1, ema=True, min_len=1, bleu=31.25)
    writer.write("bleu", 500, test_set="long", averaged=5, ensemble=2, ema=True, min_len=2, bleu=9.5)
  scalars = read_tensorboard(tmp_path / "eval")
  assert {tag: [(s, v) for s, v, _ in points] for tag, points in scalars.items()} == {
      "bleu/validation": [(500, 30.5)], "tokenized_bleu/validation": [(500, 31.5)],
      "bleu/long_avg5": [(500, 10.25)], "tokenized_bleu/long_avg5": [(500, 11.0)],
      "bleu/validation_ema": [(500, 31.0)], "bleu/validation_min1_ema": [(500, 31.25)],
      "bleu/long_avg5_ens2_min2_ema": [(500, 9.5)]}
  assert not list(tmp_path.glob("events.*"))  # the evaluation's go to eval/ only


def test_a_resumed_run_hides_what_the_interrupted_one_logged_after_its_checkpoint(tmp_path):
  with MetricWriter(tmp_path) as first:
    for step in (2, 4, 6):
      first.write("train", step, loss=10.0 - step)
  with MetricWriter(tmp_path, purge_step=4) as resumed:  # resumed from the checkpoint at step 3
    for step in (4, 6, 8):
      resumed.write("train", step, loss=float(step))
  points = [(s, v) for s, v, _ in read_tensorboard(tmp_path)["train/loss"]]
  assert points == [(2, 8.0), (4, 4.0), (6, 6.0), (8, 8.0)]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch installed "
                    "(pip install torch), whose import tensorboardX would otherwise make")
def test_tensorboard_files_are_written_without_importing_torch_which_stays_importable(tmp_path):
  code = ("import sys\nfrom transformer.metrics import MetricWriter\n"
          f"with MetricWriter({str(tmp_path)!r}) as w:\n  w.write('train', 1, loss=2.5)\n"
          "assert 'torch' not in sys.modules, 'torch was imported'\n"
          "import torch\nprint(torch.tensor([1.0]).sum().item())\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and out.stdout.strip() == "1.0", out.stderr[-2000:]
  events = EventAccumulator(str(tmp_path))
  events.Reload()
  assert [e.value for e in events.Scalars("train/loss")] == [2.5]


def test_nothing_is_written_before_the_first_record(tmp_path):
  MetricWriter(tmp_path / "run").close()
  assert not (tmp_path / "run").exists()


def test_tensorboard_scalars_of_a_record():
  record = {"event": "checkpoint", "step": 5, "time": 1.0, "blocking_sec": 0.2, "ok": True}
  assert tensorboard_scalars(record) == {"checkpoint/blocking_sec": 0.2}
  assert tensorboard_scalars({"event": "interrupted", "step": 5, "time": 1.0}) == {}


def test_a_half_written_last_line_is_skipped(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"event": "train", "step": 1}) + '\n{"ev')
  assert read_metrics(tmp_path) == [{"event": "train", "step": 1}]


def test_training_time_adds_up_every_process_that_trained_the_run():
  records = [{"elapsed": e} for e in (10.0, 20.0, 25.0, 5.0, 15.0, 3.0)]  # two restarts
  assert training_clock(records) == [10.0, 20.0, 25.0, 30.0, 40.0, 43.0]
  assert training_clock([]) == []


def test_the_machine_names_the_cpus_generation_where_its_brand_is_all_the_name_says(
    tmp_path, monkeypatch):
  cpuinfo = tmp_path / "cpuinfo"
  monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
  first = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
           "model name\t: AMD EPYC\nstepping\t: 1\n")
  cpuinfo.write_text(first + "\n" + first.replace(": 0", ": 1").replace("26", "25"))
  assert hardware.cpu_model() == "AMD EPYC"
  assert hardware.cpu_id() == "AMD EPYC (AuthenticAMD family 26 model 2)"  # the first processor's
  cpuinfo.write_text("processor\t: 0\nmodel name\t: Some ARM core\n")
  assert hardware.cpu_id() == "Some ARM core"
  cpuinfo.unlink()
  assert hardware.cpu_id() == (platform.processor() or platform.machine())
  described = hardware.describe()
  assert described["machine"] == (f"{hardware.cpu_id()}, {len(jax.devices())} cpu device(s), "
                                  f"JAX {jax.__version__}")


def test_part_intervals_of_a_stop_and_a_resume_merge_weighed_by_their_tokens():
  # log_every 25; a stop after step 49 and the resume's first record at 50 split 26-50.
  records = [{"event": "train", "step": 25, "loss": 3.0, "nll": 2.5, "accuracy": 0.2,
              "grad_norm": 1.0, "steps": 25, "loss_tokens": 500.0},
             {"event": "train", "step": 49, "loss": 2.0, "nll": 1.5, "accuracy": 0.5,
              "grad_norm": 2.0, "steps": 24, "loss_tokens": 240.0},
             {"event": "train", "step": 50, "loss": 4.0, "nll": 3.5, "accuracy": 0.1,
              "grad_norm": 4.0, "steps": 1, "loss_tokens": 10.0},
             {"event": "train", "step": 60, "loss": 1.0, "nll": 0.5, "accuracy": 0.9,
              "grad_norm": 1.0, "steps": 10, "loss_tokens": 100.0}]
  merged = whole_intervals(records, 25)
  assert [(r["step"], r["steps"]) for r in merged] == [(25, 25), (50, 25), (60, 10)]
  assert merged[1]["loss"] == pytest.approx((240 * 2.0 + 10 * 4.0) / 250)
  assert merged[1]["accuracy"] == pytest.approx((240 * 0.5 + 10 * 0.1) / 250)
  assert merged[1]["grad_norm"] == pytest.approx((24 * 2.0 + 1 * 4.0) / 25)
  assert merged[1]["loss_tokens"] == 250.0
  assert merged[0] == records[0] and merged[2] == records[3]
  # A step logged twice (a resume from an earlier checkpoint) keeps its last record.
  again = whole_intervals(records[:2] + [dict(records[1], loss=9.0)] + records[2:], 25)
  assert again[1]["loss"] == pytest.approx((240 * 9.0 + 10 * 4.0) / 250)
