"""Beam search against greedy search, teacher-forced scores and an exhaustive search."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import init_params, random_tokens, tiny_model_config

from transformer import decode
from transformer.model import EOS_ID, PAD_ID, Transformer, shift_right


@pytest.fixture(scope="module")
def setup():
  model = Transformer(tiny_model_config(vocab_size=12))
  params = init_params(model, seed=1, scale=2.0)
  src = random_tokens(np.random.default_rng(1), 4, 6, 12, lengths=[6, 5, 3, 2])
  return model, params, jnp.asarray(src)


def teacher_forced_score(model, params, src, tokens, alpha):
  tgt = jnp.asarray(tokens)
  log_probs = jax.nn.log_softmax(model.apply({"params": params}, src, shift_right(tgt)))
  token_log_probs = jnp.take_along_axis(log_probs, tgt[..., None], -1)[..., 0] * (tgt != PAD_ID)
  return token_log_probs.sum(-1) / decode.length_penalty((tgt != PAD_ID).sum(-1), alpha)


def test_beam_of_one_without_length_penalty_is_greedy(setup):
  model, params, src = setup
  limits = jnp.array([9, 7, 5, 8])
  greedy = jax.jit(functools.partial(decode.greedy_search, model, decode_len=10))(params, src, limits)
  beam, _ = jax.jit(functools.partial(decode.beam_search, model, decode_len=10, beam_size=1,
                                      alpha=0.0))(params, src, limits)
  np.testing.assert_array_equal(beam, greedy)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_scores_are_the_models_penalised_log_probabilities(setup, alpha):
  model, params, src = setup
  limits = jnp.array([9, 7, 5, 8])
  tokens, scores = decode.beam_search(model, params, src, limits, 10, beam_size=4, alpha=alpha)
  np.testing.assert_allclose(scores, teacher_forced_score(model, params, src, tokens, alpha),
                             rtol=1e-4, atol=1e-4)
  lengths = np.asarray((tokens != PAD_ID).sum(-1))
  assert (lengths <= np.asarray(limits)).all()
  for row, n in zip(np.asarray(tokens), lengths):  # every output ends in its only EOS
    assert row[n - 1] == EOS_ID and EOS_ID not in row[:n - 1]


def test_wide_beam_finds_the_exhaustive_optimum(setup):
  model, params, src = setup
  src = src[:1]
  vocab, max_len, alpha = 12, 3, 0.6
  best, best_score = None, -np.inf
  for n in range(1, max_len + 1):  # every sequence of n tokens whose last (only) EOS ends it
    for prefix in itertools.product(range(3, vocab), repeat=n - 1):  # not PAD, EOS or BOS
      tokens = np.array([list(prefix) + [EOS_ID]], np.int32)
      score = float(teacher_forced_score(model, params, src, tokens, alpha)[0])
      if score > best_score:
        best, best_score = tokens[0], score
  tokens, score = decode.beam_search(model, params, src, jnp.array([max_len]), max_len,
                                     beam_size=(vocab - 3) ** (max_len - 1), alpha=alpha)
  np.testing.assert_array_equal(np.asarray(tokens[0][:len(best)]), best)
  np.testing.assert_allclose(float(score[0]), best_score, rtol=1e-5)


def test_greedy_respects_each_sentences_length_limit(setup):
  model, params, src = setup
  limits = jnp.array([1, 2, 3, 4])
  tokens = decode.greedy_search(model, params, src, limits, 6)
  lengths = np.asarray((tokens != PAD_ID).sum(-1))
  assert (lengths <= np.asarray(limits)).all()
  assert np.asarray(tokens)[0, 0] == EOS_ID


def test_minimum_lengths_forbid_eos_until_reached(setup):
  model, params, src = setup
  limits = jnp.array([2, 3, 5, 6])
  tokens, _ = decode.beam_search(model, params, src, jnp.full((4,), 6), 6, beam_size=3,
                                 min_lengths=limits)
  tokens = np.asarray(tokens)
  lengths = (tokens != PAD_ID).sum(-1)
  assert (lengths >= np.asarray(limits)).all()
  for row, n in enumerate(lengths):  # EOS only at the end, never earlier
    assert tokens[row, n - 1] == EOS_ID and EOS_ID not in tokens[row, :n - 1]
