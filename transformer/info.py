"""Model summary: parameters per module, the analytic count, training FLOPs per target token; and
the accelerators' peak FLOP/s that MFU (training's progress records, the benchmark) divides by.

    transformer-info --config=configs/wmt14_ende.py:base
    transformer-info --config=configs/wmt14_ende.py:big --seq_len=30

Shapes only (jax.eval_shape): nothing is allocated, so even the big model is summarised instantly.
"""

from __future__ import annotations

import collections

import jax
import ml_collections
from absl import app, flags
from ml_collections import config_flags

from transformer.cli import run_program
from transformer.config import validate
from transformer.model import ModelConfig, Transformer, initial_params

FLAGS = flags.FLAGS
# The paper's rounded counts (Table 3), keyed by (num_layers, d_model, d_ff, num_heads).
PAPER_PARAMS = {(6, 512, 2048, 8): "65M (paper, 'base')", (6, 1024, 4096, 16): "213M (paper, 'big')"}


def analytic_param_count(config: ModelConfig) -> int:
  """Parameters by the formula (biases in every projection, no output bias), for testing the model."""
  d, f, v = config.d_model, config.d_ff, config.vocab_size
  hk, hv = config.num_heads * config.key_dim, config.num_heads * config.value_dim
  attention = 2 * (d * hk + hk) + (d * hv + hv) + (hv * d + d)  # query, key; value; output
  ffn = d * f + f + f * d + d
  norm = 2 * d
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm
  embeddings = v * d if config.share_embeddings else 3 * v * d
  total = config.num_layers * encoder_layer + config.num_decoder_layers * decoder_layer + embeddings
  if config.norm == "pre":
    total += 2 * norm  # final LayerNorm of each stack
  if config.positional == "learned":
    total += 2 * config.max_len * d  # one table for the encoder, one for the decoder
  return total


# Dense bf16 peak TFLOP/s per JAX device (vendor data sheets, no sparsity). TPU v2/v3 devices are
# single cores (half a chip); later TPUs are whole chips. Matched as a prefix of device_kind.
PEAK_TFLOPS = {
    "NVIDIA H200": 989.0,
    "NVIDIA H100 80GB HBM3": 989.0,   # SXM
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA A100": 312.0,
    "NVIDIA L4": 121.0,
    "Tesla V100": 125.0,    # fp16 tensor cores: V100 has no bf16
    "Tesla P100": 21.2,     # fp16
    "TPU v2": 22.5,
    "TPU v3": 61.5,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,   # v5e
    "TPU v5": 459.0,        # v5p
    "TPU v6 lite": 918.0,   # v6e (Trillium)
}


def table_peak(device_kind: str) -> float | None:
  """The bf16 peak of `device_kind` from PEAK_TFLOPS (longest matching prefix), or None."""
  matches = [k for k in PEAK_TFLOPS if device_kind.startswith(k)]
  return PEAK_TFLOPS[max(matches, key=len)] if matches else None


def param_counts(config: ModelConfig) -> dict[str, int]:
  """Parameter count of every module path ('encoder', 'encoder/layer_0', ...), from shapes alone."""
  shapes = jax.eval_shape(lambda: initial_params(Transformer(config), jax.random.key(0)))
  counts: dict[str, int] = collections.defaultdict(int)
  for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
    names = [p.key for p in path][:-1]  # drop the parameter's own name (kernel, bias, ...)
    for depth in range(1, len(names) + 1):
      counts["/".join(names[:depth])] += leaf.size
  return dict(counts)


def training_flops_per_target_token(config: ModelConfig, src_len: int, tgt_len: int) -> float:
  """Analytic training FLOPs (forward + backward = 3x forward) per target token.

  Counts multiply-adds of every matmul (2 FLOPs each) including the attention scores and weighted
  sums over full (unmasked) lengths and the pre-softmax projection; embedding lookups, norms and
  softmax are negligible and left out. Source tokens per target token = src_len / tgt_len.
  """
  d, f, v = config.d_model, config.d_ff, config.vocab_size
  hk, hv = config.num_heads * config.key_dim, config.num_heads * config.value_dim
  projections = 2 * d * hk + 2 * d * hv  # query, key, value, output (d * hk = d * d by default)
  per_src = (config.num_layers * (2 * (projections + 2 * d * f) + 2 * src_len * (hk + hv))  # encoder
             + config.num_decoder_layers * 2 * (d * hk + d * hv))  # decoder's cross keys, values
  per_tgt = config.num_decoder_layers * (2 * (projections + d * hk + hv * d + 2 * d * f)  # self,
                                         + 2 * (tgt_len + src_len) * (hk + hv)) + 2 * v * d  # cross
  return 3.0 * (per_tgt + per_src * src_len / tgt_len)


def summary(cfg: ml_collections.ConfigDict, seq_len: int) -> str:
  validate(cfg)
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  counts = param_counts(config)
  total = sum(v for k, v in counts.items() if "/" not in k)
  lines = [f"{'module':<44}{'parameters':>14}"]
  for path in sorted(counts, key=lambda p: (p.split("/")[0] != "embed", p)):
    parts = path.split("/")
    # Every layer's total; the breakdown of the first layer of each stack only.
    if len(parts) > 3 or (len(parts) == 3 and parts[1] != "layer_0"):
      continue
    lines.append(f"{'  ' * (len(parts) - 1) + parts[-1]:<44}{counts[path]:>14,}")
  analytic = analytic_param_count(config)
  check = "matches" if analytic == total else "DOES NOT MATCH"
  lines.append(f"{'total':<44}{total:>14,}")
  lines.append(f"analytic formula: {analytic:,} ({check})")
  paper = (PAPER_PARAMS.get((config.num_layers, config.d_model, config.d_ff, config.num_heads))
           if config.num_decoder_layers == config.num_layers else None)
  if paper:
    lines.append(f"paper: {paper}; the paper rounds, and its Table 3 counts fit a vocabulary near "
                 f"41k (this config: {config.vocab_size})")
  flops = training_flops_per_target_token(config, seq_len, seq_len)
  lines.append(f"training FLOPs per target token: {flops / 1e9:.3f} GFLOP (source = target length = "
               f"{seq_len}; 6 x {flops / 6e9:.3f} G)")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  if FLAGS.config is None:
    raise app.UsageError("pass --config=configs/multi30k.py (or another config)")
  print(summary(FLAGS.config, FLAGS.seq_len))


def run() -> None:
  """Console-script entry point."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.")
  flags.DEFINE_integer("seq_len", 32, "Sentence length (tokens) assumed for attention FLOPs.")
  run_program("transformer-info", main)


if __name__ == "__main__":
  run()
