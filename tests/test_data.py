"""Reading parallel text, the vocabulary, and token-budget batching."""

import gzip
import importlib.util
import sys

import numpy as np
import pytest
import sentencepiece

from transformer.config import ConfigError, base_config, validate
from transformer.data import batching, sources, text_files, token_cache
from transformer.data import vocab as vocab_lib
from transformer.model.transformer import EOS_ID


def test_bundled_multi30k_is_complete():
  data = base_config().data
  train = sources.load_split(data, "train")
  val = sources.load_split(data, "validation")
  assert (len(train), len(val)) == (29000, 1014)
  assert train.source[0] == "Two young, White males are outside near many bushes."
  assert train.target[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."


def test_the_english_french_config_reads_the_bundled_french_side():
  spec = importlib.util.spec_from_file_location("enfr", "configs/multi30k_enfr.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  english = base_config().data
  assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("en", "fr") and cfg.train.steps == 4800
  for split, lines in (("train", 29000), ("validation", 1014)):
    pair, de = sources.load_split(cfg.data, split), sources.load_split(english, split)
    assert len(pair) == lines and pair.source == de.source  # aligned with the English side
  assert pair.target[0] == "Un groupe d'hommes chargent du coton dans un camion"


def test_unknown_split_names_the_test_sets():
  with pytest.raises(sources.DataError, match="test_2016_flickr"):
    sources.load_split(base_config().data, "test")


def test_unequal_line_counts_are_reported(tmp_path):
  (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
  (tmp_path / "a.de").write_text("eins\nzwei\n")
  with pytest.raises(sources.DataError, match=r"a\.en has 3 lines but .*a\.de has 2"):
    sources.read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_comma_separated_files_are_one_corpus_in_order(tmp_path):
  """data.train_src='a,b' with train_tgt='x,y' reads a+x then b+y (a .gz and a plain file without
  its last line end), by random access and whole, with caches named apart from the first pair's."""
  with gzip.open(tmp_path / "a.en.gz", "wt", encoding="utf-8") as f:
    f.write("one\ntwo\nthree\n")
  with gzip.open(tmp_path / "a.de.gz", "wt", encoding="utf-8") as f:
    f.write("eins\nzwei\ndrei\n")
  (tmp_path / "b.en").write_text("four\nfive")
  (tmp_path / "b.de").write_text("vier\nfünf")
  data = base_config().data
  data.source = "files"
  data.train_src = f"{tmp_path}/a.en.gz, {tmp_path}/b.en"
  data.train_tgt = f"{tmp_path}/a.de.gz,{tmp_path}/b.de"
  data.eval_src, data.eval_tgt = str(tmp_path / "b.en"), str(tmp_path / "b.de")
  english, german = ["one", "two", "three", "four", "five"], ["eins", "zwei", "drei", "vier", "fünf"]
  pairs = sources.open_split(data, "train")
  assert len(pairs) == 5
  order = [4, 0, 3, 2, 2, 1]
  assert pairs.read(order) == ([english[i] for i in order], [german[i] for i in order])
  whole = sources.load_split(data, "train")
  assert (whole.source, whole.target) == (english, german)
  assert sources.load_split(data, "validation").target == ["vier", "fünf"]
  files = sources.source_of(data)
  first = data.copy_and_resolve_references()
  first.train_src, first.train_tgt = str(tmp_path / "a.en.gz"), str(tmp_path / "a.de.gz")
  assert files.identity(data, "train") != files.identity(first, "train")
  assert files.vocabulary_key(data) != files.vocabulary_key(first)


def test_comma_separated_files_must_pair_up(tmp_path):
  data = base_config().data
  data.source = "files"
  data.train_src, data.train_tgt = "a.en,b.en", "a.de"
  data.eval_src, data.eval_tgt = "v.en", "v.de"
  with pytest.raises(ConfigError, match=r"train_src names 2 file\(s\) but config.data.train_tgt "
                                        "names 1; name one target file for each source file"):
    sources.source_of(data).check(data)
  (tmp_path / "a.en").write_text("one\n")
  (tmp_path / "a.de").write_text("eins\n")
  (tmp_path / "b.en").write_text("two\nthree\n")
  (tmp_path / "b.de").write_text("zwei\n")
  data.train_src = f"{tmp_path}/a.en,{tmp_path}/b.en"
  data.train_tgt = f"{tmp_path}/a.de,{tmp_path}/b.de"
  with pytest.raises(sources.DataError, match=r"b\.en has 2 lines but .*b\.de has 1"):
    sources.open_split(data, "train")


def test_invalid_utf8_names_file_and_line(tmp_path):
  (tmp_path / "bad.en").write_bytes(b"fine\nalso fine\nbroken \xff here\n")
  with pytest.raises(sources.DataError, match=r"bad\.en:3: invalid UTF-8"):
    text_files.read_lines(tmp_path / "bad.en")


def test_missing_file_and_gzip(tmp_path):
  with pytest.raises(sources.DataError, match="not found"):
    text_files.read_lines(tmp_path / "nope.txt")
  with gzip.open(tmp_path / "x.gz", "wt", encoding="utf-8") as f:
    f.write("Grüße\r\nzwei\n")
  assert text_files.read_lines(tmp_path / "x.gz") == ["Grüße", "zwei"]


def test_vocabulary_special_ids_and_round_trip(small_vocab):
  vocab, _ = small_vocab
  assert vocab.get_piece_size() == 500
  assert (vocab.pad_id(), vocab.eos_id(), vocab.bos_id(), vocab.unk_id()) == (0, 1, 2, 3)
  sentence = "Zwei junge weiße Männer sind im Freien."
  assert vocab.decode(vocab.encode(sentence)) == sentence


def test_vocabulary_is_reused_and_checked(small_vocab, tmp_path):
  vocab, path = small_vocab
  (tmp_path / vocab_lib.VOCAB_FILE).write_bytes(path.read_bytes())
  data = base_config().data
  data.vocab_size = 500
  reused = vocab_lib.vocab_for_run(tmp_path, data, source=None, seed=0)  # nothing read
  assert reused.encode("a man") == vocab.encode("a man")
  data.vocab_size = 600
  with pytest.raises(sources.DataError, match="has 500 pieces, but config.data.vocab_size is 600"):
    vocab_lib.vocab_for_run(tmp_path, data, source=None, seed=0)


def test_a_given_vocabulary_is_the_runs_whatever_its_text(small_vocab, tmp_path, monkeypatch):
  """data.vocab_file (a model, or a run folder) is copied in; nothing is trained or read."""
  vocab, path = small_vocab
  (tmp_path / "donor").mkdir()
  (tmp_path / "donor" / vocab_lib.VOCAB_FILE).write_bytes(path.read_bytes())

  def no_training(*args, **kwargs):
    raise AssertionError("a given vocabulary must not be trained again")
  monkeypatch.setattr(vocab_lib, "train_vocab", no_training)
  data = base_config().data
  data.vocab_size, data.vocab_cache_dir = 500, str(tmp_path / "cache")
  for i, given in enumerate((path, tmp_path / "donor")):
    data.vocab_file = str(given)
    (tmp_path / f"run{i}").mkdir()
    run = vocab_lib.vocab_for_run(tmp_path / f"run{i}", data, source=None, seed=0)
    assert (tmp_path / f"run{i}" / vocab_lib.VOCAB_FILE).read_bytes() == path.read_bytes()
    assert run.encode("Zwei Hunde") == vocab.encode("Zwei Hunde")
  assert not (tmp_path / "cache").exists()
  (tmp_path / "notes.txt").write_text("not a model\n")
  (tmp_path / "run9").mkdir()
  (tmp_path / "imported").mkdir()
  (tmp_path / "imported" / "vocab.marian").write_bytes(b"")
  for given, message in ((tmp_path / "missing.model", "no such file"),
                         (tmp_path / "imported", "imported Marian model's vocabulary"),
                         (tmp_path / "notes.txt", "is not a SentencePiece model")):
    data.vocab_file = str(given)
    with pytest.raises(sources.DataError, match=message):
      vocab_lib.vocab_for_run(tmp_path / "run9", data, source=None, seed=0)
  assert not (tmp_path / "run9" / vocab_lib.VOCAB_FILE).exists()
  cfg = base_config()
  cfg.data.vocab_file, cfg.train.init_from = str(path), str(tmp_path / "donor")
  with pytest.raises(ConfigError, match="both bring a vocabulary"):
    validate(cfg)


def test_vocabulary_is_cached_per_dataset_and_setting(tmp_path, monkeypatch):
  data = base_config().data
  data.vocab_size, data.vocab_sample_sentences = 300, 3000
  data.vocab_cache_dir = str(tmp_path / "cache")
  source = sources.load_split(data, "train")
  (tmp_path / "run1").mkdir()
  first = vocab_lib.vocab_for_run(tmp_path / "run1", data, source, seed=0)
  cached = vocab_lib.cached_vocab_path(data, seed=0, corpus_pairs=len(source))
  assert cached.is_file() and cached.name == (
      "multi30k.train.en-de.bpe300.identity.sample3000.seed0.model")

  def no_training(*args, **kwargs):
    raise AssertionError("the cached vocabulary should have been reused")
  monkeypatch.setattr(vocab_lib, "train_vocab", no_training)
  (tmp_path / "run2").mkdir()
  second = vocab_lib.vocab_for_run(tmp_path / "run2", data, source, seed=0)
  assert (tmp_path / "run2" / vocab_lib.VOCAB_FILE).read_bytes() == cached.read_bytes()
  assert second.encode("Zwei Hunde") == first.encode("Zwei Hunde")
  data.vocab_size = 400  # another setting is another cache entry, so it must be trained
  (tmp_path / "run3").mkdir()
  with pytest.raises(AssertionError, match="should have been reused"):
    vocab_lib.vocab_for_run(tmp_path / "run3", data, source, seed=0)


def test_vocabulary_of_a_whole_corpus_is_one_cache_entry_for_every_seed(tmp_path, monkeypatch):
  """A sample as large as the corpus is the corpus: the seed draws nothing, so it is not in the key."""
  data = base_config().data
  data.vocab_size, data.vocab_cache_dir = 300, str(tmp_path / "cache")
  source = sources.ParallelText(*sources.load_split(data, "train").read(range(2000)), "head")
  data.vocab_sample_sentences = len(source)
  (tmp_path / "run0").mkdir()
  first = vocab_lib.vocab_for_run(tmp_path / "run0", data, source, seed=0)
  cached = vocab_lib.cached_vocab_path(data, seed=0, corpus_pairs=len(source))
  assert cached.name == "multi30k.train.en-de.bpe300.identity.allpairs.model"
  assert vocab_lib.cached_vocab_path(data, seed=7, corpus_pairs=len(source)) == cached

  def no_training(*args, **kwargs):
    raise AssertionError("the cached vocabulary should have been reused")
  monkeypatch.setattr(vocab_lib, "train_vocab", no_training)
  (tmp_path / "run1").mkdir()
  second = vocab_lib.vocab_for_run(tmp_path / "run1", data, source, seed=1)
  assert second.encode("Zwei Hunde") == first.encode("Zwei Hunde")
  data.vocab_sample_sentences = len(source) - 1  # now a sample: each seed draws its own
  assert vocab_lib.cached_vocab_path(data, seed=1, corpus_pairs=len(source)).name.endswith(
      f".sample{len(source) - 1}.seed1.model")


def test_vocabulary_cache_key_names_the_split_and_the_tfds_data_dir(tmp_path, monkeypatch):
  """Another training split or TFDS data directory is other text: it must not reuse a vocabulary."""
  data = base_config().data
  data.source, data.tfds_name = "tfds", "wmt14_translate/de-en"
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  paths = set()
  for split, data_dir in (("train", str(tmp_path / "a")), ("train[:50%]", str(tmp_path / "a")),
                          ("train", str(tmp_path / "b")), ("train", "gs://bucket/tfds")):
    data.train_split, data.tfds_data_dir = split, data_dir
    paths.add(vocab_lib.cached_vocab_path(data, seed=0, corpus_pairs=10**6))
  assert len(paths) == 4
  data.train_split, data.tfds_data_dir = "train", ""
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "a"))  # the same directory named another way
  assert vocab_lib.cached_vocab_path(data, seed=0, corpus_pairs=10**6) in paths


def test_vocabulary_detokenizes_to_the_text_it_was_given(tmp_path):
  """Identity normalisation: NFKC would turn 'ﬁ' into 'fi', '①' into '1' and full-width letters
  narrow, so detokenized hypotheses would differ from references that keep them."""
  text = sources.load_split(base_config().data, "validation")
  odd = ["Ein Ｓchild: ﬁnal ① ½ Café", "Zwei Männer – „im“ Park…"]
  vocab = vocab_lib.train_vocab(text.source + text.target + odd * 5, tmp_path / "v.model", 300)
  for line in [*odd, *text.target[:50]]:
    assert vocab.decode(vocab.encode(line)) == line


def test_a_vocabulary_trained_twice_is_the_same_file_with_the_pieces_sentencepiece_trains(
    tmp_path, monkeypatch):
  """Trained twice (two runs' seeds, two machines) from the same sentences: the same bytes, so the
  token caches named by their hash keep their names. The pieces, scores and encodings are those of
  SentencePiece's own file, which records its temporary path (what vocabularies written before
  this had): comparing such files needs same_vocabulary, which leaves the record out."""
  text = sources.load_split(base_config().data, "validation")
  sentences = text.source + text.target
  a = vocab_lib.train_vocab(sentences, tmp_path / "a" / "v.model", 300)
  vocab_lib.train_vocab(sentences, tmp_path / "b" / "v.model", 300)
  assert (tmp_path / "a" / "v.model").read_bytes() == (tmp_path / "b" / "v.model").read_bytes()
  with monkeypatch.context() as m:
    m.setattr(vocab_lib, "reproducible", lambda model: model)
    raw = vocab_lib.train_vocab(sentences, tmp_path / "raw" / "v.model", 300)
  assert raw.serialized_model_proto() != a.serialized_model_proto()
  assert vocab_lib.same_vocabulary(raw, a)
  assert ([(raw.id_to_piece(i), raw.get_score(i)) for i in range(300)]
          == [(a.id_to_piece(i), a.get_score(i)) for i in range(300)])
  assert raw.encode(text.source[:50]) == a.encode(text.source[:50])
  assert not vocab_lib.same_vocabulary(a, vocab_lib.train_vocab(
      sentences[1:], tmp_path / "c" / "v.model", 300))
  assert not vocab_lib.same_vocabulary(a, vocab_lib.train_vocab(
      sentences, tmp_path / "d" / "v.model", 300, normalization="nmt_nfkc_cf"))


def test_without_a_usable_protobuf_vocabularies_are_compared_byte_for_byte(tmp_path, monkeypatch):
  """The files then keep SentencePiece's training record (a warning says so), and two trainings
  differ in bytes: compared byte for byte, they are called different, never wrongly the same."""
  text = sources.load_split(base_config().data, "validation")
  # The import fails (an attribute the package got from an earlier import would bypass sys.modules).
  monkeypatch.setitem(sys.modules, "sentencepiece.sentencepiece_model_pb2", None)
  monkeypatch.delattr(sentencepiece, "sentencepiece_model_pb2", raising=False)
  a = vocab_lib.train_vocab(text.source, tmp_path / "a" / "v.model", 300)
  b = vocab_lib.train_vocab(text.source, tmp_path / "b" / "v.model", 300)
  assert vocab_lib.same_vocabulary(a, vocab_lib.load_vocab(tmp_path / "a" / "v.model"))
  assert not vocab_lib.same_vocabulary(a, b)


def test_case_folding_vocabulary_lowercases_both_sides_and_has_its_own_cache_entry(tmp_path):
  data = base_config().data
  data.vocab_size, data.vocab_sample_sentences = 300, 3000
  data.vocab_cache_dir = str(tmp_path / "cache")
  data.vocab_normalization = "nmt_nfkc_cf"
  source = sources.load_split(data, "train")
  (tmp_path / "run").mkdir()
  vocab = vocab_lib.vocab_for_run(tmp_path / "run", data, source, seed=0)
  assert vocab.decode(vocab.encode("Zwei junge Männer im Park.")) == "zwei junge männer im park."
  assert vocab_lib.cached_vocab_path(data, seed=0, corpus_pairs=len(source)).name == (
      "multi30k.train.en-de.bpe300.nmt_nfkc_cf.sample3000.seed0.model")
  cfg = base_config()
  cfg.data.vocab_normalization = "lowercase"
  with pytest.raises(ConfigError, match="vocab_normalization must be one of 'identity'"):
    validate(cfg)


def test_vocabulary_sample_is_uniform_not_the_head():
  text = sources.ParallelText([f"s{i}" for i in range(10_000)], [f"t{i}" for i in range(10_000)], "n")
  sample = vocab_lib.sample_sentences(text, 500, seed=0)
  picked = sorted(int(s[1:]) for s in sample if s.startswith("s"))
  assert len(picked) == 500 == len(set(picked)) and len(sample) == 1000
  assert np.mean(picked) == pytest.approx(5000, abs=600)  # the head would give a mean of 250
  assert max(picked) > 9000
  assert len(vocab_lib.sample_sentences(text, 20_000, seed=0)) == 20_000  # all of it when fewer


def test_filters_drop_and_count(tmp_path):
  ids = lambda n: list(range(4, 4 + n))
  src = [ids(3), [], ids(30), ids(2), ids(20), ids(5)]
  tgt = [ids(4), ids(2), ids(3), [], ids(2), ids(6)]
  cache = token_cache.from_pairs(tmp_path / "c", src, tgt, filters=token_cache.Filters(24, 9.0))
  assert cache.meta["dropped"] == {"empty": 2, "too_long": 1, "length_ratio": 1}
  assert len(cache) == 2 and cache.pair(0)[0].tolist() == ids(3) + [EOS_ID]
  assert cache.pair(1)[1].tolist() == ids(6) + [EOS_ID]
  assert cache.index.tolist() == [0, 5]  # where the kept pairs are in the corpus
  no_ratio = token_cache.from_pairs(tmp_path / "d", src, tgt, filters=token_cache.Filters(24, 0))
  assert len(no_ratio) == 3  # 20 vs 2 kept: 0 = off


def test_bucket_boundaries():
  assert batching.bucket_boundaries(40) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
  bounds = batching.bucket_boundaries(300)
  assert bounds[-1] == 300 and all(b > a for a, b in zip(bounds, bounds[1:]))
  assert 64 in bounds and 128 in bounds and 256 in bounds
