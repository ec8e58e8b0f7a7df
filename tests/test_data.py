"""Reading parallel text, the vocabulary, and token-budget batching."""

import gzip

import numpy as np
import pytest

from transformer.config import base_config
from transformer.data import batching, sources, vocab as vocab_lib
from transformer.model import EOS_ID, PAD_ID


def test_bundled_multi30k_is_complete():
  data = base_config().data
  train = sources.load_split(data, "train")
  val = sources.load_split(data, "validation")
  assert (len(train), len(val)) == (29000, 1014)
  assert train.source[0] == "Two young, White males are outside near many bushes."
  assert train.target[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."


def test_unknown_split_names_the_test_sets():
  with pytest.raises(sources.DataError, match="test_2016_flickr"):
    sources.load_split(base_config().data, "test")


def test_unequal_line_counts_are_reported(tmp_path):
  (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
  (tmp_path / "a.de").write_text("eins\nzwei\n")
  with pytest.raises(sources.DataError, match=r"a\.en has 3 lines but .*a\.de has 2"):
    sources.read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_invalid_utf8_names_file_and_line(tmp_path):
  (tmp_path / "bad.en").write_bytes(b"fine\nalso fine\nbroken \xff here\n")
  with pytest.raises(sources.DataError, match=r"bad\.en:3: invalid UTF-8"):
    sources.read_lines(tmp_path / "bad.en")


def test_missing_file_and_gzip(tmp_path):
  with pytest.raises(sources.DataError, match="not found"):
    sources.read_lines(tmp_path / "nope.txt")
  with gzip.open(tmp_path / "x.gz", "wt", encoding="utf-8") as f:
    f.write("Grüße\r\nzwei\n")
  assert sources.read_lines(tmp_path / "x.gz") == ["Grüße", "zwei"]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
  text = sources.load_split(base_config().data, "train")
  path = tmp_path_factory.mktemp("vocab") / vocab_lib.VOCAB_FILE
  return vocab_lib.train_vocab(text.source[:2000] + text.target[:2000], path, 500), path


def test_vocabulary_special_ids_and_round_trip(small_vocab):
  vocab, _ = small_vocab
  assert vocab.get_piece_size() == 500
  assert (vocab.pad_id(), vocab.eos_id(), vocab.bos_id(), vocab.unk_id()) == (0, 1, 2, 3)
  sentence = "Zwei junge weiße Männer sind im Freien."
  assert vocab.decode(vocab.encode(sentence)) == sentence


def test_vocabulary_is_reused_and_checked(small_vocab, tmp_path):
  vocab, path = small_vocab
  (tmp_path / vocab_lib.VOCAB_FILE).write_bytes(path.read_bytes())
  reused = vocab_lib.vocab_for_run(tmp_path, ["ignored"], 500, "bpe", 100, 0)
  assert reused.encode("a man") == vocab.encode("a man")
  with pytest.raises(sources.DataError, match="has 500 pieces but config.data.vocab_size is 600"):
    vocab_lib.vocab_for_run(tmp_path, ["ignored"], 600, "bpe", 100, 0)


def test_encode_pairs_filters_and_counts(small_vocab):
  vocab, _ = small_vocab
  text = sources.ParallelText(["a dog", "", "a man " * 30, "two cats"],
                              ["ein Hund", "leer", "ein Mann " * 30, ""], "test")
  pairs = batching.encode_pairs(vocab, text, max_len=20)
  assert pairs.dropped == {"empty": 2, "too_long": 1}
  assert len(pairs.source) == 1 and pairs.source[0][-1] == EOS_ID and pairs.target[0][-1] == EOS_ID
  with pytest.raises(sources.DataError, match="no sentence pair"):
    batching.encode_pairs(vocab, sources.ParallelText([""], [""], "empty"), max_len=20)


def make_pairs(rng, n):
  lengths = rng.integers(2, 60, size=(n, 2))
  return batching.EncodedPairs([np.arange(4, 4 + a, dtype=np.int32) for a, _ in lengths],
                               [np.arange(4, 4 + b, dtype=np.int32) for _, b in lengths], {})


def test_batches_cover_every_pair_once_per_epoch_within_budget(rng):
  pairs = make_pairs(rng, 500)
  batcher = batching.TokenBudgetBatcher(pairs, tokens_per_batch=256, max_len=64, seed=3,
                                        row_multiple=4)
  for epoch in (0, 1):
    seen = []
    for length, rows, indices in batcher.epoch_batches(epoch):
      assert rows % 4 == 0 and rows * length <= 256 and len(indices) <= rows
      batch = batcher.make_batch(length, rows, indices)
      assert batch["src"].shape == batch["tgt"].shape == (rows, length)
      for row, i in enumerate(indices):  # real tokens first, then padding only
        n = len(pairs.source[i])
        np.testing.assert_array_equal(batch["src"][row, :n], pairs.source[i])
        assert (batch["src"][row, n:] == PAD_ID).all()
      assert (batch["tgt"][len(indices):] == PAD_ID).all()
      seen += list(indices)
    assert sorted(seen) == list(range(500))
  assert len(batcher.epoch_batches(0)) == batcher.batches_per_epoch


def test_batch_order_is_a_function_of_seed_and_epoch(rng):
  pairs = make_pairs(rng, 300)
  a = batching.TokenBudgetBatcher(pairs, 256, 64, seed=1)
  b = batching.TokenBudgetBatcher(pairs, 256, 64, seed=1)
  c = batching.TokenBudgetBatcher(pairs, 256, 64, seed=2)
  n = a.batches_per_epoch
  for step in (0, 5, n + 2):  # the same step gives the same batch, even across epochs
    np.testing.assert_array_equal(a.batch_at(step)["src"], b.batch_at(step)["src"])
  order = lambda batcher, epoch: np.concatenate([i for _, _, i in batcher.epoch_batches(epoch)])
  assert not np.array_equal(order(a, 0), order(a, 1))
  assert not np.array_equal(order(a, 0), order(c, 0))


def test_bucket_boundaries():
  assert batching.bucket_boundaries(40) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
  bounds = batching.bucket_boundaries(300)
  assert bounds[-1] == 300 and all(b > a for a, b in zip(bounds, bounds[1:]))
  assert 64 in bounds and 128 in bounds and 256 in bounds
