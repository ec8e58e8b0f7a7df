"""WMT14 English->German with the paper's hyper-parameters exactly (Vaswani et al., 2017, Table 3).

    transformer-train --config=configs/wmt14_ende.py:base --workdir=runs/base
    transformer-train --config=configs/wmt14_ende.py:big  --workdir=runs/big

base: N=6, d_model 512, d_ff 2048, 8 heads, dropout 0.1, 100k steps; big: d_model 1024, d_ff 4096,
16 heads, dropout 0.3, 300k steps. Shared BPE vocabulary of ~37000, Adam(0.9, 0.98, 1e-9), warm-up
4000, label smoothing 0.1, ~25k source + 25k target tokens per step, beam 4, alpha 0.6, newstest2013
for validation and newstest2014 for test. Activations in bfloat16 on accelerators (parameters, logits
and loss stay float32).
"""

from transformer.config import base_config

SIZES = {
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout=0.1, steps=100_000),
    "big": dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout=0.3, steps=300_000),
}


def get_config(size: str = "base"):
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r} for configs/wmt14_ende.py; use :base or :big")
  s = SIZES[size]
  c = base_config()
  c.model.num_layers = s["num_layers"]
  c.model.d_model = s["d_model"]
  c.model.d_ff = s["d_ff"]
  c.model.num_heads = s["num_heads"]
  c.model.dropout = s["dropout"]
  c.model.dtype = "bfloat16"

  c.data.source = "tfds"
  c.data.tfds_name = "wmt14_translate/de-en"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.train_split = "train"
  c.data.eval_split = "validation"  # newstest2013; 'test' is newstest2014
  c.data.vocab_size = 37000
  c.data.tokens_per_batch = 25000

  c.train.steps = s["steps"]
  c.train.warmup_steps = 4000
  c.train.label_smoothing = 0.1
  c.train.checkpoint_every = 1000
  c.train.keep_checkpoints = 20 if size == "big" else 5
  return c
