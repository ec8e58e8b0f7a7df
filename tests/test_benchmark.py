"""The benchmark's bookkeeping (not its timings, which are never asserted)."""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_cli, tiny_run_config

from transformer.accelerators import benchmark as benchmark_lib
from transformer.accelerators.benchmark import benchmark, spread
from transformer.accelerators.decode_benchmark import decode_workload
from transformer.accelerators.loader_benchmark import benchmark_input
from transformer.data.pipeline import training_inputs
from transformer.hardware import table_peak
from transformer.model.size import training_flops_per_target_token
from transformer.model.transformer import EOS_ID, ModelConfig


@pytest.mark.slow
def test_benchmark_reports_consistent_figures(tmp_path):
  cfg = tiny_run_config(tmp_path)
  (tmp_path / "disk").mkdir()
  result = benchmark(cfg, batch_tokens=100, seq_len=8, steps=2, warmup=0, decode_sentences=6,
                     peak_tflops=2.0, checkpoint_saves=2, checkpoint_dir=str(tmp_path / "disk"),
                     real_batches=4, reference_sentences=3)
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
  # decoding: the first 6 validation sentences, each to its reference's length, greedy and beam 4
  assert result["decode_sentences"] == 6 and result["decode_data"].endswith(
      "first 6 sentences, reference lengths")
  for beam in (1, 4):
    tokens = result[f"decode_beam{beam}_target_tokens_per_sec"] * result[f"decode_beam{beam}_sec"]
    assert tokens == pytest.approx(6 * result["decode_mean_output_len"])
    assert result[f"decode_beam{beam}_sentences_per_sec"] == pytest.approx(
        6 / result[f"decode_beam{beam}_sec"])
  # --reference: three of the beam search's hypotheses are the plain reference search's
  assert result["reference_sentences"] == 3 and result["reference_same_hypotheses"] == 3
  assert result["reference_max_score_difference"] < 1e-5
  # the config's own batches: the first 4 the training pipeline makes, their real target tokens
  (tmp_path / "data").mkdir()
  _, train_pipeline, _ = training_inputs(cfg, tmp_path / "data", num_devices=1)
  stream = train_pipeline.batches()
  batches = [next(stream)[0] for _ in range(4)]
  stream.close()
  real = sum(int((b["tgt"] != 0).sum()) for b in batches)
  assert result["real_batches"] == 4
  assert result["real_batch_shapes"] == len({b["tgt"].shape for b in batches})
  assert result["real_target_tokens_per_sec"] * 4 * result["real_step_sec_mean"] == pytest.approx(real)
  assert result["real_target_padding_fraction"] == pytest.approx(
      1 - real / sum(b["tgt"].size for b in batches))
  assert result["peak_memory_bytes"] is None  # the CPU backend keeps no memory statistics
  # checkpoints: the state's arrays are on disk (parameters and two Adam moments, float32)
  assert result["checkpoint_saves"] == 2
  assert result["checkpoint_bytes"] > 3 * 4 * result["parameters"] * 0.5  # zstd: a little smaller
  assert 0 < result["checkpoint_blocking_sec_median"] <= result["checkpoint_write_sec_median"]
  assert list((tmp_path / "disk").iterdir()) == []  # the benchmark's checkpoints are removed


def test_decoding_work_is_synthetic_where_the_data_is_missing(tmp_path):
  cfg = tiny_run_config(tmp_path)
  cfg.data.eval_src = str(tmp_path / "missing.en")
  src, lengths, origin = decode_workload(cfg, 300, 50, seq_len=8)
  assert origin.startswith("synthetic: 50 sentences") and len(src) == len(lengths) == 50
  assert all(4 <= n <= 12 and len(s) == n and s[-1] == EOS_ID for s, n in zip(src, lengths))
  assert (src, lengths) == decode_workload(cfg, 300, 50, seq_len=8)[:2]  # the same work every run


def test_the_peak_table_matches_device_kinds_by_longest_prefix():
  assert table_peak("NVIDIA H100 80GB HBM3") == 989.0
  assert table_peak("NVIDIA H100 PCIe") == 756.0
  assert table_peak("NVIDIA A100-SXM4-80GB") == 312.0
  assert table_peak("TPU v5 lite") == 197.0 and table_peak("TPU v5p") == 459.0
  assert table_peak("cpu") is None


@pytest.mark.parametrize("backend, size, launches", [("cpu", 4096, 1), ("gpu", 8192, 20)])
def test_measured_peak_counts_every_queued_product(monkeypatch, backend, size, launches):
  """On an accelerator one timing covers 20 queued 8192-wide products (one alone times the launch);
  on a CPU one 4096-wide product. Timings replaced by 0.5 s: TFLOP/s = 2 n^3 products / 0.5 s."""
  calls = []
  def fake_timed(run, repeats):
    calls.append(repeats)
    return [0.5] * repeats
  monkeypatch.setattr(benchmark_lib.jax, "default_backend", lambda: backend)
  monkeypatch.setattr(benchmark_lib.jax.random, "normal", lambda key, shape, dtype: jnp.zeros((1, 1)))
  monkeypatch.setattr(benchmark_lib, "timed", fake_timed)
  tflops = benchmark_lib.measure_peak_tflops(jnp.bfloat16)
  assert tflops == pytest.approx(2 * size ** 3 * launches / 0.5 / 1e12)
  assert calls == [1, 10 if backend == "cpu" else 5]  # warm-up, then the timed repeats


def test_step_time_spread_against_numpy():
  times = [1.0, 2.0, 3.0, 4.0, 10.0]
  result = spread(times)
  assert result["median"] == 3.0 and result["min"] == 1.0 and result["max"] == 10.0
  assert result["p10"] == pytest.approx(1.4) and result["p90"] == pytest.approx(7.6)
  assert result["spread_pct"] == pytest.approx(100 * 6.2 / 3.0)


def test_input_pipeline_benchmark_counts_real_tokens(tmp_path):
  cfg = tiny_run_config(tmp_path)
  result = benchmark_input(cfg, batches=5, workers=[0], stub_step_ms=[1.0], stub_steps=4)
  assert result["mode"] == "bucket" and result["pairs"] + sum(result["dropped"].values()) == 300
  run = result["throughput"][0]
  assert run["batches"] == 5 and 0 <= run["target_padding_fraction"] < 1
  assert run["real_target_tokens_per_batch"]["min"] > 0  # each batch holds real tokens
  assert run["target_tokens_per_sec"] * run["seconds"] == pytest.approx(
      5 * run["real_target_tokens_per_batch"]["mean"])
  assert 0 <= result["stub_training"][0]["steps_waiting_share"] <= 1


def test_shapes_and_their_mix_against_a_hand_computation():
  """Two timed shapes (rows of 8 and 16 tokens) and five pairs: the mix pads each pair to the
  shortest shape that holds it and counts each shape's steps from its padded positions."""
  shapes = [{"seq_len": 8, "target_tokens_per_step": 64, "step_sec_median": 0.5,
             "flops_per_step": 1e12},
            {"seq_len": 16, "target_tokens_per_step": 64, "step_sec_median": 1.0,
             "flops_per_step": 3e12}]
  lengths = np.array([[5, 6], [8, 3], [9, 12], [16, 16], [20, 4]])  # the last fits no shape
  mix = benchmark_lib.mix_figures(shapes, lengths, peak=2.0, devices=2)
  # shape 8: pairs 0, 1 -> 16 positions = 0.25 steps, 0.125 s; shape 16: pairs 2, 3 -> 32 = 0.5
  # steps, 0.5 s; real target tokens 6 + 3 + 12 + 16 = 37
  assert mix["pairs_longer_than_every_shape"] == 1
  assert mix["real_target_tokens_per_sec"] == pytest.approx(37 / 0.625)
  assert mix["target_positions_real"] == pytest.approx(37 / 48)
  assert mix["mfu"] == pytest.approx((0.25 * 1e12 + 0.5 * 3e12) / 0.625 / 4e12)
  assert [s["time_share"] for s in mix["per_shape"]] == pytest.approx([0.2, 0.8])
  assert [s["pair_share"] for s in mix["per_shape"]] == pytest.approx([0.4, 0.4])


def test_shape_lists_and_length_histograms(tmp_path):
  cfg = tiny_run_config(tmp_path)
  assert benchmark_lib.shape_lengths(cfg, "16,8,16") == [8, 16]
  assert benchmark_lib.shape_lengths(cfg, "buckets")[-1] == cfg.data.max_len
  assert benchmark_lib.shape_lengths(cfg, "packed") == [cfg.data.pack_length]
  with pytest.raises(Exception, match="--shapes takes 'buckets', 'packed' or row lengths"):
    benchmark_lib.shape_lengths(cfg, "wmt")
  (tmp_path / "hist.json").write_text(json.dumps({"lengths": [[3, 4, 2], [7, 5, 1]]}))
  np.testing.assert_array_equal(benchmark_lib.length_mix(str(tmp_path / "hist.json")),
                                [[3, 4], [3, 4], [7, 5]])
  with pytest.raises(Exception, match="neither a token cache directory"):
    benchmark_lib.length_mix(str(tmp_path / "missing.json"))


@pytest.mark.slow
def test_benchmark_times_each_shape(tmp_path):
  cfg = tiny_run_config(tmp_path)
  result = benchmark(cfg, batch_tokens=96, seq_len=8, steps=1, warmup=0, peak_tflops=2.0,
                     shapes=[8, 16], mix=np.array([[5, 6], [12, 9]]))
  assert [(s["seq_len"], s["rows"]) for s in result["shapes"]] == [(8, 12), (16, 6)]
  for s in result["shapes"]:
    assert s["target_tokens_per_sec"] == pytest.approx(s["target_tokens_per_step"] / s["step_sec_median"])
  assert result["mix"]["pairs"] == 2 and result["mix"]["target_positions_real"] == pytest.approx(15 / 24)


def test_a_token_cache_of_another_vocabulary_is_refused_before_timing(tmp_path):
  from transformer.data import token_cache as cache_lib
  from transformer.data.sources import DataError
  cfg = tiny_run_config(tmp_path)
  synthetic = cache_lib.write_synthetic(tmp_path / "synthetic", 500, vocab_size=cfg.data.vocab_size + 1)
  with pytest.raises(DataError, match=r"built for a vocabulary of 301 pieces and max_len 256, the "
                                      r"config has 300 and 40"):
    benchmark_input(cfg, 2, [0], [1.0], 2, token_cache=str(synthetic.directory))
  (tmp_path / "run").mkdir()
  training_inputs(cfg, tmp_path / "run", num_devices=1)  # the config's own vocabulary and caches
  cfg.data.max_len = 256
  own = cache_lib.from_pairs(tmp_path / "pairs", [[5, 6]] * 30, [[7]] * 30, vocab_size=300)
  meta = json.loads((own.directory / "meta.json").read_text())
  meta["filters"]["max_len"] = 256
  (own.directory / "meta.json").write_text(json.dumps(meta))
  with pytest.raises(DataError, match="built from other data, another vocabulary or other filters"):
    benchmark_input(cfg, 2, [0], [1.0], 2, token_cache=str(own.directory))


@pytest.mark.slow
def test_the_loop_benchmark_trains_what_the_step_alone_trains(tmp_path):
  """The loop's final parameters equal the step alone's over the same batches from the same start
  (benchmark_loop checks it bit for bit and says so), and both speeds are positive."""
  from transformer.accelerators.loop_benchmark import benchmark_loop
  cfg = tiny_run_config(tmp_path)
  cfg.train.log_every = 2
  result = benchmark_loop(cfg, steps=4)
  assert result["loop_params_equal_step_alone"] and result["loop_steps"] == 4
  assert len(result["loop_interval_tokens_per_sec"]) == 2
  assert result["loop_target_tokens_per_sec"] > 0 and result["step_target_tokens_per_sec"] > 0
  assert math.isclose(result["loop_over_step"], result["loop_target_tokens_per_sec"]
                      / result["step_target_tokens_per_sec"])


@pytest.mark.parametrize("flag, message", [
    ("--loop=-5", "flag --loop=-5: -5 is not a non-negative integer"),
    ("--steps=0", "flag --steps=0: 0 is not a positive integer"),
    ("--batches=-3", "flag --batches=-3: -3 is not a positive integer"),
])
def test_counts_below_their_floor_are_refused_before_anything_runs(tmp_path, flag, message):
  output = tmp_path / "report.json"
  done = run_cli("transformer.accelerators.benchmark", "--config=configs/multi30k.py", flag,
                 f"--output={output}")
  assert done.returncode == 2
  assert message in done.stderr and "Traceback" not in done.stderr
  assert not output.exists()
