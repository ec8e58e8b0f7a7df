"""Prepare a config's data once: download (TFDS), train the shared vocabulary, tokenize every split.

    python -m transformer.training.prepare --config=configs/wmt14_ende.py      # data, vocabulary, ids
    python -m transformer.training.prepare wmt14_ende --data_dir=~/tensorflow_datasets   # data only

With --config it downloads the config's TFDS datasets if they are missing (names: wmt14_ende,
wmt14_enfr, wmt17_ende, or any TFDS name such as 'wmt14_translate/de-en'), trains the shared
vocabulary into its cache (vocab.py) unless it is there, and writes the token cache of the training
and validation splits (token_cache.py), with worker processes on every core this job may use. A
training run does the same steps it finds missing before its first step, so this program is for
doing them ahead, once, on one host (a multi-host job then only reads), and for timing them:
--report=FILE writes their wall times, peak memory and drop counts as JSON.

TFDS writes array_record without TensorFlow. Before downloading, every host the dataset comes from is
checked with a short connection attempt, so a machine without network fails in seconds with a message
instead of retrying for minutes. WMT14 En-De downloads ~1.5 GB of archives (En-Fr ~6 GB, it includes
the 10^9-word Giga corpus) and needs a few times that in disk while preparing.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from urllib.parse import urlparse

import ml_collections
from absl import app, flags
from etils import epath
from ml_collections import config_flags

from transformer.cli import run_program
from transformer.config import validate
from transformer.data import pipeline, sources
from transformer.files import writable_file, write_atomically
from transformer.hardware import memory_mib, usable_cpus

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
  if FLAGS.report:  # before the work it reports on
    writable_file(FLAGS.report, "--report")
  if cfg is not None:
    validate(cfg)
    downloads = sources.source_of(cfg.data).downloads(cfg.data)
    if downloads:
      data_dir = cfg.data.tfds_data_dir = data_dir or cfg.data.tfds_data_dir
      names += downloads
  for name in dict.fromkeys(names):
    print(f"{tfds_name(name)}: {prepare(name, data_dir)}")
  if cfg is not None:
    report = prepare_config(cfg)
    if FLAGS.report:
      write_atomically(FLAGS.report, json.dumps(report, indent=1) + "\n")


def prepare_config(cfg: ml_collections.ConfigDict) -> dict:
  """The config's vocabulary and token caches (each built only if missing); what each took."""
  report: dict = {"cpus": usable_cpus()}
  t = time.time()
  text = pipeline.SplitText(cfg.data)
  text.check()  # every split's files are there and readable, before anything is built
  vocab_path = pipeline.prepared_vocabulary(cfg.data, cfg.seed, text)
  report["vocabulary"] = {"path": str(vocab_path), "seconds": round(time.time() - t, 1)}
  print(f"vocabulary: {vocab_path}")
  for split in (cfg.data.train_split, cfg.data.eval_split):
    t = time.time()
    cache = pipeline.split_cache(cfg.data, split, vocab_path, text=text)
    report[split] = {"path": str(cache.directory), "seconds": round(time.time() - t, 1),
                     "pairs_read": cache.meta["read"], "pairs_kept": len(cache),
                     "dropped": cache.meta["dropped"], "tokens": cache.meta["tokens"],
                     "workers": cache.meta["workers"],
                     "worker_peak_rss_mib": cache.meta.get("worker_peak_rss_mib", 0)}
    print(f"{split} token cache: {cache.directory}")
  # (RUSAGE_CHILDREN would not do: a child's peak counts its parent's memory at the fork)
  report["peak_rss_gib"] = {"this_process": round(memory_mib()["peak"] / 1024, 2),
                            "largest_worker": round(max(report[split]["worker_peak_rss_mib"] for split
                                                        in (cfg.data.train_split,
                                                            cfg.data.eval_split)) / 1024, 2)}
  return report


def run() -> None:
  flags.DEFINE_string("report", None, "With --config: write the steps' times, peak memory and "
                      "drop counts to this JSON file.")
  flags.DEFINE_string("data_dir", None, "TFDS data directory (default: $TFDS_DATA_DIR or "
                      "~/tensorflow_datasets).")
  config_flags.DEFINE_config_file("config", None, "Prepare this config's datasets, vocabulary and "
                                  "token caches, e.g. configs/wmt14_ende.py.")
  run_program("transformer.training.prepare", main, takes_arguments=True)


if __name__ == "__main__":
  run()
