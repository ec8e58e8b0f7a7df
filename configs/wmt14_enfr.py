"""WMT14 English->French with the paper's hyper-parameters (Vaswani et al., 2017, section 5.1, 6.1).

    python -m transformer.training.prepare --config=configs/wmt14_enfr.py   # once: data + vocabulary
    transformer-train --config=configs/wmt14_enfr.py:big --workdir=runs/enfr_big

Data: TFDS wmt14_translate/fr-en read English->French: ~40.8M training pairs (Europarl, Common Crawl,
UN, News Commentary, Giga-FrEn); validation newstest2013, test newstest2014 (full, 3003). A shared
32000-piece vocabulary (the paper's word-piece size). As the paper: the big En-Fr model uses dropout
0.1, not 0.3. Everything else as configs/wmt14_ende.py.
"""

from transformer.config import wmt_config


def get_config(size: str = "base"):
  c = wmt_config(size, "wmt14_translate/fr-en", "en", "fr", vocab_size=32000,
                 config_file="configs/wmt14_enfr.py")
  c.model.dropout = 0.1
  return c
