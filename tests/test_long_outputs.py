"""The fast searches against decoding/textbook.py where their machinery acts: outputs of 40-66 positions,
so the self-attention cache's later blocks (16, 16, 32 and 64 positions) are written, merged and,
while no slot has reached them, skipped; sentences finishing early while others run on and new
ones take their slots mid-way; minimum lengths; n-best lists."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer import decoding
from transformer.decoding import textbook as reference
from transformer.model import kv_cache
from transformer.model.transformer import EOS_ID, PAD_ID, Transformer

pytestmark = pytest.mark.core
VOCAB = 12
DECODE_LEN = 70
LIMITS = np.array([66, 44, 50, 41, 60])   # EOS included
MIN_LEN = np.array([64, 0, 41, 0, 12])    # tokens before EOS


@pytest.fixture(scope="module")
def setup():
  model = Transformer(tiny_model_config(vocab_size=VOCAB, max_len=80))
  params = init_params(model, seed=2, scale=1.5)
  src = random_tokens(np.random.default_rng(5), 5, 9, VOCAB, lengths=[9, 4, 7, 2, 6])
  return model, params, jnp.asarray(src)


def test_the_cache_spans_several_blocks():
  assert kv_cache.cache_blocks(DECODE_LEN) == [(0, 16), (16, 16), (32, 32), (64, 6)]


def as_tuple(row):
  return tuple(int(t) for t in np.asarray(row) if t != PAD_ID)


@pytest.mark.parametrize("beam_size,nbest,slots", [(4, 2, 2), (3, 3, 5)])
def test_long_beam_search_is_the_reference_search(setup, beam_size, nbest, slots):
  model, params, src = setup
  result = decoding.decode(decoding.BeamSearch(beam_size, 0.6, nbest), model, params, src,
                           jnp.asarray(LIMITS), DECODE_LEN, jnp.asarray(MIN_LEN), slots)
  lengths = []
  for row in range(len(LIMITS)):
    expected = reference.beam_search(model, params, np.asarray(src[row]), int(LIMITS[row]),
                                     beam_size, 0.6, min_len=int(MIN_LEN[row]), nbest=nbest)[:nbest]
    got = [as_tuple(t) for t in result.tokens[row][:len(expected)]]
    assert got == [seq for seq, _ in expected], f"sentence {row}"
    np.testing.assert_allclose(np.asarray(result.scores[row][:len(expected)]),
                               [score for _, score in expected], rtol=1e-5, atol=1e-5)
    lengths.append(len(got[0]))
  # What the test exercises: outputs past 40 and past 64 positions, and some that end early.
  assert max(lengths) > 64 and sum(n >= 40 for n in lengths) >= 2 and min(lengths) < LIMITS.min()


def test_long_greedy_search_is_the_reference_search(setup):
  model, params, src = setup
  result = decoding.decode(decoding.Greedy(), model, params, src, jnp.asarray(LIMITS), DECODE_LEN,
                           jnp.asarray(MIN_LEN), slots=2)
  for row in range(len(LIMITS)):
    seq, log_prob = reference.greedy_search(model, params, np.asarray(src[row]), int(LIMITS[row]),
                                            min_len=int(MIN_LEN[row]))
    assert as_tuple(result.tokens[row, 0]) == seq
    assert seq[-1] == EOS_ID and len(seq) > MIN_LEN[row]
    np.testing.assert_allclose(float(result.scores[row, 0]), log_prob, rtol=1e-5, atol=1e-5)
