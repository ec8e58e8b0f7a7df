"""The token cache: the ids SentencePiece gives, drop counts, workers, and every way a cache goes bad."""

import errno
import json
import os

import numpy as np
import pytest

from transformer.config import base_config
from transformer.data import sources, standin
from transformer.data import token_cache as cache_lib
from transformer.data import vocab as vocab_lib
from transformer.data.sources import DataError
from transformer.hardware import usable_cpus
from transformer.model.transformer import EOS_ID


def files_config(tmp_path, src_lines, tgt_lines):
  for name, lines in (("train.en", src_lines), ("train.de", tgt_lines)):
    (tmp_path / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  data = base_config().data
  data.source, data.train_src, data.train_tgt = "files", str(tmp_path / "train.en"), str(tmp_path / "train.de")
  data.token_cache_dir = str(tmp_path / "caches")
  return data


@pytest.fixture(scope="module")
def text():
  return sources.load_split(base_config().data, "validation")


def test_cache_holds_sentencepieces_ids_of_the_kept_pairs(tmp_path, small_vocab, text):
  vocab, vocab_path = small_vocab
  src, tgt = text.source[:200] + ["", "a " * 300], text.target[:200] + ["Hallo", "b"]
  data = files_config(tmp_path, src, tgt)
  cache = cache_lib.build(tmp_path / "c", sources.open_split(data, "train"), vocab_path,
                          cache_lib.Filters(128, 9.0), corpus="c")
  assert cache.meta["dropped"] == {"empty": 1, "too_long": 1, "length_ratio": 0}
  assert len(cache) == 200 and cache.meta["read"] == 202 and cache.tokens[0].dtype == np.uint16
  for i in (0, 57, 199):
    got_src, got_tgt = cache.pair(i)
    assert got_src.tolist() == vocab.encode(src[i]) + [EOS_ID]
    assert got_tgt.tolist() == vocab.encode(tgt[i]) + [EOS_ID]
  assert cache.lengths[57].tolist() == [len(vocab.encode(src[57])) + 1, len(vocab.encode(tgt[57])) + 1]


def test_worker_processes_write_the_same_cache(tmp_path, small_vocab, text, monkeypatch):
  _, vocab_path = small_vocab
  data = files_config(tmp_path, text.source[:600], text.target[:600])
  monkeypatch.setattr(cache_lib, "CHUNK", 100)  # six chunks, shared by two processes
  one = cache_lib.build(tmp_path / "one", sources.open_split(data, "train"), vocab_path,
                        cache_lib.Filters(), corpus="c", workers=1)
  two = cache_lib.build(tmp_path / "two", sources.open_split(data, "train"), vocab_path,
                        cache_lib.Filters(), corpus="c", workers=2)
  assert two.meta["workers"] == 2
  for name in ("src.bin", "tgt.bin", "lengths.npy", "offsets.npy", "index.npy"):
    assert (one.directory / name).read_bytes() == (two.directory / name).read_bytes()


def test_open_or_build_builds_once_then_reuses_and_rebuilds_when_stale(tmp_path, small_vocab, text,
                                                                        caplog):
  _, vocab_path = small_vocab
  data = files_config(tmp_path, text.source[:50], text.target[:50])
  open_source = lambda: sources.open_split(data, "train")
  first = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source)
  with pytest.raises(DataError, match="no token cache"):
    cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(64, 9), open_source,
                            build_missing=False)  # other filters: another cache
  reused = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source,
                                   build_missing=False)
  assert reused.directory == first.directory and len(reused) == 50
  files_config(tmp_path, text.source[:40], text.target[:40])  # the corpus changes on disk
  with pytest.raises(DataError, match="built from other data"):
    cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source,
                            build_missing=False)
  with caplog.at_level("WARNING", logger="transformer"):
    rebuilt = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source)
  assert len(rebuilt) == 40 and rebuilt.directory == first.directory
  assert "Rebuilding the token cache" in caplog.text
  assert [p.name for p in rebuilt.directory.parent.iterdir()] == [rebuilt.directory.name]


@pytest.mark.parametrize("damage", ["truncated", "meta", "missing", "format"])
def test_a_damaged_cache_is_an_error_that_says_how_to_rebuild(tmp_path, damage):
  cache = cache_lib.from_pairs(tmp_path / "c", [[5, 6, 7]] * 10, [[8, 9]] * 10)
  if damage == "truncated":
    with open(cache.directory / "tgt.bin", "r+b") as f:
      f.truncate(7)
    match = "tgt.bin is 7 bytes, expected 60: the cache is truncated or corrupt; rebuild it with"
  elif damage == "meta":
    (cache.directory / "meta.json").write_text("{not json")
    match = "meta.json is corrupt"
  elif damage == "missing":
    (cache.directory / "lengths.npy").unlink()
    match = "cannot read the token cache"
  else:
    meta = json.loads((cache.directory / "meta.json").read_text())
    (cache.directory / "meta.json").write_text(json.dumps({**meta, "format": 0}))
    match = "format 0, this version reads format 1"
  with pytest.raises(DataError, match=match):
    cache_lib.TokenCache(cache.directory, rebuild="python -m transformer.training.prepare --config=X")


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
  old = cache_lib.from_pairs(tmp_path / "c", [[5]] * 3, [[6]] * 3)
  def full_disk(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(cache_lib.CacheWriter, "add", full_disk)
  with pytest.raises(DataError, match=r"could not write the token cache .* \(the disk is full\).*"
                                      "nothing was left behind"):
    cache_lib.from_pairs(tmp_path / "c", [[5, 5]] * 3, [[6]] * 3)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no partial directory
  assert len(cache_lib.TokenCache(old.directory)) == 3 and old.pair(0)[0].tolist() == [5, EOS_ID]


def test_synthetic_cache_has_wmt_shaped_lengths(tmp_path):
  cache = cache_lib.write_synthetic(tmp_path / "s", 20_000, vocab_size=70_000)
  assert len(cache) == 20_000 and cache.tokens[0].dtype == np.uint32  # > 65,536 pieces
  mean = np.asarray(cache.lengths, np.float64).mean(axis=0)
  assert 27 < mean[0] < 35 and mean[1] > mean[0]
  assert (cache.pair(123)[0][-1], cache.pair(123)[1][-1]) == (EOS_ID, EOS_ID)


def test_text_files_are_read_lazily_and_checked(tmp_path):
  (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
  (tmp_path / "a.de").write_text("eins\nzwei\r\ndrei")  # no final newline, a Windows line end
  pairs = sources.TextFilePairs(tmp_path / "a.en", tmp_path / "a.de")
  assert len(pairs) == 3 and pairs.read([2, 1]) == (["three", "two"], ["drei", "zwei"])
  (tmp_path / "b.de").write_text("eins\n")
  with pytest.raises(DataError, match="has 3 lines but .*b.de has 1"):
    sources.TextFilePairs(tmp_path / "a.en", tmp_path / "b.de")
  (tmp_path / "c.de").write_bytes(b"eins\nzw\xffei\ndrei\n")
  with pytest.raises(DataError, match=r"c.de:2: invalid UTF-8"):
    sources.TextFilePairs(tmp_path / "a.en", tmp_path / "c.de").read([1])


def test_usable_cpus_follows_the_affinity_mask_and_slurm(monkeypatch):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
  monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
  assert usable_cpus() == 3
  monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
  assert usable_cpus() == 2


def test_standin_corpus_has_the_shape_and_the_junk_it_claims(tmp_path):
  shape = standin.Shape(pairs=4000, word_types=50_000, empty=0.01, too_long=0.005, misaligned=0.01)
  manifest = standin.generate(tmp_path, shape, workers=1, valid_pairs=100)
  assert manifest["injected"] == {"empty": 40, "too_long": 20, "length_ratio": 40}
  src = (tmp_path / "train.en").read_text(encoding="utf-8").split("\n")[:-1]
  tgt = (tmp_path / "train.de").read_text(encoding="utf-8").split("\n")[:-1]
  assert len(src) == len(tgt) == 4000
  words = np.array([len(s.split()) for s in src])
  assert (words == 0).sum() == 20 and sum(not t for t in tgt) == 20  # empty sides, half each
  assert (words >= 300).sum() == 20  # the over-long pairs
  normal = words[(words > 0) & (words < 300)]
  assert 20 < normal.mean() < 30 and normal.max() <= 120  # WMT-like lengths, capped
  assert len({w for s in src for w in s.split()}) > 5000  # an inflated vocabulary
  again = standin.generate(tmp_path / "again", shape, workers=2, valid_pairs=100)
  assert (tmp_path / "again" / "train.de").read_bytes() == (tmp_path / "train.de").read_bytes()
  assert again["injected"] == manifest["injected"]


def test_standin_junk_is_exactly_what_the_filters_drop(tmp_path):
  shape = standin.Shape(pairs=3000, word_types=20_000, empty=0.01, too_long=0.01, misaligned=0.01)
  standin.generate(tmp_path, shape, workers=1, valid_pairs=10)
  text = sources.TextFilePairs(tmp_path / "train.en", tmp_path / "train.de")
  sentences = vocab_lib.sample_sentences(text, 3000, 0)
  vocab_lib.train_vocab(sentences, tmp_path / "v.model", 2000)
  cache = cache_lib.build(tmp_path / "c", text, tmp_path / "v.model", cache_lib.Filters(256, 9.0),
                          corpus="standin")
  assert cache.meta["dropped"] == {"empty": 30, "too_long": 30, "length_ratio": 30}


def test_a_cache_another_process_finished_first_is_kept(tmp_path):
  first = cache_lib.from_pairs(tmp_path / "c", [[5, 6]] * 4, [[7]] * 4)
  inode = (first.directory / "src.bin").stat().st_ino
  second = cache_lib.from_pairs(tmp_path / "c", [[5, 6]] * 4, [[7]] * 4)  # same fingerprint
  assert (second.directory / "src.bin").stat().st_ino == inode  # the first one stays in place
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # and nothing else is left


def test_memory_mib_reads_this_process_and_zeros_elsewhere():
  from transformer.hardware import memory_mib
  before = memory_mib()
  block = np.ones(64 * 2**20, np.uint8)  # 64 MiB, touched
  after = memory_mib()
  assert after["anon"] - before["anon"] >= 60 and after["peak"] >= after["anon"]
  del block
  assert memory_mib(2**30) == {"anon": 0, "file": 0, "peak": 0}  # no such process
