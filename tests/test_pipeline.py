"""The input pipeline: coverage, budgets, packing layout, multi-process shards, exact resume."""

import itertools
import re

import numpy as np
import pytest

from transformer.config import base_config
from transformer.data import batching, pipeline, sources
from transformer.model import EOS_ID, PAD_ID


class WordVocab:
  """A stand-in for SentencePiece: token i + 4 per word, so lengths are known exactly."""

  def encode(self, texts, num_threads=None):
    return [[int(w) + 4 for w in t.split()] for t in texts]


def corpus(n: int, seed: int = 0) -> sources.ParallelText:
  """Pair i: a source of words 'i' repeated and a target of its own length; ids say which pair."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 40, size=(n, 2))
  return sources.ParallelText([" ".join([str(i)] * a) for i, (a, _) in enumerate(lengths)],
                              [" ".join([str(i)] * b) for i, (_, b) in enumerate(lengths)], "corpus")


def pair_ids(batch) -> list[int]:
  """Which pairs a batch holds (the id is the token minus 4), each listed once per segment."""
  ids = []
  for row, segs in zip(batch["src"], batch.get("src_segments", (batch["src"] != PAD_ID).astype(int))):
    for s in sorted(set(segs[segs > 0].tolist())):
      ids.append(int(row[segs == s][0]) - 4)
  return ids


def make(text, mode="bucket", window=1000, **kw):
  spec = pipeline.BatchSpec(mode=mode, tokens_per_batch=256, max_len=48, max_ratio=0,
                            pack_length=64, row_multiple=kw.pop("row_multiple", 2))
  return pipeline.InputPipeline(text, WordVocab(), spec, seed=3, window_size=window, **kw)


def one_epoch(p, start=None):
  start = start or pipeline.PipelineState()
  out = []
  for batch, state in p.batches(start):
    out.append((batch, state))
    if state.epoch != start.epoch:
      return out


@pytest.mark.parametrize("mode", ["bucket", "pack"])
@pytest.mark.parametrize("window", [1000, 130])
def test_every_pair_once_per_epoch_within_the_budget(mode, window):
  text = corpus(400)
  p = make(text, mode, window)
  for epoch in (0, 1):
    seen = []
    for batch, _ in one_epoch(p, pipeline.PipelineState(epoch, 0, 0)):
      rows, length = batch["src"].shape
      assert rows % 2 == 0 and rows * length <= 256 and batch["tgt"].shape == (rows, length)
      seen += pair_ids(batch)
    assert sorted(seen) == list(range(400))  # nothing dropped (max_len 48 > 40), nothing twice


def test_bucket_rows_hold_one_pair_then_padding():
  text = corpus(50)
  batch, _ = next(make(text).batches())
  for row_src, row_tgt in zip(batch["src"], batch["tgt"]):
    if (row_src == PAD_ID).all():
      continue
    i = int(row_src[0]) - 4
    n, m = len(text.source[i].split()), len(text.target[i].split())
    assert (row_src[:n] == i + 4).all() and row_src[n] == 1 and (row_src[n + 1:] == PAD_ID).all()
    assert (row_tgt[:m] == i + 4).all() and row_tgt[m] == 1 and (row_tgt[m + 1:] == PAD_ID).all()


def test_packed_rows_carry_segments_and_restarting_positions():
  text = corpus(60)
  for batch, _ in one_epoch(make(text, "pack")):
    for side in ("src", "tgt"):
      for tokens, segs, pos in zip(batch[side], batch[f"{side}_segments"], batch[f"{side}_positions"]):
        assert ((tokens == PAD_ID) == (segs == 0)).all()
        for s in set(segs[segs > 0].tolist()):
          where = np.nonzero(segs == s)[0]
          assert (np.diff(where) == 1).all()           # a pair is contiguous,
          assert pos[where].tolist() == list(range(len(where)))  # its positions restart at 0,
          assert tokens[where[-1]] == 1                 # and it ends with EOS.
          i = int(tokens[where[0]]) - 4
          words = (text.source if side == "src" else text.target)[i].split()
          assert len(where) == len(words) + 1


def test_packing_fills_rows():
  pairs = batching.filter_pairs(*[WordVocab().encode(t) for t in (corpus(2000).source,
                                                                   corpus(2000).target)], 48, 0)
  rows = batching.pack_pairs(pairs, 64)
  used = sum(max(sum(len(pairs.source[i]) for i in r), sum(len(pairs.target[i]) for i in r))
             for r in rows)
  assert used / (64 * len(rows)) > 0.85  # versus ~0.5 for one pair per 64-token row


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_resume_from_any_state_neither_repeats_nor_skips(mode):
  text = corpus(150)
  p = make(text, mode, window=40)  # 4 windows: the interruptions cross window and epoch boundaries
  full = list(itertools.islice(p.batches(), 100))
  for cut in (1, 7, 13, 26, 60, 90):
    resumed = list(itertools.islice(make(text, mode, window=40).batches(full[cut - 1][1]), 100 - cut))
    for (a, sa), (b, sb) in zip(full[cut:], resumed):
      assert sa == sb and a.keys() == b.keys()
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
  assert len({s.epoch for _, s in full}) > 1  # the 100 batches span an epoch boundary


def test_order_changes_with_epoch_and_seed():
  text = corpus(200)
  def ids(p, epoch):
    return [i for b, _ in one_epoch(p, pipeline.PipelineState(epoch)) for i in pair_ids(b)]
  p = make(text)
  assert ids(p, 0) == ids(make(text), 0)
  assert ids(p, 0) != ids(p, 1)
  spec = p.spec
  other_seed = pipeline.InputPipeline(text, WordVocab(), spec, seed=4, window_size=1000)
  assert ids(p, 0) != ids(other_seed, 0)


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_processes_read_disjoint_shards_and_agree_on_shapes(mode):
  """Two simulated processes: each reads half, their batches line up into one global batch."""
  text = corpus(500, seed=1)
  procs = [make(text, mode, window=120, process_index=i, process_count=2, row_multiple=4)
           for i in (0, 1)]
  # The collective: every window, both processes learn the element-wise maximum of their counts.
  windows = [(e, w) for e in (0,) for w in range(procs[0].num_windows)]
  global_counts = []
  for e, w in windows:
    counts = [np.array([len(p.local_window(e, w).batches.get(n, [])) for n in p.spec.shapes])
              for p in procs]
    global_counts.append(np.maximum(*counts))
  for p in procs:
    it = iter(global_counts)
    p.agree = lambda counts, it=it: next(it)
  epochs = [one_epoch(p) for p in procs]
  assert len(epochs[0]) == len(epochs[1])
  seen = []
  read = [set(), set()]
  for (a, sa), (b, sb) in zip(*epochs):
    assert sa == sb and a["src"].shape == b["src"].shape  # same position, same shape: one global batch
    assert a["src"].shape[0] % 2 == 0  # half of a global batch whose rows are a multiple of 4
    read[0].update(pair_ids(a))
    read[1].update(pair_ids(b))
    seen += pair_ids(a) + pair_ids(b)
  assert not read[0] & read[1]  # each process reads only its own shard,
  assert sorted(seen) == list(range(500))  # and together they cover the epoch exactly once.


def test_everything_filtered_is_a_clear_error():
  text = sources.ParallelText([" ".join(["1"] * 60)] * 3, ["2"] * 3, "long.txt")
  with pytest.raises(sources.DataError, match=r"no sentence pair of long.txt is left .*3 longer than 48"):
    next(make(text).batches())


def test_drop_counts_are_logged_once(caplog):
  text = sources.ParallelText(["1 1", "", " ".join(["3"] * 60), "4"] * 50, ["1", "2", "3", ""] * 50, "j")
  p = make(text, window=60)
  with caplog.at_level("INFO", logger="transformer"):
    list(itertools.islice(p.batches(), 30))
  lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
  assert len(lines) == 1
  match = re.fullmatch(r"j: kept (\d+) pairs; dropped (\d+) with an empty side, (\d+) longer than "
                       r"48 tokens \(first window: 60 pairs read\)", lines[0])
  kept, empty, long = map(int, match.groups())
  assert kept + empty + long == 60 and 0 < long < empty  # a quarter too long, half empty


# ------------------------------------------------------------------- BPE-dropout (real SentencePiece)

@pytest.fixture(scope="module")
def bpe(small_vocab):
  text = sources.load_split(base_config().data, "train")
  return small_vocab[0], sources.ParallelText(text.source[:300], text.target[:300], "multi30k[:300]")


def real(vocab, text, dropout, window=120):
  spec = pipeline.BatchSpec(tokens_per_batch=1024, max_len=128, max_ratio=0, row_multiple=2)
  return pipeline.InputPipeline(text, vocab, spec, seed=5, window_size=window,
                                subword_dropout=dropout)


def segmented(p, epoch):
  """Every training sentence of an epoch as its token ids, in reading order of the window."""
  windows = [p.local_window(epoch, w).pairs for w in range(p.num_windows)]
  return [ids.tolist() for pairs in windows for ids in pairs.source + pairs.target]


def test_subword_dropout_samples_segmentations_of_the_same_text(bpe):
  vocab, text = bpe
  plain, sampled = segmented(real(vocab, text, 0.0), 0), segmented(real(vocab, text, 0.1), 0)
  eos = lambda ids: [i for i in ids if i != EOS_ID]
  assert [vocab.decode(eos(ids)) for ids in sampled] == [vocab.decode(eos(ids)) for ids in plain]
  changed = sum(a != b for a, b in zip(plain, sampled))
  assert changed > len(plain) // 3  # p = 0.1 per merge: most sentences get another segmentation
  assert sum(map(len, sampled)) > 1.1 * sum(map(len, plain))  # skipped merges leave more pieces
  assert segmented(real(vocab, text, 0.1), 1) != sampled  # a new sample every epoch


def test_subword_dropout_is_a_function_of_seed_and_position(bpe):
  """Two pipelines, one resumed mid-epoch, see the same sampled pieces batch for batch."""
  vocab, text = bpe
  full = list(itertools.islice(real(vocab, text, 0.1).batches(), 100))
  assert len({s.epoch for _, s in full}) > 1
  for cut in (3, 17, 70):
    resumed = list(itertools.islice(real(vocab, text, 0.1).batches(full[cut - 1][1]), 100 - cut))
    for (a, _), (b, _) in zip(full[cut:], resumed):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
