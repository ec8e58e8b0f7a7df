"""The benchmark's bookkeeping (not its timings, which are never asserted)."""

import math

import pytest
from conftest import tiny_run_config

from transformer.benchmark import benchmark, benchmark_input
from transformer.info import training_flops_per_target_token
from transformer.model import ModelConfig


def test_benchmark_reports_consistent_figures(tmp_path):
  cfg = tiny_run_config(tmp_path)
  result = benchmark(cfg, batch_tokens=100, seq_len=8, steps=2, warmup=0)
  assert result["rows"] == 12 and result["target_tokens_per_step"] == 96
  assert result["target_tokens_per_sec"] == pytest.approx(96 / result["step_sec_median"])
  flops = training_flops_per_target_token(
      ModelConfig.from_config(cfg.model, cfg.data.vocab_size), 8, 8) * 96
  assert result["analytic_tflops_per_sec"] == pytest.approx(flops / result["step_sec_median"] / 1e12)
  assert result["step_sec_min"] <= result["step_sec_median"] <= result["step_sec_max"]
  assert math.isfinite(result["loss"]) and result["backend"] == "cpu"


def test_input_pipeline_benchmark_counts_real_tokens(tmp_path):
  cfg = tiny_run_config(tmp_path)
  result = benchmark_input(cfg, batches=5)
  assert result["batches"] == 5 and result["mode"] == "bucket"
  assert 0 <= result["target_padding_fraction"] < 1
  assert result["target_tokens_per_sec"] * result["seconds"] > 5 * 100  # each batch holds real tokens
