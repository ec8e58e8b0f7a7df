"""The default run's recipe on the bundled Multi30k English->French, the paper's second language pair.

    transformer-train --config=configs/multi30k_enfr.py --workdir=runs/m30k_enfr

Everything as configs/multi30k.py (2+2 layers of width 256, a joint 8k BPE vocabulary, 4,800 steps,
about 40 minutes of a 2-core CPU) but the target language; the vocabulary is trained on English and
French.
"""

import runpy
from pathlib import Path


def get_config():
  # The En->De default, run by path (config files are not a package on sys.path).
  c = runpy.run_path(str(Path(__file__).with_name("multi30k.py")))["get_config"]()
  c.data.src_lang, c.data.tgt_lang = "en", "fr"
  return c
