"""Our training step against the Flax WMT example's, side by side in one process, same batch and shape.

    python -m experiments.analyses.versus_flax_wmt --flax_wmt_dir=PATH/flax/examples/wmt [--rows=64 --seq_len=32]

The peer is the Flax WMT example itself (google/flax, examples/wmt), imported from a checkout you
point at, not a copy: its `models.Transformer` and its `train.train_step` under `jax.pmap`, as its
`train_and_evaluate` runs them, with its Adam(W) on its rsqrt schedule. Its training loop needs
TensorFlow and clu only for the input pipeline and logging; this script stands in empty modules for
them, so nothing of theirs that runs here is replaced.

Both models get the config's shape (by default configs/multi30k.py: 2 + 2 layers, d_model 256, 4 heads,
d_ff 1024, dropout 0.1, no attention dropout, shared embeddings, vocabulary 8,000; docs/performance.md's
figures are at issue 18's 3 + 3 layers, `--config.model.num_layers=3`) and the same
random batch of `rows` x `seq_len` tokens without padding. Each takes its own defaults otherwise
(ours: `train.dropout_rng` from the config; theirs: JAX's default PRNG). The steps alternate in rounds,
so a busy machine slows both alike; the ratio of medians is the figure.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import time
import types
from pathlib import Path

import jax
import numpy as np
import optax
from absl import app, flags
from ml_collections import config_flags

from transformer import partitioning
from transformer.cli import run_program
from transformer.model.transformer import ModelConfig, Transformer
from transformer.training.step import dropout_key, jit_train_fns

FLAGS = flags.FLAGS

VOCAB = 8000


class _StandIn(types.ModuleType):
  """An empty module whose every attribute is another stand-in (their signatures name tf.data...)."""

  def __getattr__(self, name: str) -> _StandIn:
    return _StandIn(name)


def _import_flax_wmt(directory: Path):
  """The example's models and train modules, with empty stand-ins for what only its data pipeline
  and logging use (TensorFlow, clu, its input_pipeline)."""
  if not (directory / "train.py").is_file() or not (directory / "models.py").is_file():
    raise app.UsageError(f"--flax_wmt_dir={directory} has no train.py and models.py; point it at "
                         "examples/wmt of a google/flax checkout")
  import flax.training.checkpoints  # noqa: F401  (flax.io looks for TensorFlow: before the stand-in)
  for name in ("tensorflow", "clu", "clu.metric_writers", "clu.periodic_actions",
               "clu.deterministic_data", "input_pipeline"):
    sys.modules.setdefault(name, _StandIn(name))
  sys.path.insert(0, str(directory))
  return importlib.import_module("models"), importlib.import_module("train")


def our_step(cfg, tokens: np.ndarray):
  """Our jit-compiled step as training runs it; returns a callable advancing its state."""
  model = Transformer(ModelConfig.from_config(cfg.model, VOCAB))
  mesh = partitioning.make_mesh(cfg, VOCAB)
  fns = jit_train_fns(cfg, model, mesh)
  holder = {"state": fns.init(jax.random.key(0))}
  batch = partitioning.shard_batch({"src": tokens, "tgt": tokens[::-1].copy()}, mesh)
  rng = dropout_key(cfg)

  def step():
    holder["state"], sums = fns.step(holder["state"], batch, rng)
    return sums["loss"]
  return step


def their_step(cfg, tokens: np.ndarray):
  """The Flax WMT example's pmapped step on one device, configured to our model's shape."""
  models, their_train = _import_flax_wmt(Path(FLAGS.flax_wmt_dir))
  m = cfg.model
  config = models.TransformerConfig(
      vocab_size=VOCAB, output_vocab_size=VOCAB, share_embeddings=True, logits_via_embedding=True,
      emb_dim=m.d_model, num_heads=m.num_heads, num_layers=m.num_layers, qkv_dim=m.d_model,
      mlp_dim=m.d_ff, max_len=max(256, tokens.shape[1]), dropout_rate=m.dropout,
      attention_dropout_rate=m.attention_dropout, deterministic=False)
  schedule = their_train.create_learning_rate_schedule(learning_rate=0.002, warmup_steps=1000)
  params = jax.jit(models.Transformer(config.replace(deterministic=True)).init)(
      jax.random.key(0), tokens, tokens)["params"]
  state = their_train.TrainState.create(
      apply_fn=None, params=params, tx=optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9,
                                                   weight_decay=0.0), dynamic_scale=None)
  p_step = jax.pmap(functools.partial(their_train.train_step, config=config,
                                      learning_rate_fn=schedule,
                                      label_smoothing=cfg.train.label_smoothing),
                    axis_name="batch", donate_argnums=(0,))
  holder = {"state": jax.tree.map(lambda x: np.asarray(x)[None], state)}  # pmap: one device
  batch = {"inputs": tokens[None], "targets": tokens[::-1].copy()[None]}
  rngs = jax.random.split(jax.random.key(1), 1)

  def step():
    holder["state"], metrics = p_step(holder["state"], batch, dropout_rng=rngs)
    return metrics["loss"]
  return step


def main(argv: list[str]) -> None:
  if not FLAGS.flax_wmt_dir:
    raise app.UsageError("pass --flax_wmt_dir=PATH/flax/examples/wmt (a google/flax checkout)")
  cfg = FLAGS.config
  tokens = np.random.default_rng(0).integers(4, VOCAB, (FLAGS.rows, FLAGS.seq_len)).astype(np.int32)
  steps = {"ours": our_step(cfg, tokens), "flax_wmt": their_step(cfg, tokens)}
  times: dict[str, list[float]] = {name: [] for name in steps}
  for step in steps.values():  # compile and warm up
    for _ in range(2):
      jax.block_until_ready(step())
  for _ in range(FLAGS.rounds):
    for name, step in steps.items():
      for _ in range(FLAGS.steps_per_round):
        t = time.perf_counter()
        jax.block_until_ready(step())
        times[name].append(time.perf_counter() - t)
  median = {name: float(np.median(t)) for name, t in times.items()}
  tokens_per_step = FLAGS.rows * FLAGS.seq_len
  print(json.dumps({
      "rows": FLAGS.rows, "seq_len": FLAGS.seq_len,
      "step_sec_median": median,
      "target_tokens_per_sec": {k: tokens_per_step / v for k, v in median.items()},
      "speedup_ours_over_flax_wmt": median["flax_wmt"] / median["ours"],
      "spread_pct": {k: 100 * (np.percentile(t, 90) - np.percentile(t, 10)) / np.median(t)
                     for k, t in times.items()}}, indent=1))


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  config_flags.DEFINE_config_file("config", "configs/multi30k.py", "Our config: the model's shape "
                                  "and recipe.")
  flags.DEFINE_string("flax_wmt_dir", None, "A checkout's examples/wmt directory (google/flax).")
  flags.DEFINE_integer("rows", 64, "Sentences per batch.")
  flags.DEFINE_integer("seq_len", 32, "Tokens per sentence (source and target).")
  flags.DEFINE_integer("rounds", 5, "Alternating rounds of timed steps.")
  flags.DEFINE_integer("steps_per_round", 4, "Timed steps of each per round.")
  run_program("experiments.analyses.versus_flax_wmt", main)


if __name__ == "__main__":
  run()
