"""Default run: a small Transformer on the bundled Multi30k En->De, tuned for a 2-core CPU.

    transformer-train --config=configs/multi30k.py --workdir=runs/m30k

Same architecture and recipe as the paper (post-LN, sinusoidal positions, shared embeddings, Adam with
the inverse-square-root schedule, label smoothing 0.1, beam 4 with alpha 0.6), scaled to a 29k-pair
corpus and at most 40 minutes of a 2-core CPU: 2+2 layers of width 256, a joint 8k BPE vocabulary,
small batches (many updates matter more than large batches on little data) and a short warm-up.
Two layers a side rather than three won the equal-CPU-time recipe sweep and its full-length check
(experiments/results/recipe_sweep/README.md): on 29k pairs, more updates beat more depth.
"""

from transformer.config import base_config


def get_config():
  c = base_config()
  c.model.num_layers = 2
  c.model.d_model = 256
  c.model.d_ff = 1024
  c.model.num_heads = 4
  c.model.dropout = 0.1
  c.model.max_len = 128

  c.data.source = "multi30k"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.eval_split = "validation"
  c.data.vocab_size = 8000
  c.data.max_len = 128
  c.data.tokens_per_batch = 2048

  c.train.steps = 4800
  c.train.warmup_steps = 800
  c.train.learning_rate = 1.0
  c.train.ema_decay = 0.999  # transformer-eval scores this moving average (and the raw parameters beside it)
  c.train.dropout_rng = "unsafe_rbg_threefry"  # cheapest dropout masks on CPU (train.dropout_key)
  c.train.log_every = 100
  c.train.eval_every = 500
  c.train.checkpoint_every = 250  # every ~3 minutes, all kept: BLEU against minutes for any run
  c.train.keep_checkpoints = 20
  return c
