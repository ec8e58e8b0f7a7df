"""The token cache: the ids SentencePiece gives, drop counts, workers, and every way a cache goes bad."""

import errno
import json
import os

import numpy as np
import pytest

from transformer import files
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


CACHE_FILES = ("src.bin", "tgt.bin", "offsets.npy", "lengths.npy", "index.npy", "meta.json")
DAMAGES = ("missing", "empty", "truncated", "wrong_dtype", "wrong_shape", "meta_disagrees")


def damage_file(path, damage):
  """Damages one file of a cache as a full disk, a killed copy or another version would."""
  if damage == "missing":
    path.unlink()
  elif damage == "empty":
    path.write_bytes(b"")
  elif damage == "truncated":
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
  elif path.name == "meta.json":
    meta = json.loads(path.read_text())
    if damage == "wrong_dtype":
      meta["dtype"] = "float32"
    elif damage == "wrong_shape":
      meta["pairs"] += 1
    else:
      meta["tokens"][1] += 2
    path.write_text(json.dumps(meta))
  elif path.suffix == ".bin":  # raw ids: another dtype doubles the bytes, another shape adds some
    ids = np.fromfile(path, np.uint16)
    path.write_bytes(ids.astype(np.uint32).tobytes() if damage == "wrong_dtype" else
                     ids.tobytes() + (b"\0\0" if damage == "wrong_shape" else ids[:1].tobytes()))
  else:
    array = np.load(path)
    if damage == "wrong_dtype":
      array = array.astype(np.float32)
    elif damage == "wrong_shape":
      array = array[:-1]
    else:  # numbers that disagree with meta.json (and the other arrays)
      array = array.copy()
      array[-1] += 3
    np.save(path, array)


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", CACHE_FILES)
def test_every_damage_to_every_cache_file_is_rebuilt_or_a_one_line_error(tmp_path, small_vocab,
                                                                         text, name, damage,
                                                                         caplog):
  _, vocab_path = small_vocab
  data = files_config(tmp_path, text.source[:40], text.target[:40])
  open_source = lambda: sources.open_split(data, "train")
  good = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source)
  expected = [[side.tolist() for side in good.pair(i)] for i in (0, 39)]  # copies: the file changes
  directory = good.directory
  del good
  damage_file(directory / name, damage)
  rebuild = "python -m transformer.training.prepare --config=X"
  with pytest.raises(DataError) as error:  # a reader (the benchmark's --token_cache, a worker)
    cache_lib.TokenCache(directory, rebuild=rebuild)
  message = str(error.value)
  assert "\n" not in message and (rebuild in message or "rebuild" in message), message
  with caplog.at_level("WARNING", logger="transformer"):
    rebuilt = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source)
  assert "Rebuilding the token cache: " in caplog.text  # a deleted meta.json too
  for i, (src, tgt) in zip((0, 39), expected):  # prepare and training rebuild it
    assert rebuilt.pair(i)[0].tolist() == src and rebuilt.pair(i)[1].tolist() == tgt
  assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name]


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


def _full_disk_in_worker(task):
  raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["worker", "writer"])
def test_a_full_disk_in_a_worker_or_the_writer_ends_the_build_in_seconds(
    tmp_path, small_vocab, text, monkeypatch, where):
  import time
  _, vocab_path = small_vocab
  data = files_config(tmp_path, text.source[:800], text.target[:800])
  monkeypatch.setattr(cache_lib, "CHUNK", 50)  # 16 chunks for two worker processes
  if where == "worker":  # (a spawned worker imports this module: the task itself fails there)
    monkeypatch.setattr(cache_lib, "_encode_chunk", _full_disk_in_worker)
  else:
    calls = []
    real_add = cache_lib.CacheWriter.add
    def add(self, *args, **kwargs):
      calls.append(1)
      if len(calls) == 3:
        raise OSError(errno.ENOSPC, "No space left on device")
      return real_add(self, *args, **kwargs)
    monkeypatch.setattr(cache_lib.CacheWriter, "add", add)
  t = time.perf_counter()
  with pytest.raises(DataError, match=r"\(the disk is full\).*nothing was left behind"):
    cache_lib.build(tmp_path / "caches" / "c", sources.open_split(data, "train"), vocab_path,
                    cache_lib.Filters(), corpus="c", workers=2)
  assert time.perf_counter() - t < 60  # (a hang would be for ever; this bounds the test)
  assert list((tmp_path / "caches").iterdir()) == []


def test_a_real_full_disk_is_one_error_and_leaves_the_disk_as_it_was(tmp_path, small_vocab, text,
                                                                     small_filesystem, monkeypatch):
  _, vocab_path = small_vocab
  many = 40 * len(text.source)  # ~40k pairs: ~2.5 MB of ids, more than the filesystem holds
  data = files_config(tmp_path, text.source * 40, text.target * 40)
  monkeypatch.setattr(cache_lib, "CHUNK", 5000)
  with pytest.raises(DataError, match=r"\(the disk is full\)"):
    cache_lib.build(small_filesystem / "c", sources.open_split(data, "train"), vocab_path,
                    cache_lib.Filters(), corpus="c", workers=2)
  assert list(small_filesystem.iterdir()) == [] and many > 0


def test_partial_builds_that_killed_builds_left_are_removed_by_the_next_build(tmp_path, caplog):
  import socket
  import time
  dead = tmp_path / f".c.partial-{socket.gethostname()}-999999999-abc"  # no such process
  running = tmp_path / f".c.partial-{socket.gethostname()}-{os.getpid()}-abc"
  legacy_old, legacy_new = tmp_path / ".c.partial-k2j_x8aa", tmp_path / ".c.partial-q1w2e3r4"
  for partial in (dead, running, legacy_old, legacy_new):
    partial.mkdir()
    (partial / "src.bin").write_bytes(b"\0" * 1000)
  past = time.time() - 2 * files.STALE_SECONDS
  os.utime(legacy_old / "src.bin", (past, past))
  os.utime(legacy_old, (past, past))
  with caplog.at_level("INFO", logger="transformer"):
    cache_lib.from_pairs(tmp_path / "c", [[5]] * 3, [[6]] * 3)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c", running.name, legacy_new.name])
  assert "Removed 2 partial build(s) of the token cache c" in caplog.text and "0.0 MB" in caplog.text


def test_control_characters_become_spaces_and_are_counted(tmp_path, small_vocab):
  vocab, vocab_path = small_vocab
  src = ["a dog\truns", "a cat", "two\r men\x00 sit", "a man"]
  tgt = ["ein Hund läuft", "eine\tKatze", "zwei Männer sitzen", "ein Mann"]
  data = files_config(tmp_path, src, tgt)
  cache = cache_lib.build(tmp_path / "c", sources.open_split(data, "train"), vocab_path,
                          cache_lib.Filters(), corpus="c")
  assert cache.meta["control_characters_replaced"] == {"source_lines": 2, "target_lines": 1}
  assert cache.pair(0)[0].tolist() == vocab.encode("a dog runs") + [EOS_ID]
  assert cache.pair(2)[0].tolist() == vocab.encode("two  men  sit") + [EOS_ID]
  assert cache.pair(1)[1].tolist() == vocab.encode("eine Katze") + [EOS_ID]
  assert sources.normalise_controls(["x\x1by\x85z", "ok"]) == (["x y z", "ok"], 1)


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


def test_a_full_disk_while_training_the_vocabulary_is_one_error(small_filesystem, text):
  (small_filesystem / "filler").write_bytes(b"\0" * (2 * 2**20 - 8192))  # leaves 8 kB
  with pytest.raises(DataError, match=r"could not write the vocabulary in .*: the disk is full"):
    vocab_lib.train_vocab(text.source[:3000] + text.target[:3000], small_filesystem / "v" /
                          "vocab.model", 1000)
  assert [p.name for p in (small_filesystem / "v").iterdir()] == []


def test_a_full_disk_while_writing_the_standin_is_one_error_and_leaves_no_partial_file(
    tmp_path, monkeypatch):
  shape = standin.Shape(pairs=300, word_types=5000)
  def full(args):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(standin, "_make_chunk", full)
  with pytest.raises(DataError, match=r"could not write the stand-in corpus .*the disk is full"):
    standin.generate(tmp_path / "s", shape, workers=1, valid_pairs=10)
  assert list((tmp_path / "s").iterdir()) == []


def test_a_small_file_written_on_a_full_disk_is_one_error_and_leaves_the_old_file(
    small_filesystem):
  from transformer.errors import UserError
  from transformer.files import write_atomically
  write_atomically(small_filesystem / "config.json", "{}")
  with pytest.raises(UserError, match=r"could not write .*config.json: the disk is full"):
    write_atomically(small_filesystem / "config.json", "x" * (3 * 2**20))
  assert [p.name for p in small_filesystem.iterdir()] == ["config.json"]
  assert (small_filesystem / "config.json").read_text() == "{}"


def test_a_splits_size_is_recorded_once_however_many_runs_record_it_at_once(tmp_path):
  import concurrent.futures
  data = base_config().data
  data.token_cache_dir = str(tmp_path)
  assert cache_lib.recorded_pairs(data, "train") is None
  with concurrent.futures.ThreadPoolExecutor(8) as pool:  # runs started side by side
    list(pool.map(lambda i: cache_lib.record_pairs(data, "train", 29_000), range(64)))
  assert cache_lib.recorded_pairs(data, "train") == 29_000
  assert [p.suffix for p in (tmp_path / ".sizes").iterdir()] == [".json"]  # no temporary left
  data.src_lang = "fr"  # another corpus identity: not known
  assert cache_lib.recorded_pairs(data, "train") is None
