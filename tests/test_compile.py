"""transformer-compile: the real train step compiled for a 4-chip TPU v5e slice (libtpu, no TPU) under
each sharding strategy, checked against what the strategy must do; the HLO reader against programs
whose FLOPs and collectives are known by hand; the fit check and its advice."""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.accelerators import compile as compile_lib
from transformer.accelerators import compile_report, hlo, roofline, topologies
from transformer.config import base_config

libtpu = pytest.importorskip("libtpu", reason="the TPU compiler: pip install -e '.[tpu]'")
V5E_4 = topologies.lookup("v5e-4")
STRATEGIES = {"data": (4, 1, 1), "fsdp": (1, 4, 1), "tensor": (1, 1, 4)}


def tiny_config(mesh=(4, 1, 1)):
  c = base_config()
  c.model.update(num_layers=1, d_model=128, d_ff=256, num_heads=4, dtype="bfloat16")
  c.data.update(vocab_size=512, tokens_per_batch=512, max_len=32)
  c.decode.tokens_per_batch = 256
  return compile_lib.with_mesh_shape(c, mesh)


@pytest.fixture(scope="module")
def devices():
  return topologies.devices(V5E_4)


@pytest.fixture(scope="module")
def reports(devices):
  """The train step under each strategy (compiled once for the module: ~6 s each)."""
  return {name: compile_lib.check(tiny_config(shape), V5E_4, devices, 16, ("train",))
          for name, shape in STRATEGIES.items()}


def test_topology_names_map_to_libtpu_slices(devices):
  assert len(devices) == 4 and devices[0].device_kind == "TPU v5 lite"
  v5p = topologies.lookup("v5p-32")  # v5p names count TensorCores: 16 chips
  assert (v5p.jax_name, v5p.chips) == ("v5p:2x2x4", 16)
  assert len(topologies.devices(v5p)) == 16
  with pytest.raises(topologies.TopologyError, match="unknown --topology='v9-8'; known: v4-8"):
    topologies.lookup("v9-8")


def test_compiled_flops_match_the_analytic_count(reports):
  """Matmul FLOPs read from the compiled program equal model/size.py's formula (per device) under every
  strategy: the partitioner neither drops nor duplicates matmul work."""
  for report in reports.values():
    train = report["programs"]["train"]
    assert train["matmul_flops"] == pytest.approx(train["analytic_flops"], rel=0.02)


def test_data_parallelism_replicates_parameters_and_all_reduces_gradients(reports):
  train = reports["data"]["programs"]["train"]
  assert set(train["collectives"]) == {"all-reduce"}  # no parameter is gathered or scattered
  # every gradient is all-reduced once (a ring sends 2 x 3/4 of the buffer): in float32, or in
  # bfloat16 where the matmul that makes it computes in bfloat16
  ring_f32 = 2 * 3 / 4 * train["memory"]["params"]
  assert ring_f32 / 2 <= train["collectives"]["all-reduce"]["bytes"] <= ring_f32 * 1.01


def test_fsdp_gathers_weights_and_shards_the_state(reports):
  data = reports["data"]["programs"]["train"]["memory"]
  fsdp = reports["fsdp"]["programs"]["train"]
  assert fsdp["collectives"]["all-gather"]["count"] >= 12  # every weight matrix, where used
  assert fsdp["memory"]["params"] == pytest.approx(data["params"] / 4, rel=0.05)
  assert fsdp["memory"]["optimizer"] == pytest.approx(data["optimizer"] / 4, rel=0.05)


@pytest.mark.slow  # several compiles; pytest -m slow
def test_memory_per_device_falls_as_fsdp_grows(devices):
  state = []
  for fsdp in (1, 2, 4):
    report = compile_lib.check(tiny_config((4 // fsdp, fsdp, 1)), V5E_4, devices, 16, ("train",))
    memory = report["programs"]["train"]["memory"]
    state.append(memory["params"] + memory["optimizer"])
  assert state[0] > 1.9 * state[1] > 3.8 * state[2] * 0.99


def test_tensor_parallelism_splits_heads_and_reduces_activations(reports):
  tensor = reports["tensor"]["programs"]["train"]
  data = reports["data"]["programs"]["train"]
  assert reports["tensor"]["mesh"] == {"data": 1, "fsdp": 1, "tensor": 4}
  # heads, d_ff and the vocabulary split 4 ways; only LayerNorms and biases over d_model are whole
  assert tensor["memory"]["params"] < data["memory"]["params"] / 3
  # Megatron: each layer's attention and FFN outputs are partial sums, all-reduced forward and
  # backward, so there are many more all-reduces than data parallelism's gradient reduction
  assert tensor["collectives"]["all-reduce"]["count"] > 2 * data["collectives"]["all-reduce"]["count"]


def test_no_jax_plugins_namespace_means_no_cuda_compiler(monkeypatch):
  """find_spec raises when the parent package is missing (a JAX without any plugin)."""
  import importlib.util

  def missing_parent(name, package=None):
    raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
  monkeypatch.setattr(importlib.util, "find_spec", missing_parent)
  assert topologies.cuda_compiler_installed() is False


@pytest.mark.skipif(not topologies.cuda_compiler_installed(),
                    reason="the CUDA compiler plugin: see docs/accelerators.md")
def test_gpu_cluster_compiles_without_a_gpu():
  gpus = topologies.lookup("8xH100")
  devices = topologies.devices(gpus)
  assert len(devices) == 8 and devices[0].device_kind == "NVIDIA H100 80GB HBM3"
  report = compile_lib.check(tiny_config((8, 1, 1)), gpus, devices, 16, ("train",))
  train = report["programs"]["train"]
  assert train["xla_cost_analysis"]["flops"] is None  # GPU executables report none: ours counts
  assert train["matmul_flops"] == pytest.approx(train["analytic_flops"], rel=0.02)
  assert report["attention"] == "xla"


def test_roofline_terms_follow_from_the_chip(reports):
  report = reports["data"]
  train, chip = report["programs"]["train"], report["chip"]
  b = train["bound"]
  assert b["compute_s"] == pytest.approx(train["matmul_flops"] / (chip["peak_tflops"] * 1e12))
  assert b["memory_s"] == pytest.approx(train["hbm_bytes"] / (chip["hbm_gbps"] * 1e9))
  assert b["step_s"] == max(b["compute_s"], b["memory_s"], b["interconnect_s"])
  assert b["tokens_per_s"] == pytest.approx(report["batch"]["target_tokens"] / b["step_s"])


def test_a_config_that_does_not_fit_names_the_remedies(devices):
  cfg = tiny_config()
  report = compile_lib.check(cfg, V5E_4, devices, 16, ("train",))
  train = report["programs"]["train"]
  assert train["fits"]
  memory = train["memory"]
  # a chip with room for the state and half the temporaries: accumulation over 2 micro-batches
  report["chip"]["hbm_gib"] = (memory["peak"] - memory["temp"] / 2) / topologies.GIB
  train["fits"] = False
  advice = compile_report.fit_advice(report, cfg)
  assert advice.startswith("train: needs ") and "MiB per device, the chip has" in advice
  assert "grad_accum_steps=2 " in advice and "remat=full" in advice
  assert "fsdp" in advice  # the tiny model's state is most of its memory
  # no room even for the state: accumulation cannot help, sharding the state can
  report["chip"]["hbm_gib"] = (memory["peak"] - memory["temp"]) / 2 / topologies.GIB
  advice = compile_report.fit_advice(report, cfg)
  assert "grad_accum_steps" not in advice and "--config.mesh.fsdp=-1" in advice


def test_mesh_candidates_respect_divisibility():
  cfg = tiny_config()
  cfg.model.num_heads = 2  # tensor 4 and 8 cannot split 2 heads
  shapes = compile_lib.mesh_candidates(cfg, 8, 8)
  assert (8, 1, 1) in shapes and (1, 8, 1) in shapes and (4, 1, 2) in shapes
  assert all(t <= 2 for _, _, t in shapes)
  assert all(d * f * t == 8 for d, f, t in shapes)


@pytest.mark.slow  # several compiles; pytest -m slow
def test_command_line_report_and_json(tmp_path):
  out = tmp_path / "report.json"
  cmd = [sys.executable, "-m", "transformer.accelerators.compile", "--config=configs/multi30k.py",
         "--topology=v5e-4", "--programs=train", "--programs=beam", "--seq_len=16",
         "--config.model.num_layers=1", f"--output={out}"]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "train (compiled in" in result.stdout and "fits" in result.stdout
  assert "step >=" in result.stdout and "beam (compiled in" in result.stdout
  report = json.loads(out.read_text())
  assert set(report["programs"]) == {"train", "beam"}
  assert report["programs"]["beam"]["shape"]["beam_size"] == 4


def test_command_line_errors(tmp_path):
  base = [sys.executable, "-m", "transformer.accelerators.compile", "--config=configs/multi30k.py"]
  bad_topology = subprocess.run(base + ["--topology=v9-8"], capture_output=True, text=True)
  assert bad_topology.returncode == 2
  assert "transformer-compile: error: unknown --topology='v9-8'" in bad_topology.stderr
  bad_mesh = subprocess.run(base + ["--topology=v5e-4", "--mesh=2,2"], capture_output=True,
                            text=True)
  assert bad_mesh.returncode == 2 and "--mesh=2,2: give data,fsdp,tensor sizes" in bad_mesh.stderr
  too_big = subprocess.run(base + ["--topology=v5e-4", "--mesh=8,1,1"], capture_output=True,
                           text=True)
  assert too_big.returncode == 2 and "but there are 4 devices" in too_big.stderr
  long_rows = subprocess.run(base + ["--topology=v5e-4", "--seq_len=1000"], capture_output=True,
                             text=True)
  assert long_rows.returncode == 2
  assert "--seq_len must be between 1 and config.data.max_len (128)" in long_rows.stderr


# ------------------------------------------------------------------ the HLO reader, by hand counts

def _compiled_text(fn, *args):
  return jax.jit(fn).lower(*args).compile().as_text()


def test_loop_bodies_count_as_often_as_they_run():
  """XLA's own cost analysis counts a scan's body once; hlo.analyze counts it 10 times."""
  def f(a, b):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ b), None), a, None, length=10)[0]
  x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
  w = jax.ShapeDtypeStruct((128, 128), jnp.float32)
  stats = hlo.analyze(_compiled_text(f, x, w), 1)
  assert stats.matmul_flops == 10 * 2 * 64 * 128 * 128
  assert stats.loops == [10]
  # the heaviest kernel is the loop body's matmul, run 10 times: 10 x (x, w and the result)
  assert stats.top_kernels[0]["op"].endswith("dot_general")
  assert stats.top_kernels[0]["bytes"] == 10 * 4 * (64 * 128 + 128 * 128 + 64 * 128)


def test_tpu_batched_matmuls_written_as_convolutions_count_real_work(devices):
  """On TPU, XLA writes a batched matmul as a padded convolution: only real multiply-adds count."""
  mesh = Mesh(np.array(devices), ("x",))
  rows = NamedSharding(mesh, PartitionSpec("x"))
  q = jax.ShapeDtypeStruct((8, 4, 64, 32), jnp.bfloat16, sharding=rows)
  compiled = jax.jit(lambda a, b: jnp.einsum("bhqd,bhkd->bhqk", a, b)).lower(q, q).compile()
  stats = hlo.analyze(compiled.as_text(), 4)
  assert stats.matmul_flops == 2 * (8 // 4) * 4 * 64 * 64 * 32


def test_collective_bytes_follow_the_ring_algorithm(devices):
  mesh = Mesh(np.array(devices), ("x",))
  x = jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x")))
  gathered = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, PartitionSpec()))
  stats = hlo.analyze(gathered.lower(x).compile().as_text(), 4)
  assert stats.collectives["all-gather"]["bytes"] == pytest.approx(3 / 4 * 4096)
  summed = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))
  stats = hlo.analyze(summed.lower(x).compile().as_text(), 4)
  assert stats.collectives["all-reduce"]["count"] == 1


def test_roofline_names_the_binding_term():
  stats = hlo.ProgramStats(matmul_flops=1e12, hbm_bytes=1e9, kernels=10,
                           collectives={"all-reduce": {"count": 1, "bytes": 4e9,
                                                       "cross_host_bytes": 0.0}}, loops=[],
                           top_kernels=[])
  chip = topologies.Chip("x", peak_tflops=100.0, hbm_gib=16, hbm_gbps=1000.0, link_gbps=400.0,
                         cross_host_gbps=400.0)
  b = roofline.bound(stats, chip, 1e12, tokens_per_step=1000, steps=3600, state_bytes_per_device=0)
  assert (b.compute_s, b.memory_s, b.interconnect_s) == pytest.approx((0.01, 0.001, 0.02))
  assert b.binding == "interconnect" and b.step_s == pytest.approx(0.02)
  assert b.mfu == pytest.approx(0.5) and b.hours == pytest.approx(0.02)
  assert b.compute_bound_tokens == pytest.approx(2000)  # compute (10 us/token) reaches 20 ms


def test_compiler_refusal_becomes_advice():
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
             "temporaries (41.97G) exceeds available HBM (15.75G).")
  advice = compile_report.oom_advice("train", message, tiny_config())
  assert advice.startswith("train: the compiler says: Ran out of memory on HBM")
  assert "--config.train.grad_accum_steps=4 " in advice  # 41.97 / 15.75 = 2.7 -> 4 micro-batches
  beam = compile_report.oom_advice("beam", message, tiny_config())
  assert "--config.decode.tokens_per_batch=64" in beam  # 256 / 4


@pytest.mark.slow  # several compiles; pytest -m slow
def test_mesh_search_ranks_the_splits_that_fit(devices):
  ranked = compile_lib.search_mesh(tiny_config(), V5E_4, devices, 16)
  assert {r["mesh"] for r in ranked} == set(compile_lib.mesh_candidates(tiny_config(), 4, 4))
  steps = [r["bound"]["step_s"] for r in ranked]
  assert all(r["fits"] for r in ranked) and steps == sorted(steps)


@pytest.mark.slow  # several compiles; pytest -m slow
def test_max_batch_finds_a_budget_that_fits_and_twice_it_does_not(devices, monkeypatch):
  small = dataclasses.replace(topologies.CHIPS["v5e"], hbm_gib=0.02)  # 20 MiB chips
  monkeypatch.setitem(topologies.CHIPS, "v5e", small)
  result = compile_lib.max_batch(tiny_config(), V5E_4, devices, 16)
  assert result["peak_bytes"] <= 0.02 * topologies.GIB
  twice = tiny_config()
  twice.data.tokens_per_batch = 2 * result["tokens_per_batch"]
  report = compile_lib.check(twice, V5E_4, devices, 16, ("train",))
  assert not report["programs"]["train"]["fits"]
