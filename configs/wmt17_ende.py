"""WMT17 English->German training data (the Flax WMT example's), evaluated on WMT14's test sets.

    python -m transformer.training.prepare --config=configs/wmt17_ende.py   # once: data + vocabulary
    transformer-train --config=configs/wmt17_ende.py:base --workdir=runs/wmt17_base

Training: TFDS wmt17_translate/de-en (~5.9M pairs: adds Rapid 2016 to WMT14's corpora). Validation
and test come from wmt14_translate/de-en (newstest2013 and newstest2014), so the numbers compare with
the paper's and with the Flax example's. Model and recipe as configs/wmt14_ende.py.
"""

from transformer.config import wmt_config


def get_config(size: str = "base"):
  c = wmt_config(size, "wmt17_translate/de-en", "en", "de", vocab_size=37000,
                 config_file="configs/wmt17_ende.py")
  c.data.eval_tfds_name = "wmt14_translate/de-en"
  return c
