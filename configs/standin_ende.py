"""WMT14 En->De's recipe on the WMT-sized stand-in corpus (transformer/data/standin.py): for
measuring preparation, loading and training at WMT's size where WMT cannot be downloaded.

    python -m transformer.data.standin --out=data/standin_ende        # 4.5M pairs, ~4 min on 2 cores
    python -m transformer.training.prepare --config=configs/standin_ende.py
    transformer-train --config=configs/standin_ende.py:base --workdir=runs/standin

The argument is the model size, optionally with the corpus directory: `:base` or
`:big,/data/standin_ende` (default directory: data/standin_ende, relative to where you run).
"""

from transformer.config import wmt_config


def get_config(arg: str = "base"):
  size, _, directory = arg.partition(",")
  directory = directory or "data/standin_ende"
  c = wmt_config(size, "", "en", "de", vocab_size=37000, config_file="configs/standin_ende.py")
  c.data.source = "files"
  c.data.tfds_name = ""
  c.data.train_src, c.data.train_tgt = f"{directory}/train.en", f"{directory}/train.de"
  c.data.eval_src, c.data.eval_tgt = f"{directory}/valid.en", f"{directory}/valid.de"
  return c
