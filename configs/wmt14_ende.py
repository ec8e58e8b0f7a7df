"""WMT14 English->German with the paper's hyper-parameters exactly (Vaswani et al., 2017, Table 3).

    python -m transformer.training.prepare --config=configs/wmt14_ende.py   # once: data + vocabulary
    transformer-train --config=configs/wmt14_ende.py:base --workdir=runs/base
    transformer-train --config=configs/wmt14_ende.py:big  --workdir=runs/big

Data: TFDS wmt14_translate/de-en read English->German (TFDS's supervised keys say de->en; the config's
src_lang/tgt_lang decide): ~4.5M training pairs (Europarl v7, Common Crawl, News Commentary v9);
validation newstest2013 (3000), test newstest2014 (full, 3003; `transformer-eval --split=test`).
base: N=6, d_model 512, d_ff 2048, 8 heads, dropout 0.1, 100k steps; big: d_model 1024, d_ff 4096,
16 heads, dropout 0.3, 300k steps. Shared BPE vocabulary of 37000, Adam(0.9, 0.98, 1e-9), warm-up
4000, label smoothing 0.1, ~25k source + 25k target tokens per step, beam 4, alpha 0.6. Activations
in bfloat16 (parameters, logits and loss stay float32). One GPU follows the 25k-token step with
--config.train.grad_accum_steps=8 (see docs/data.md).
"""

from transformer.config import wmt_config


def get_config(size: str = "base"):
  return wmt_config(size, "wmt14_translate/de-en", "en", "de", vocab_size=37000,
                    config_file="configs/wmt14_ende.py")
