"""The real TFDS WMT14 builders on tiny local fixture files, offline, through to a training step."""

import gzip
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow_datasets as tfds
from helpers import tiny_run_config
from tensorflow_datasets.core.download import downloader

from transformer.data import sources, text_files
from transformer.data import vocab as vocab_lib
from transformer.training import prepare
from transformer.training.train import train_and_evaluate

# Relative paths inside the WMT archives (tensorflow_datasets/translate/wmt.py), {x} = de or fr.
TRAIN_FILES = ["training/europarl-v7.{x}-en", "commoncrawl.{x}-en", "training/news-commentary-v9.{x}-en"]
FR_ONLY_FILES = ["un/undoc.2000.fr-en"]


def write_wmt_fixture(root, lang: str, lines: int = 60) -> dict[str, list[str]]:
  """Writes every file the wmt14 builder reads for {lang}-en, from Multi30k sentences (fr: the
  German side stands in). Returns the English/foreign sentences of each split, in file order."""
  en = text_files.read_lines(sources.BUNDLED_DIR / "train.en.gz")
  xx = text_files.read_lines(sources.BUNDLED_DIR / "train.de.gz")
  chunks = iter(range(0, 10_000, lines))

  def take():
    i = next(chunks)
    return en[i:i + lines], xx[i:i + lines]
  expected = {"train": ([], []), "validation": ([], []), "test": ([], [])}
  stems = [p.format(x=lang) for p in TRAIN_FILES] + (FR_ONLY_FILES if lang == "fr" else [])
  for stem in stems:
    e, x = take()
    (root / stem).parent.mkdir(parents=True, exist_ok=True)
    (root / f"{stem}.en").write_text("\n".join(e) + "\n")
    (root / f"{stem}.{lang}").write_text("\n".join(x) + "\n")
    expected["train"][0].extend(e)
    expected["train"][1].extend(x)
  if lang == "fr":
    e, x = take()
    for code, text in (("en", e), ("fr", x)):
      with gzip.open(root / f"giga-fren.release2.fixed.{code}.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")
    expected["train"][0].extend(e)
    expected["train"][1].extend(x)
  (root / "dev").mkdir(exist_ok=True)
  e, x = take()
  (root / "dev/newstest2013.en").write_text("\n".join(e) + "\n")
  (root / f"dev/newstest2013.{lang}").write_text("\n".join(x) + "\n")
  expected["validation"] = (e, x)
  e, x = take()
  for name, text in ((f"dev/newstest2014-{lang}en-src.{lang}.sgm", x),
                     (f"dev/newstest2014-{lang}en-ref.en.sgm", e)):
    segs = "".join(f'<seg id="{i}">{t}</seg>\n' for i, t in enumerate(text, start=1))
    (root / name).write_text(f'<doc docid="d" sysid="ref">\n{segs}</doc>\n')
  expected["test"] = (e, x)
  return expected


@pytest.fixture
def offline_downloads(tmp_path, monkeypatch):
  """Every download of the WMT builders resolves to one local folder; nothing touches the network."""
  raw = tmp_path / "raw"
  raw.mkdir()

  def local_folder(self, url_or_urls):
    return tfds.core.utils.map_nested(lambda url: str(raw), url_or_urls)

  def no_network(*args, **kwargs):
    raise AssertionError("the test tried to reach the network")
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", local_folder)
  monkeypatch.setattr(downloader, "MAX_RETRIES", 0)
  monkeypatch.setattr(prepare, "check_network", lambda urls: None)
  monkeypatch.setattr(socket, "create_connection", no_network)
  return raw


@pytest.mark.parametrize("short_name,lang", [("wmt14_ende", "de"), ("wmt14_enfr", "fr")])
def test_prepare_and_read_wmt14_in_the_english_to_foreign_direction(offline_downloads, tmp_path,
                                                                    short_name, lang):
  expected = write_wmt_fixture(offline_downloads, lang)
  data_dir = tmp_path / "tfds"
  path = prepare.prepare(short_name, str(data_dir))
  assert sorted(p.name.split(".")[0] for p in path.glob("*.array_record*")) == sorted(
      ["wmt14_translate-train", "wmt14_translate-validation", "wmt14_translate-test"])
  assert prepare.prepare(short_name, str(data_dir)) == path  # prepared once; the second is a no-op
  for split, (english, foreign) in expected.items():
    pairs = sources.TfdsPairs(prepare.tfds_name(short_name), split, str(data_dir), "en", lang)
    assert len(pairs) == len(english)
    src, tgt = pairs.read(range(len(pairs)))
    assert sorted(zip(src, tgt)) == sorted(zip(english, foreign))  # English source, as configured


def test_wmt14_ende_trains_from_tfds(offline_downloads, tmp_path):
  write_wmt_fixture(offline_downloads, "de", lines=100)
  data_dir = tmp_path / "tfds"
  prepare.prepare("wmt14_ende", str(data_dir))
  cfg = tiny_run_config(tmp_path)
  cfg.data.source, cfg.data.tfds_name = "tfds", "wmt14_translate/de-en"
  cfg.data.tfds_data_dir = str(data_dir)
  cfg.data.batching = "pack"
  cfg.data.pack_length = 48
  cfg.train.steps, cfg.train.eval_every, cfg.train.checkpoint_every = 2, 2, 2
  summary = train_and_evaluate(cfg, str(tmp_path / "run"))
  assert summary["steps"] == 2
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if r["event"] == "eval"] == [2]
  assert all(r["loss"] > 0 for r in records if r["event"] == "train")
  # The command line with --config: data already prepared (no network), vocabulary from the cache.
  out = subprocess.run([sys.executable, "-m", "transformer.training.prepare",
                        "--config=configs/wmt14_ende.py", f"--data_dir={data_dir}",
                        "--config.data.vocab_size=300",
                        f"--config.data.vocab_cache_dir={cfg.data.vocab_cache_dir}",
                        f"--config.data.token_cache_dir={cfg.data.token_cache_dir}",
                        "--config.data.max_len=40", f"--report={tmp_path / 'report.json'}"],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  caches = sorted(p for p in Path(cfg.data.token_cache_dir).iterdir() if p.name[0] != ".")  # the ones training built
  assert [c.name.split(".")[1] for c in caches] == ["train", "validation"]
  assert out.stdout.splitlines() == [
      f"wmt14_translate/de-en: {data_dir}/wmt14_translate/de-en/1.0.0",
      f"vocabulary: {vocab_lib.cached_vocab_path(cfg.data, cfg.seed, corpus_pairs=1)}",
      f"train token cache: {caches[0]}", f"validation token cache: {caches[1]}"]
  assert "Reusing the cached vocabulary" in out.stderr
  assert "Token cache" not in out.stderr  # both reused, not built again
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["train"]["pairs_kept"] + sum(report["train"]["dropped"].values()) == \
      report["train"]["pairs_read"]


def test_missing_dataset_says_what_to_run_without_touching_the_network(offline_downloads, tmp_path):
  cfg = tiny_run_config(tmp_path)
  cfg.data.source, cfg.data.tfds_name = "tfds", "wmt14_translate/de-en"
  cfg.data.tfds_data_dir = str(tmp_path / "empty")
  with pytest.raises(sources.DataError) as e:
    train_and_evaluate(cfg, str(tmp_path / "run"))
  assert str(e.value).startswith(f"wmt14_translate/de-en is not prepared in {tmp_path / 'empty'}")
  assert (f"`python -m transformer.training.prepare wmt14_translate/de-en --data_dir={tmp_path / 'empty'}`"
          in str(e.value))
  assert not (tmp_path / "run" / "vocab.model").exists()


def test_prepare_without_network_fails_at_once(tmp_path, monkeypatch):
  def unreachable(address, timeout=None):
    raise OSError(101, "Network is unreachable")

  def no_download(*args, **kwargs):
    raise AssertionError("prepare should not start downloading without a network")
  monkeypatch.setattr(socket, "create_connection", unreachable)
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", no_download)
  with pytest.raises(sources.DataError, match=r"cannot reach (data|www)\.statmt\.org:80 to download the data"):
    prepare.prepare("wmt14_ende", str(tmp_path))
  assert not list(tmp_path.glob("wmt14_translate/de-en/*/dataset_info.json"))


def test_prepare_command_line_errors(tmp_path):
  def run(*args):
    return subprocess.run([sys.executable, "-m", "transformer.training.prepare", *args],
                          capture_output=True, text=True, timeout=120)
  out = run()
  assert out.returncode != 0 and "name a dataset" in out.stderr
  out = run("wmt99_xx", f"--data_dir={tmp_path}")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].startswith(
      "transformer.training.prepare: error: unknown TFDS dataset 'wmt99_xx'")


def test_missing_tensorflow_datasets_is_a_data_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes `import` raise ImportError
  with pytest.raises(sources.DataError, match=r"needs tensorflow-datasets.*pip install 'tensorflow-datasets"):
    sources.prepared_builder("wmt14_translate/de-en", None)
  with pytest.raises(sources.DataError, match=r"'wmt14_translate/de-en' needs tensorflow-datasets"):
    prepare.prepare("wmt14_ende")  # the download program says the same, before any network
