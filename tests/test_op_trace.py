"""transformer/accelerators/op_trace.py: trace events mapped to the JAX ops they were compiled from."""

import glob

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.accelerators.op_trace import op_times, traced_ops, xla_ops

HLO = """
ENTRY %main {
  %fusion.1 = f32[8]{0} fusion(%p0), kind=kLoop, metadata={op_name="jit(step)/jit(main)/Transformer/layers_3/mul"}
  ROOT %dot.2 = f32[8]{0} dot(%fusion.1, %p1), metadata={op_name="jit(step)/Transformer/layer_0/dot_general"}
}
"""


def event(name, dur, tid=1, **args):
  return {"ph": "X", "name": name, "tid": tid, "ts": 0, "dur": dur, "args": args}


def test_cpu_events_are_named_by_instruction_and_layers_merge():
  events = [event("fusion.1", 30), event("dot.2", 50), event("PjitFunction(step)", 90),
            {"ph": "i", "name": "fusion.1", "tid": 1, "ts": 0}]
  ops = xla_ops(events, HLO)
  assert [op["op"] for op in ops] == ["Transformer/layer_*/mul", "Transformer/layer_*/dot_general"]
  assert op_times(ops, 2) == {"Transformer/layer_*/mul": 0.015, "Transformer/layer_*/dot_general": 0.025}


def test_gpu_kernels_count_and_their_host_launches_do_not():
  events = [event("fusion.1", 3, tid=7), event("dot.2", 2, tid=7),   # the host's launches
            event("loop_multiply_fusion", 40, tid=100, hlo_op="fusion.1", hlo_module="jit_step"),
            event("sm90_xmma_gemm_f32f32", 60, tid=100, hlo_op="dot.2", hlo_module="jit_step")]
  per_op = op_times(xla_ops(events, HLO), 1)
  assert per_op == {"Transformer/layer_*/mul": 0.04, "Transformer/layer_*/dot_general": 0.06}


def test_kernels_of_a_cuda_graph_are_read_by_their_names():
  graph = {"hlo_op": "command_buffer_1", "hlo_module": "jit_step"}
  events = [event("fusion_1", 40, tid=100, **graph),                  # fusion.1's kernel
            event("nvjet_sm90_tst_128x128", 60, tid=100, **graph),    # a cuBLAS kernel
            event("copy_3", 5, tid=100, **graph),                     # an op without metadata
            event("fusion.1", 3, tid=7)]                              # a host launch
  per_op = op_times(xla_ops(events, HLO + "  %copy.3 = f32[8]{0} copy(%p0)\n"), 1)
  assert per_op == {"Transformer/layer_*/mul": 0.04, "library kernel: nvjet_sm90_tst_128x128": 0.06,
                    "copy.3": 0.005}


def test_a_real_trace_finds_the_product_and_keeps_the_trace(tmp_path):
  f = jax.jit(lambda a, b: jnp.tanh(a @ b))
  a = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32)
  hlo = f.lower(a, a).compile().as_text()
  ops = traced_ops(lambda: jax.block_until_ready(f(a, a)), hlo, keep_dir=str(tmp_path))
  assert any("dot_general" in op["op"] for op in ops), [op["op"] for op in ops]
  assert glob.glob(f"{tmp_path}/**/*.trace.json.gz", recursive=True)


SECOND = """
ENTRY %main {
  ROOT %fusion.1 = f32[8]{0} fusion(%p0), kind=kLoop, metadata={op_name="jit(step)/Transformer/encoder/exp"}
}
"""


def test_several_programs_each_event_is_read_against_the_program_that_ran_it():
  # Both programs have a `fusion.1`; runs 'b' (started first) and 'a' executed programs 1 and 0.
  events = [event("fusion.1", 30, run_id="a", hlo_op="fusion.1") | {"ts": 100},
            event("fusion.1", 20, run_id="b", hlo_op="fusion.1") | {"ts": 10},
            event("dot.2", 50, run_id="a", hlo_op="dot.2") | {"ts": 140}]
  per_op = op_times(xla_ops(events, [HLO, SECOND], calls=[1, 0]), 1)
  assert per_op == {"Transformer/layer_*/mul": 0.03, "Transformer/encoder/exp": 0.02,
                    "Transformer/layer_*/dot_general": 0.05}


def test_several_programs_need_the_calls_that_ran_them():
  events = [event("fusion.1", 30, run_id="a", hlo_op="fusion.1")]
  with pytest.raises(ValueError, match="1 executions but 2 calls"):
    xla_ops(events, [HLO, SECOND], calls=[0, 1])


def test_a_real_trace_of_two_programs_attributes_each_op_to_its_own(tmp_path):
  products = jax.jit(lambda a: jnp.tanh(a @ a))
  sums = jax.jit(lambda a: jnp.sin(a).sum(0))
  a = jnp.ones((64, 64), jnp.float32)
  compiled = [products.lower(a).compile(), sums.lower(a).compile()]
  calls: list[int] = []

  def run():
    for i in (1, 0, 1):
      calls.append(i)
      jax.block_until_ready(compiled[i](a))
  ops = traced_ops(run, [c.as_text() for c in compiled], calls=calls)
  # XLA names both programs' main fusion `ynn_fusion`: read against one program's names, all three
  # would be the product's or all three the sum's.
  count = lambda part: sum(part in op["op"] for op in ops)
  assert (count("dot_general"), count("reduce_sum")) == (1, 2), [op["op"] for op in ops]


def test_a_fusion_of_products_and_layer_norm_is_named_by_its_products():
  hlo = """
%fused_computation.7 (param_0: f32[8,4], param_1: f32[4,4]) -> f32[8] {
  %dot.1 = f32[8,4]{1,0} dot(%param_0, %param_1), metadata={op_name="jit(f)/jit(g)/layer_0/ffn/wi/dot_general"}
  %dot.2 = f32[8,4]{1,0} dot(%dot.1, %param_1), metadata={op_name="jit(f)/jit(g)/layer_0/ffn/wo/dot_general"}
  ROOT %reduce.3 = f32[8]{0} reduce(%dot.2, %c), dimensions={1}, metadata={op_name="jit(f)/layer_0/ffn_norm/reduce_sum"}
}

ENTRY %main {
  ROOT %ynn_fusion.7 = f32[8]{0} fusion(%p0), calls=%fused_computation.7, metadata={op_name="f/layer_0/ffn_norm/x"}
}
"""
  ops = xla_ops([event("ynn_fusion.7", 10)], hlo)
  assert [op["op"] for op in ops] == ["layer_*/ffn/wi/dot_general + layer_*/ffn/wo/dot_general"]


def test_the_step_profile_finds_the_vocabulary_projection_by_scope_or_by_its_einsums():
  from experiments.analyses.step_profile import category
  vocabulary = "matmul: output projection (vocabulary)"
  assert category("transpose(jvp(Transformer))/Transformer.decode/decoder/btv,vd->btd/dot_general") == vocabulary
  assert category("Transformer.decode/decoder/output_logits/btd,vd->btv/dot_general") == vocabulary
  assert category("Transformer.decode/decoder/layer_*/ffn/wi/dot_general") == "matmul: layers"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  """A tiny run trained for 2 steps, with 12 validation sentences."""
  from helpers import tiny_run_config

  from transformer.training.train import train_and_evaluate
  tmp_path = tmp_path_factory.mktemp("trained")
  cfg = tiny_run_config(tmp_path, eval_lines=12)
  cfg.train.steps, cfg.train.eval_every, cfg.train.checkpoint_every = 2, 2, 2
  train_and_evaluate(cfg, str(tmp_path / "run"))
  return tmp_path / "run"


@pytest.mark.slow
def test_the_decoding_profile_of_a_trained_run_translates_its_validation_set(trained_run):
  from helpers import run_cli
  done = run_cli("experiments.analyses.decode_profile", f"--workdir={trained_run}",
                 "--beam_size=2", "--top=3")
  assert done.returncode == 0, done.stderr
  assert f"validation sentences of {trained_run} (stopping at EOS), beam 2: 12 sentences in" in done.stdout
  shares = [int(line.rsplit("|", 2)[1].strip(" %")) for line in done.stdout.splitlines()
            if line.startswith("| ") and line.endswith("% |")]
  assert "| matmul: layers |" in done.stdout and 97 <= sum(shares) <= 103  # rounded shares


def test_decode_timing_prints_a_rate_per_repeat_and_the_hash_of_the_translations(trained_run):
  import hashlib

  from helpers import run_cli

  from transformer.data import sources
  from transformer.decoding import translator
  from transformer.training import workdir as runs
  done = run_cli("experiments.analyses.decode_timing", f"--workdir={trained_run}", "--beam_size=2",
                 "--repeats=2", "--cpu_devices=1")
  assert done.returncode == 0, done.stderr
  run = runs.load_run(trained_run)
  sentences = list(sources.load_split(run.config.data, run.config.data.eval_split).source)
  settings = translator.SearchSettings.from_config(run.config, beam_size=2)
  hypotheses = translator.translate(run.model, run.params(True), run.vocab, sentences, settings,
                                    run.config.data.max_len).hypotheses
  digest = hashlib.sha256("\n".join(hypotheses).encode()).hexdigest()[:12]
  rates, _, printed = done.stdout.strip().splitlines()[-1].partition(" sentences/s; translations ")
  assert printed == digest
  assert len(rates.split(" / ")) == 2 and all(float(r) > 0 for r in rates.split(" / "))
