"""The device feed (training/feed.py): the loader's batches in the loader's order at any depth,
each with its position, token counts and FLOPs; a loader's error raised in the loop's thread; a
closed feed stops its thread without reading the loader further."""

import threading
import time

import numpy as np
import pytest
from helpers import tiny_model_config

from transformer import partitioning
from transformer.model.transformer import PAD_ID
from transformer.training.feed import DeviceFeed, batch_flops


def loader(n, rows=2, length=5, seed=0):
  """(batch, position after it) pairs as the training loader yields them, padded at random."""
  rng = np.random.default_rng(seed)
  for i in range(n):
    tgt = rng.integers(1, 50, size=(rows, length + i % 3), dtype=np.int32)
    tgt[:, rng.integers(1, tgt.shape[1]):] = PAD_ID
    yield {"src": tgt[:, ::-1].copy(), "tgt": tgt}, {"batch": i + 1}


MODEL = tiny_model_config()


@pytest.fixture
def mesh():
  return partitioning.data_mesh()


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_the_feed_yields_the_loaders_batches_in_order_with_their_counts(mesh, depth):
  with DeviceFeed(loader(9), mesh, MODEL, depth=depth) as feed:
    placed = list(feed)
  expected = list(loader(9))
  assert len(placed) == 9
  for got, (batch, position) in zip(placed, expected):
    assert got.data_state == position
    for key in batch:
      np.testing.assert_array_equal(got.host[key], batch[key])
      np.testing.assert_array_equal(np.asarray(got.arrays[key]), batch[key])
      assert got.arrays[key].sharding == partitioning.batch_sharding(mesh)
    assert got.real_tokens == float(np.count_nonzero(batch["tgt"] != PAD_ID))
    assert got.positions == batch["tgt"].size and got.flops == batch_flops(MODEL, batch) > 0


def test_an_error_in_the_loader_is_raised_in_the_loops_thread_after_the_batches_before_it(mesh):
  def broken():
    yield from loader(2)
    raise ValueError("shard 3 of the token cache is truncated")
  with DeviceFeed(broken(), mesh, MODEL, depth=2) as feed:
    assert [p.data_state for p in (next(feed), next(feed))] == [{"batch": 1}, {"batch": 2}]
    with pytest.raises(ValueError, match="shard 3 of the token cache is truncated"):
      next(feed)


def test_closing_stops_the_thread_and_reads_no_further_than_its_depth(mesh):
  read = []
  def counted():
    for item in loader(1000):
      read.append(item[1]["batch"])
      yield item
  feed = DeviceFeed(counted(), mesh, MODEL, depth=2)
  assert next(feed).data_state == {"batch": 1}
  time.sleep(0.5)  # the thread fills its queue and waits
  feed.close()
  assert not any(t.name == "device-feed" and t.is_alive() for t in threading.enumerate())
  assert len(read) <= 1 + 2 + 1  # the one taken, the queue, the one waiting to enter it
