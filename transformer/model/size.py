"""The model's size: parameters per module, the analytic count, and training FLOPs per target token
(the numerator of MFU; hardware.PEAK_TFLOPS is its denominator).

Shapes only (jax.eval_shape): nothing is allocated, so even the big model is counted instantly.
"""

from __future__ import annotations

import collections

import jax

from transformer.model import positions
from transformer.model.transformer import ModelConfig, Transformer, initial_params

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
  total += positions.get(config.positional).param_count(config)
  return total


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
  softmax are negligible and left out, and so are the positional encoding's own products unless it
  declares them (relative keys and values). Source tokens per target token = src_len / tgt_len.
  """
  d, f, v = config.d_model, config.d_ff, config.vocab_size
  hk, hv = config.num_heads * config.key_dim, config.num_heads * config.value_dim
  projections = 2 * d * hk + 2 * d * hv  # query, key, value, output (d * hk = d * d by default)
  per_src = (config.num_layers * (2 * (projections + 2 * d * f) + 2 * src_len * (hk + hv))  # encoder
             + config.num_decoder_layers * 2 * (d * hk + d * hv))  # decoder's cross keys, values
  per_tgt = config.num_decoder_layers * (2 * (projections + d * hk + hv * d + 2 * d * f)  # self,
                                         + 2 * (tgt_len + src_len) * (hk + hv)) + 2 * v * d  # cross
  positional = positions.get(config.positional).flops_per_target_token(config, src_len, tgt_len)
  return 3.0 * (per_tgt + per_src * src_len / tgt_len + positional)
