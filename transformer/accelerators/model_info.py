"""A config's model at a glance, before anything is trained: parameters per module and training
FLOPs per target token.

    transformer-info --config=configs/wmt14_ende.py:base
    transformer-info --config=configs/wmt14_ende.py:big --seq_len=30

Parameters per module (checked against the analytic formula and the paper's Table 3) and training
FLOPs per target token, from shapes only: the big model is summarised in a second on a laptop.
"""

from __future__ import annotations

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from transformer.cli import run_program
from transformer.config import validate
from transformer.model.size import (
  PAPER_PARAMS,
  analytic_param_count,
  param_counts,
  training_flops_per_target_token,
)
from transformer.model.transformer import ModelConfig

FLAGS = flags.FLAGS


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
