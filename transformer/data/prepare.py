"""Download and prepare a TFDS translation dataset once, in the array_record format training reads.

    python -m transformer.data.prepare wmt14_ende --data_dir=~/tensorflow_datasets
    python -m transformer.data.prepare --config=configs/wmt14_ende.py --data_dir=...   # + vocabulary

Names: wmt14_ende, wmt14_enfr, wmt17_ende, or any TFDS name ('wmt14_translate/de-en'). With --config
it prepares the config's training and evaluation datasets and also trains the shared vocabulary into
the cache (vocab.py), so that a multi-host job does not train it on every host at start-up.

TFDS writes array_record without TensorFlow. Before downloading, every host the dataset comes from is
checked with a short connection attempt, so a machine without network fails in seconds with a message
instead of retrying for minutes. WMT14 En-De downloads ~1.5 GB of archives (En-Fr ~6 GB, it includes
the 10^9-word Giga corpus) and needs a few times that in disk while preparing.
"""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlparse

from absl import app, flags
from etils import epath
from ml_collections import config_flags

from transformer.cli import run_program
from transformer.config import ConfigError, validate
from transformer.data import sources
from transformer.data import vocab as vocab_lib

log = logging.getLogger("transformer")

DATASETS = {  # short name -> TFDS name; the direction (en -> xx) is the config's src/tgt_lang.
    "wmt14_ende": "wmt14_translate/de-en",
    "wmt14_enfr": "wmt14_translate/fr-en",
    "wmt17_ende": "wmt17_translate/de-en",
}
FLAGS = flags.FLAGS


def tfds_name(name: str) -> str:
  return DATASETS.get(name, name)


def source_urls(builder) -> list[str]:
  """The URLs a WMT builder downloads from (empty for other builders: nothing to check)."""
  from tensorflow_datasets.translate import wmt
  if not isinstance(builder, wmt.WmtTranslate):
    return []
  source = builder.builder_config.language_pair[0]
  names = {n for subsets in builder.subsets.values() for n in subsets}
  return [url for n in sorted(names) for url in wmt.DATASET_MAP[n].get_url(source)]


def check_network(urls: list[str], timeout: float = 5.0) -> None:
  """Raises DataError at once if a host cannot be reached, instead of TFDS's minutes of retries."""
  for host, port in sorted({(urlparse(u).hostname, urlparse(u).port or
                             (443 if urlparse(u).scheme == "https" else 80)) for u in urls}):
    try:
      socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
      raise sources.DataError(f"cannot reach {host}:{port} to download the data ({e}); run this "
                              "command on a machine with network access and copy the data "
                              "directory here, or point --data_dir at a prepared copy") from None


def prepare(name: str, data_dir: str | None = None) -> epath.Path:
  """Downloads and prepares `name` (short or TFDS name) as array_record; returns its directory."""
  name = tfds_name(name)
  tfds = sources.import_tfds(name)
  data_dir = sources.tfds_data_dir(data_dir or "")
  try:
    return sources.prepared_builder(name, data_dir).data_path
  except sources.DataError:
    pass  # not prepared yet (an unknown name fails again just below, with its own message)
  try:
    builder = tfds.builder(name, data_dir=str(data_dir), file_format="array_record")
  except Exception as e:  # noqa: BLE001
    raise sources.DataError(f"unknown TFDS dataset {name!r} ({type(e).__name__}); known short "
                            f"names: {', '.join(DATASETS)}") from None
  check_network(source_urls(builder))
  log.info("Downloading and preparing %s in %s", name, data_dir)
  builder.download_and_prepare()
  splits = ", ".join(f"{s} {info.num_examples:,}" for s, info in builder.info.splits.items())
  log.info("Prepared %s: %s", name, splits)
  return builder.data_path


def main(argv: list[str]) -> None:
  names = argv[1:]
  cfg = FLAGS.config
  if not names and cfg is None:
    raise app.UsageError(f"name a dataset ({', '.join(DATASETS)} or a TFDS name) or pass --config")
  data_dir = FLAGS.data_dir
  if cfg is not None:
    validate(cfg)
    if cfg.data.source != "tfds":
      raise ConfigError(f"the config reads data.source={cfg.data.source!r}; nothing to prepare")
    data_dir = cfg.data.tfds_data_dir = data_dir or cfg.data.tfds_data_dir
    names += [cfg.data.tfds_name] + ([cfg.data.eval_tfds_name] if cfg.data.eval_tfds_name else [])
  for name in dict.fromkeys(names):
    print(f"{tfds_name(name)}: {prepare(name, data_dir)}")
  if cfg is not None:
    path = vocab_lib.cached_vocab(cfg.data, sources.open_split(cfg.data, cfg.data.train_split),
                                  cfg.seed)
    print(f"vocabulary: {path}")


def run() -> None:
  flags.DEFINE_string("data_dir", None, "TFDS data directory (default: $TFDS_DATA_DIR or "
                      "~/tensorflow_datasets).")
  config_flags.DEFINE_config_file("config", None, "Also prepare this config's datasets and "
                                  "vocabulary, e.g. configs/wmt14_ende.py.")
  run_program("transformer.data.prepare", main, takes_arguments=True)


if __name__ == "__main__":
  run()
