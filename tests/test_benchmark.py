"""The benchmark's bookkeeping (not its timings, which are never asserted)."""

import math

import pytest
from conftest import tiny_run_config

from transformer.benchmark import benchmark, benchmark_input, spread
from transformer.info import table_peak, training_flops_per_target_token
from transformer.model import ModelConfig


def test_benchmark_reports_consistent_figures(tmp_path):
  cfg = tiny_run_config(tmp_path)
  (tmp_path / "disk").mkdir()
  result = benchmark(cfg, batch_tokens=100, seq_len=8, steps=2, warmup=0, decode_batches=1,
                     peak_tflops=2.0, checkpoint_saves=2, checkpoint_dir=str(tmp_path / "disk"))
  assert result["rows"] == 12 and result["target_tokens_per_step"] == 96
  assert result["target_tokens_per_sec"] == pytest.approx(96 / result["step_sec_median"])
  flops = training_flops_per_target_token(
      ModelConfig.from_config(cfg.model, cfg.data.vocab_size), 8, 8) * 96
  assert result["analytic_tflops_per_sec"] == pytest.approx(flops / result["step_sec_median"] / 1e12)
  assert result["step_sec_min"] <= result["step_sec_median"] <= result["step_sec_max"]
  assert math.isfinite(result["loss"]) and result["backend"] == "cpu"
  assert result["flops_per_step"] == pytest.approx(flops)
  assert result["mfu"] == pytest.approx(result["analytic_tflops_per_sec"] / 2.0)
  assert result["floor_step_sec"] == pytest.approx(flops / 2e12)
  assert result["peak_source"] == "--peak_tflops"
  # beam search: the evaluation batch (decode.tokens_per_batch 4096 / 8 tokens), 8 + 5 output tokens
  assert result["decode_rows"] == 512 and result["decode_len"] == 13
  assert result["decode_mean_output_len"] == 13  # decoded to full length: EOS only at the limit
  assert result["decode_sentences_per_sec"] == pytest.approx(512 / result["decode_batch_sec_median"])
  assert result["peak_memory_bytes"] is None  # the CPU backend keeps no memory statistics
  # checkpoints: the state's arrays are on disk (parameters and two Adam moments, float32)
  assert result["checkpoint_saves"] == 2
  assert result["checkpoint_bytes"] > 3 * 4 * result["parameters"] * 0.5  # zstd: a little smaller
  assert 0 < result["checkpoint_blocking_sec_median"] <= result["checkpoint_write_sec_median"]
  assert list((tmp_path / "disk").iterdir()) == []  # the benchmark's checkpoints are removed


def test_the_peak_table_matches_device_kinds_by_longest_prefix():
  assert table_peak("NVIDIA H100 80GB HBM3") == 989.0
  assert table_peak("NVIDIA H100 PCIe") == 756.0
  assert table_peak("NVIDIA A100-SXM4-80GB") == 312.0
  assert table_peak("TPU v5 lite") == 197.0 and table_peak("TPU v5p") == 459.0
  assert table_peak("cpu") is None


def test_step_time_spread_against_numpy():
  times = [1.0, 2.0, 3.0, 4.0, 10.0]
  result = spread(times)
  assert result["median"] == 3.0 and result["min"] == 1.0 and result["max"] == 10.0
  assert result["p10"] == pytest.approx(1.4) and result["p90"] == pytest.approx(7.6)
  assert result["spread_pct"] == pytest.approx(100 * 6.2 / 3.0)


def test_input_pipeline_benchmark_counts_real_tokens(tmp_path):
  cfg = tiny_run_config(tmp_path)
  result = benchmark_input(cfg, batches=5)
  assert result["batches"] == 5 and result["mode"] == "bucket"
  assert 0 <= result["target_padding_fraction"] < 1
  assert result["target_tokens_per_sec"] * result["seconds"] > 5 * 100  # each batch holds real tokens
