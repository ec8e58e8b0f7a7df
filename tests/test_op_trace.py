"""experiments.analyses.op_trace: trace events mapped to the JAX ops they were compiled from."""

import glob

import jax
import jax.numpy as jnp
import numpy as np

from experiments.analyses.op_trace import op_times, traced_ops, xla_ops

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
