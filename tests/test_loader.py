"""The loader: coverage, budgets, packing layout, multi-process rows, exact resume, BPE-dropout."""

import itertools
import time

import numpy as np
import pytest

from transformer.data import batching, sources
from transformer.data import token_cache as cache_lib
from transformer.data.loader import BatchSpec, Loader, PipelineState, Sharding
from transformer.model.transformer import EOS_ID, PAD_ID


def cache_of(tmp_path, n: int, seed: int = 0, name: str = "corpus", max_len: int = 48):
  """Pair i: ids i + 4 on both sides, lengths 1-39 (so every id says which pair it came from)."""
  lengths = np.random.default_rng(seed).integers(1, 40, size=(n, 2))
  return cache_lib.from_pairs(tmp_path / name, [[i + 4] * a for i, (a, _) in enumerate(lengths)],
                              [[i + 4] * b for i, (_, b) in enumerate(lengths)], corpus=name,
                              filters=cache_lib.Filters(max_len, 0))


def pair_ids(batch) -> list[int]:
  """Which pairs a batch holds, each listed once per segment."""
  ids = []
  for row, segs in zip(batch["src"], batch.get("src_segments", (batch["src"] != PAD_ID).astype(int))):
    for s in sorted(set(segs[segs > 0].tolist())):
      ids.append(int(row[segs == s][0]) - 4)
  return ids


def make(cache, mode="bucket", **kw):
  spec = BatchSpec(mode=mode, tokens_per_batch=256, max_len=48, pack_length=64,
                   row_multiple=kw.pop("row_multiple", 2))
  return Loader(cache, spec, seed=kw.pop("seed", 3), **kw)


def one_epoch(loader, epoch=0):
  out = []
  for batch, state in loader.batches(PipelineState(epoch)):
    out.append((batch, state))
    if state.batch == 0:
      return out
  return out


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_every_pair_once_per_epoch_within_the_budget(tmp_path, mode):
  loader = make(cache_of(tmp_path, 300), mode)
  epoch = one_epoch(loader)
  assert len(epoch) == loader.num_batches
  assert sorted(i for b, _ in epoch for i in pair_ids(b)) == list(range(300))
  for batch, _ in epoch:
    rows, length = batch["src"].shape
    assert rows % 2 == 0 and rows * length <= 256 or rows == 2
  # batches an epoch do not change between epochs, and one batch of the epoch is part-empty:
  # what a bucket leaves over goes into the next longer bucket's batches
  assert len(one_epoch(loader, 1)) == loader.num_batches
  part_empty = [b for b, _ in epoch if (b["src"][:, 0] == PAD_ID).any()]
  assert len(part_empty) <= 1


def test_bucket_rows_hold_one_pair_then_padding(tmp_path):
  cache = cache_of(tmp_path, 120)
  for batch, _ in one_epoch(make(cache)):
    for src, tgt in zip(batch["src"], batch["tgt"]):
      if src[0] == PAD_ID:
        assert (src == PAD_ID).all() and (tgt == PAD_ID).all()  # an empty padding row
        continue
      i = int(src[0]) - 4
      want_src, want_tgt = cache.pair(cache_index(cache, i))
      np.testing.assert_array_equal(src[:len(want_src)], want_src)
      np.testing.assert_array_equal(tgt[:len(want_tgt)], want_tgt)
      assert (src[len(want_src):] == PAD_ID).all() and (tgt[len(want_tgt):] == PAD_ID).all()
      assert want_src[-1] == EOS_ID


def cache_index(cache, corpus_index: int) -> int:
  return int(np.flatnonzero(np.asarray(cache.index) == corpus_index)[0])


def test_packed_rows_carry_segments_and_restarting_positions(tmp_path):
  cache = cache_of(tmp_path, 200)
  for batch, _ in one_epoch(make(cache, "pack")):
    for side in ("src", "tgt"):
      for tokens, segs, pos in zip(batch[side], batch[f"{side}_segments"], batch[f"{side}_positions"]):
        assert ((tokens == PAD_ID) == (segs == 0)).all()
        for s in set(segs[segs > 0].tolist()):
          where = np.nonzero(segs == s)[0]
          assert (np.diff(where) == 1).all()                   # a pair is contiguous,
          assert pos[where].tolist() == list(range(len(where)))  # its positions restart at 0,
          assert tokens[where[-1]] == EOS_ID                    # it ends with EOS,
          want = cache.pair(cache_index(cache, int(tokens[where[0]]) - 4))[side == "tgt"]
          np.testing.assert_array_equal(tokens[where], want)    # and it is the cached pair.


def test_pack_templates_place_every_pair_and_fill_rows(rng):
  costs = np.clip(rng.lognormal(np.log(20), 0.7, 5000), 1, 64).astype(np.int64)
  slot_cost, row_start = batching.pack_templates(costs, 64)
  assert sorted(slot_cost.tolist()) == sorted(costs.tolist())  # each pair has one slot of its size
  sums = np.add.reduceat(slot_cost, row_start[:-1])
  assert sums.max() <= 64
  lower_bound = -(-costs.sum() // 64)
  assert len(row_start) - 1 <= 1.02 * lower_bound  # within 2% of the fewest rows possible
  with pytest.raises(ValueError, match="longer than the pack length 64"):
    batching.pack_templates(np.array([65]), 64)


def test_pack_templates_against_brute_force_on_small_cases():
  """The fewest rows, found by trying every assignment, is what best-fit decreasing gets here."""
  def fewest_rows(costs, length):
    best = len(costs)
    def place(i, rooms):
      nonlocal best
      if len(rooms) >= best:
        return
      if i == len(costs):
        best = len(rooms)
        return
      for r in range(len(rooms)):
        if rooms[r] >= costs[i]:
          place(i + 1, rooms[:r] + [rooms[r] - costs[i]] + rooms[r + 1:])
      place(i + 1, rooms + [length - costs[i]])
    place(0, [])
    return best
  rng = np.random.default_rng(1)
  for _ in range(30):
    costs = rng.integers(1, 11, rng.integers(3, 9))
    _, row_start = batching.pack_templates(costs, 12)
    assert len(row_start) - 1 <= fewest_rows(sorted(costs.tolist(), reverse=True), 12) + 1


@pytest.mark.parametrize("mode", ["bucket", "pack"])
@pytest.mark.parametrize("process", [None, 1])
def test_resume_from_any_state_gives_the_same_batches(tmp_path, mode, process):
  """One process, or process 1 of 2 simulated: mid-epoch and around the epoch's edge."""
  cache = cache_of(tmp_path, 150)
  kw = {} if process is None else {"sharding": Sharding(process, 2), "row_multiple": 4}
  full = list(itertools.islice(make(cache, mode, **kw).batches(), 60))
  assert len({s.epoch for _, s in full}) > 1  # the batches span an epoch boundary
  edge = next(i for i, (_, s) in enumerate(full) if s.batch == 0) + 1
  for cut in (1, 7, edge - 1, edge, edge + 1, 50):
    saved = make(cache, mode, **kw).position(full[cut - 1][1])
    resumed_loader = make(cache, mode, **kw)
    resumed = list(itertools.islice(resumed_loader.batches(resumed_loader.resume_state(saved)),
                                    60 - cut))
    for (a, sa), (b, sb) in zip(full[cut:], resumed, strict=True):
      assert sa == sb and a.keys() == b.keys()
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_worker_processes_make_the_same_batches(tmp_path):
  cache = cache_of(tmp_path, 150)
  threads = list(itertools.islice(make(cache, "pack").batches(), 12))
  workers = list(itertools.islice(make(cache, "pack", workers=2).batches(PipelineState(0, 0)), 12))
  for (a, sa), (b, sb) in zip(threads, workers, strict=True):
    assert sa == sb
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_order_changes_with_epoch_and_seed(tmp_path):
  cache = cache_of(tmp_path, 200)
  ids = lambda loader, epoch: [i for b, _ in one_epoch(loader, epoch) for i in pair_ids(b)]
  assert ids(make(cache), 0) == ids(make(cache), 0)
  assert ids(make(cache), 0) != ids(make(cache), 1)
  assert ids(make(cache), 0) != ids(make(cache, seed=4), 0)


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_processes_make_disjoint_rows_of_one_global_batch(tmp_path, mode):
  """Two simulated processes: at every step the same shape, disjoint pairs, together the epoch."""
  cache = cache_of(tmp_path, 500, seed=1)
  loaders = [make(cache, mode, sharding=Sharding(i, 2), row_multiple=4) for i in (0, 1)]
  whole = make(cache, mode, row_multiple=4)
  epochs = [one_epoch(loader) for loader in loaders + [whole]]
  assert len(epochs[0]) == len(epochs[1]) == len(epochs[2])
  seen = []
  for (a, sa), (b, sb), (w, _) in zip(*epochs):
    assert sa == sb and a["src"].shape == b["src"].shape
    for k in w:  # process 0's rows, then process 1's: the single-process global batch
      np.testing.assert_array_equal(np.concatenate([a[k], b[k]]), w[k])
    assert not set(pair_ids(a)) & set(pair_ids(b))
    seen += pair_ids(a) + pair_ids(b)
  assert sorted(seen) == list(range(500))


def test_a_position_from_other_settings_is_an_error_or_an_explicit_reshuffle(tmp_path):
  cache = cache_of(tmp_path, 300)
  loader = make(cache)
  saved = loader.position(PipelineState(2, 5))
  assert loader.resume_state(saved) == PipelineState(2, 5)
  for other in (make(cache, "pack"), make(cache, row_multiple=4), make(cache, seed=9),
                make(cache, sharding=Sharding(0, 2))):
    with pytest.raises(sources.DataError, match="does not name the same batches.*--allow_config_change"):
      other.resume_state(saved)
    moved = other.resume_state(saved, allow_change=True)
    assert moved.epoch == 2
    assert moved.batch == int(5 / loader.num_batches * other.num_batches)
  legacy = {"epoch": 3, "window": 1, "batch": 7}  # saved by the earlier windowed pipeline
  with pytest.raises(sources.DataError, match="earlier windowed input pipeline"):
    loader.resume_state(legacy)
  assert loader.resume_state(legacy, allow_change=True) == PipelineState(3, 0)


def test_everything_filtered_is_a_clear_error(tmp_path):
  cache = cache_lib.from_pairs(tmp_path / "c", [[5] * 60] * 3, [[6]] * 3, corpus="long.txt",
                               filters=cache_lib.Filters(48, 0))
  with pytest.raises(sources.DataError, match=r"no sentence pair of long.txt is left .*3 too_long"):
    make(cache)


def test_real_share_counts_positions_of_an_epoch(tmp_path):
  cache = cache_of(tmp_path, 300)
  loader = make(cache)
  epoch = one_epoch(loader)
  positions = sum(b["src"].size for b, _ in epoch)
  real = [sum(int((b[k] != PAD_ID).sum()) for b, _ in epoch) for k in ("src", "tgt")]
  assert loader.planner.real_share(cache.lengths) == pytest.approx(
      (real[0] / positions, real[1] / positions))


# ------------------------------------------------------------------- BPE-dropout (real SentencePiece)

@pytest.fixture(scope="module")
def bpe(small_vocab, tmp_path_factory):
  """A files config over the first 300 Multi30k pairs, their token cache, the vocabulary's path."""
  from transformer.config import base_config
  vocab, vocab_path = small_vocab
  text = sources.load_split(base_config().data, "train")
  where = tmp_path_factory.mktemp("bpe")
  for name, lines in (("train.en", text.source[:300]), ("train.de", text.target[:300])):
    (where / name).write_text("".join(line + "\n" for line in lines))
  data = base_config().data
  data.source, data.train_src, data.train_tgt = "files", str(where / "train.en"), str(where / "train.de")
  cache = cache_lib.build(where / "cache", sources.open_split(data, "train"), vocab_path,
                          cache_lib.Filters(128, 0), corpus="m30k300")
  return vocab, cache, {"data": data.to_dict(), "split": "train", "vocab": str(vocab_path)}


def dropout_loader(bpe, alpha, mode="bucket"):
  _, cache, subword = bpe
  spec = BatchSpec(mode=mode, tokens_per_batch=1024, max_len=128, pack_length=128, row_multiple=2)
  return Loader(cache, spec, seed=5, subword={**subword, "alpha": alpha} if alpha else None)


def sentences(batch, side):
  """A batch's sentences of one side, as id lists (EOS included), in row order."""
  out = []
  segs = batch.get(f"{side}_segments", (batch[side] != PAD_ID).astype(int))
  for row, seg in zip(batch[side], segs):
    out += [row[seg == s].tolist() for s in sorted(set(seg[seg > 0].tolist()))]
  return out


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_subword_dropout_samples_segmentations_of_the_same_text(bpe, mode):
  vocab = bpe[0]
  plain, sampled = one_epoch(dropout_loader(bpe, 0.0, mode)), one_epoch(dropout_loader(bpe, 0.1, mode))
  text = lambda ids: vocab.decode([i for i in ids if i != EOS_ID])
  for side in ("src", "tgt"):
    a = sorted(text(s) for b, _ in plain for s in sentences(b, side))
    b = sorted(text(s) for b, _ in sampled for s in sentences(b, side))
    assert a == b and len(a) == 300  # the same sentences, every one once
  plain_ids = [s for b, _ in plain for s in sentences(b, "src")]
  sampled_ids = [s for b, _ in sampled for s in sentences(b, "src")]
  assert sum(map(len, sampled_ids)) > 1.1 * sum(map(len, plain_ids))  # skipped merges: more pieces
  again = one_epoch(dropout_loader(bpe, 0.1, mode), 1)
  assert [s for b, _ in again for s in sentences(b, "src")] != sampled_ids  # new samples an epoch


def test_subword_dropout_is_a_function_of_seed_and_position(bpe):
  full = list(itertools.islice(dropout_loader(bpe, 0.1).batches(), 30))
  assert len({s.epoch for _, s in full}) > 1
  for cut in (3, 17):
    resumed = list(itertools.islice(dropout_loader(bpe, 0.1).batches(full[cut - 1][1]), 30 - cut))
    for (a, _), (b, _) in zip(full[cut:], resumed, strict=True):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_batches_made_by_many_threads_at_once_are_the_ones_made_in_turn(tmp_path, monkeypatch):
  """Grain's read-ahead threads share one batch function; at epoch edges each must still get its
  own epoch's plan (a plan swapped under a reader would give another epoch's batch)."""
  import concurrent.futures
  cache = cache_of(tmp_path, 150)
  loader = make(cache, "pack")
  numbers = list(range(3 * loader.num_batches)) * 2  # three epochs, twice
  in_turn = [make(cache, "pack").make(g) for g in numbers]
  shared = make(cache, "pack").make
  planning, most = [0], [0]
  plan = shared.planner.plan
  def slow_plan(epoch):  # a slow plan, to let other threads in while it is made
    planning[0] += 1
    most[0] = max(most[0], planning[0])
    time.sleep(0.02)
    try:
      return plan(epoch)
    finally:
      planning[0] -= 1
  monkeypatch.setattr(shared.planner, "plan", slow_plan)
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    at_once = list(pool.map(shared, numbers))
  assert most[0] == 1  # one thread plans; the others wait for its plan
  for a, b in zip(in_turn, at_once, strict=True):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("n, keys, block", [(1000, 5, 64), (100_000, 40, 1 << 12), (70_001, 257, 999)])
def test_stable_partition_is_a_stable_sort_by_key_without_its_index_array(n, keys, block):
  rng = np.random.default_rng(n)
  key = rng.integers(0, keys, n).astype(np.uint8 if keys <= 256 else np.uint16)
  order = rng.permutation(n).astype(np.uint32)
  got = batching.stable_partition(order, key, keys, block=block)
  np.testing.assert_array_equal(got, order[np.argsort(key[order], kind="stable")])  # numpy's
  assert got.dtype == np.uint32


def test_a_worker_refuses_a_cache_replaced_under_it(tmp_path):
  cache = cache_of(tmp_path, 50)
  loader = make(cache, "bucket")
  state = loader.make.__getstate__()  # what a Grain worker process receives
  assert state["fingerprint"] == cache.fingerprint
  cache_lib.from_pairs(tmp_path / "other", [[5, 6]] * 20, [[7]] * 20)
  elsewhere = {**state, "cache_dir": str(tmp_path / "other")}  # another cache at its path
  worker = type(loader.make).__new__(type(loader.make))
  worker.__setstate__(elsewhere)
  with pytest.raises(sources.DataError, match="was built from other data"):
    worker(0)
