"""The searches against plain references (transformer/decoding/textbook.py): a textbook beam search on full
forward passes, exhaustive search, greedy by argmax, sampling frequencies, ensembles and forced
scores; short outputs here, long ones (several cache blocks) in test_long_outputs.py."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer import decoding, partitioning
from transformer.decoding import textbook as reference
from transformer.decoding import translator
from transformer.model.transformer import BOS_ID, EOS_ID, PAD_ID, Transformer
from transformer.model.vocab_projection import SEARCH_MATRIX

VOCAB = 12
SLOW = pytest.mark.slow  # more cases of a kind the default run covers once (pytest -m slow)
pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def setup():
  model = Transformer(tiny_model_config(vocab_size=VOCAB))
  params = init_params(model, seed=1, scale=2.0)
  src = random_tokens(np.random.default_rng(1), 4, 6, VOCAB, lengths=[6, 5, 3, 2])
  return model, params, jnp.asarray(src)


def next_log_probs(model, params, src_row, prefixes, shape=(1, 16)):
  return reference.next_log_probs(model, params, src_row, prefixes, shape)


def beam(models, params, src, limits, decode_len, beam_size=4, alpha=0.6, nbest=1, min_len=None,
         slots=None):
  """decoding.decode with a BeamSearch: Result [N, nbest, ...]."""
  return decoding.decode(decoding.BeamSearch(beam_size, alpha, nbest), models, params, src,
                         jnp.asarray(limits), decode_len, min_len, slots)


def greedy(models, params, src, limits, decode_len, slots=None):
  result = decoding.decode(decoding.Greedy(), models, params, src, jnp.asarray(limits), decode_len,
                           slots=slots)
  return result.tokens[:, 0], result.scores[:, 0]


def sample(model, params, src, limits, decode_len, keys, slots=None, **options):
  result = decoding.decode(decoding.Sampling(keys=keys, **options), model, params, src,
                           jnp.asarray(limits), decode_len, slots=slots)
  return result.tokens[:, 0], result.scores[:, 0]


def as_lists(tokens):
  """Token rows without padding."""
  return [tuple(int(t) for t in row if t != PAD_ID) for row in np.asarray(tokens)]


@pytest.mark.parametrize("beam_size,alpha,slots", [(4, 0.6, None), (2, 0.6, 1),
                                              pytest.param(3, 0.0, None, marks=SLOW),
                                              pytest.param(4, 1.0, 2, marks=SLOW),
                                              pytest.param(1, 0.6, 3, marks=SLOW)])
def test_beam_search_returns_what_the_reference_search_returns(setup, beam_size, alpha, slots):
  model, params, src = setup
  limits = np.array([9, 7, 5, 8])
  result = jax.jit(functools.partial(beam, model, decode_len=10, beam_size=beam_size, alpha=alpha,
                                     nbest=beam_size, slots=slots))(params, src, jnp.asarray(limits))
  tokens, scores = result.tokens, result.scores
  for row in range(len(limits)):
    expected = reference.beam_search(model, params, src[row], limits[row], beam_size, alpha,
                                     nbest=beam_size)
    assert as_lists(tokens[row])[:len(expected)] == [seq for seq, _ in expected]
    np.testing.assert_allclose(np.asarray(scores[row])[:len(expected)],
                               [score for _, score in expected], rtol=1e-5, atol=1e-5)


def top_k_by_sorting(x, k):
  """numpy's stable sort: the k largest, ties to the lower index (lax.top_k's order)."""
  order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
  return np.take_along_axis(x, order, -1), order


@pytest.mark.parametrize("shape,k", [((6, 3000), 8), ((2, 4, 1600), 6), ((5, 400), 1),
                                     ((3, 97), 2), ((3, 64), 8)])  # the last two: lax.top_k
def test_chunked_top_k_is_a_stable_sort(shape, k):
  rng = np.random.default_rng(0)
  x = rng.normal(size=shape).astype(np.float32)
  ties = np.round(x * 2).astype(np.float32)  # few distinct values: every chunk holds ties
  forbidden = np.where(rng.random(shape) < 0.9, decoding.IMPOSSIBLE, x).astype(np.float32)
  for case in (x, ties, forbidden, np.full(shape, decoding.IMPOSSIBLE, np.float32)):
    values, indices = jax.jit(decoding.top_k, static_argnums=1)(jnp.asarray(case), k)
    want_values, want_indices = top_k_by_sorting(case, k)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    np.testing.assert_array_equal(np.asarray(values), want_values)


def test_searches_over_a_vocabulary_wide_enough_for_chunked_top_k():
  """Vocabulary 400: beam search's 4 x 400 candidates and greedy search's 400 go through the
  chunked top-k (the other tests' vocabulary is small enough for lax.top_k)."""
  vocab = 400
  model = Transformer(tiny_model_config(vocab_size=vocab))
  params = init_params(model, seed=3, scale=3.0)
  src = jnp.asarray(random_tokens(np.random.default_rng(2), 3, 6, vocab, lengths=[6, 4, 3]))
  limits = np.array([9, 6, 8])
  result = beam(model, params, src, jnp.asarray(limits), 10, beam_size=4, alpha=0.6, nbest=2)
  tokens, log_probs = greedy(model, params, src, jnp.asarray(limits), 10)
  for row in range(len(limits)):
    expected = reference.beam_search(model, params, src[row], limits[row], 4, 0.6, nbest=2)[:2]
    assert as_lists(result.tokens[row])[:len(expected)] == [seq for seq, _ in expected]
    np.testing.assert_allclose(np.asarray(result.scores[row])[:len(expected)],
                               [score for _, score in expected], rtol=1e-5, atol=1e-5)
    seq, log_prob = reference.greedy_search(model, params, src[row], int(limits[row]))
    assert as_lists(tokens)[row] == seq
    # scale-3 weights give logits of ~30 and row 0's EOS forced at the limit log p ~ -38: float32
    # cached steps and full passes differ there by ~7e-5 relative on AVX2-only CPUs (Zen 3)
    np.testing.assert_allclose(float(log_probs[row]), log_prob, rtol=2e-4, atol=1e-5)


def test_minimum_lengths_match_the_reference_and_forbid_early_eos(setup):
  model, params, src = setup
  min_len = np.array([1, 2, 4, 5])  # tokens before EOS
  tokens = beam(model, params, src, jnp.full((4,), 7), 7, beam_size=3,
                min_len=jnp.asarray(min_len), slots=2).tokens[:, 0]
  for row, seq in enumerate(as_lists(tokens)):
    assert len(seq) > min_len[row] and seq[-1] == EOS_ID and EOS_ID not in seq[:-1]
    expected = reference.beam_search(model, params, src[row], 7, 3, 0.6, min_len=min_len[row])
    assert seq == expected[0][0]


def teacher_forced_score(model, params, src, tokens, alpha):
  tgt = jnp.asarray(tokens)
  token_log_probs = decoding.forced_log_probs(model, params, src, tgt)
  return token_log_probs.sum(-1) / decoding.length_penalty((tgt != PAD_ID).sum(-1), alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_scores_are_the_models_penalised_log_probabilities(setup, alpha):
  model, params, src = setup
  limits = jnp.array([9, 7, 5, 8])
  result = beam(model, params, src, limits, 10, beam_size=4, alpha=alpha)
  tokens, scores = result.tokens[:, 0], result.scores[:, 0]
  np.testing.assert_allclose(scores, teacher_forced_score(model, params, src, tokens, alpha),
                             rtol=1e-4, atol=1e-4)
  lengths = np.asarray((tokens != PAD_ID).sum(-1))
  assert (lengths <= np.asarray(limits)).all()
  for row, n in zip(np.asarray(tokens), lengths):  # every output ends in its only EOS
    assert row[n - 1] == EOS_ID and EOS_ID not in row[:n - 1]


def test_wide_beam_finds_the_exhaustive_optimum(setup):
  model, params, src = setup
  src = src[:1]
  max_len, alpha = 3, 0.6
  best, best_score = None, -np.inf
  for n in range(1, max_len + 1):  # every sequence of n tokens whose last (only) EOS ends it
    tokens = np.array([list(prefix) + [EOS_ID]  # not PAD, EOS or BOS before it
                       for prefix in itertools.product(range(3, VOCAB), repeat=n - 1)], np.int32)
    scores = teacher_forced_score(model, params, jnp.repeat(src, len(tokens), axis=0), tokens, alpha)
    i = int(np.argmax(scores))
    if scores[i] > best_score:
      best, best_score = tokens[i], float(scores[i])
  result = beam(model, params, src, jnp.array([max_len]), max_len,
                beam_size=(VOCAB - 3) ** (max_len - 1), alpha=alpha)
  tokens, score = result.tokens[:, 0], result.scores[:, 0]
  np.testing.assert_array_equal(np.asarray(tokens[0][:len(best)]), best)
  np.testing.assert_allclose(float(score[0]), best_score, rtol=1e-5)


@pytest.mark.parametrize("slots", [3, pytest.param(None, marks=SLOW), pytest.param(1, marks=SLOW)])
def test_greedy_is_the_argmax_path_and_a_beam_of_one_without_penalty(setup, slots):
  model, params, src = setup
  limits = jnp.array([9, 7, 2, 8])
  tokens, log_probs = jax.jit(functools.partial(greedy, model, decode_len=10, slots=slots))(
      params, src, limits)
  expected = [reference.greedy_search(model, params, src[i], int(limits[i])) for i in range(4)]
  assert as_lists(tokens) == [seq for seq, _ in expected]
  np.testing.assert_allclose(log_probs, [log_prob for _, log_prob in expected], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(log_probs, teacher_forced_score(model, params, src, tokens, 0.0),
                             rtol=1e-5, atol=1e-5)
  beam_of_one = beam(model, params, src, limits, 10, beam_size=1, alpha=0.0).tokens[:, 0]
  np.testing.assert_array_equal(beam_of_one, tokens)


def test_queue_padding_is_not_decoded_and_slots_do_not_change_results(setup):
  model, params, src = setup
  queue = jnp.concatenate([src, jnp.zeros_like(src[:2])])  # two padding entries at the end
  limits = jnp.array([9, 7, 5, 8, 0, 0])
  full = beam(model, params, src, limits[:4], 10, beam_size=3).tokens
  for slots in (1, 2, 5):
    result = beam(model, params, queue, limits, 10, beam_size=3, slots=slots)
    np.testing.assert_array_equal(result.tokens[:4], full)
    assert (np.asarray(result.tokens[4:]) == PAD_ID).all()
    assert (np.asarray(result.scores[4:]) == decoding.IMPOSSIBLE).all()


def keys_for(n, seed=0):
  return jax.vmap(jax.random.fold_in, (None, 0))(jax.random.key(seed), jnp.arange(n))


@pytest.mark.slow
def test_sampling_is_reproducible_and_independent_of_slots(setup):
  model, params, src = setup
  limits = jnp.array([9, 7, 5, 8])
  runs = [sample(model, params, src, limits, 10, keys_for(4), slots=s) for s in (None, 1)]
  np.testing.assert_array_equal(runs[0][0], runs[1][0])
  first_two = sample(model, params, src[:2], limits[:2], 10, keys_for(4)[:2])
  np.testing.assert_array_equal(first_two[0], runs[0][0][:2])  # a sentence's key decides its sample
  other_seed = sample(model, params, src, limits, 10, keys_for(4, seed=1))
  assert not np.array_equal(other_seed[0], runs[0][0])
  np.testing.assert_allclose(runs[0][1], teacher_forced_score(model, params, src, runs[0][0], 0.0),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-4}])
def test_sampling_limits_that_leave_one_token_are_greedy(setup, options):
  model, params, src = setup
  limits = jnp.array([9, 7, 5, 8])
  tokens, _ = sample(model, params, src, limits, 10, keys_for(4), **options)
  np.testing.assert_array_equal(tokens, greedy(model, params, src, limits, 10)[0])


@pytest.mark.parametrize("options", [{"top_p": 0.6}, pytest.param({"temperature": 2.0}, marks=SLOW),
                                     pytest.param({"top_k": 3}, marks=SLOW)])
def test_sampled_first_tokens_follow_the_filtered_distribution(setup, options):
  model, params, src = setup
  n = 3000
  queue = jnp.repeat(src[:1], n, axis=0)
  tokens, _ = jax.jit(lambda p, q, k: sample(model, p, q, jnp.full((n,), 5), 5, k,
                                                    slots=500, **options))(params, queue, keys_for(n))
  counts = np.bincount(np.asarray(tokens[:, 0]), minlength=VOCAB) / n
  log_probs = next_log_probs(model, params, src[0], [()])[0]
  log_probs[[PAD_ID, BOS_ID]] = -np.inf
  logits = log_probs / options.get("temperature", 1.0)
  order = np.argsort(-logits)
  keep = np.ones(VOCAB, bool)
  if "top_k" in options:
    keep[order[options["top_k"]:]] = False
  if "top_p" in options:
    probs = np.exp(logits[order] - logits.max()) / np.exp(logits - logits.max()).sum()
    keep[order[(np.cumsum(probs) - probs) >= options["top_p"]]] = False
  expected = np.where(keep, np.exp(logits - logits.max()), 0.0)
  np.testing.assert_allclose(counts, expected / expected.sum(), atol=0.03)


@pytest.mark.parametrize("shared", [True, False])
def test_the_searches_transposed_projection_matrix_gives_the_reference_hypotheses(shared):
  model = Transformer(tiny_model_config(vocab_size=VOCAB, share_embeddings=shared))
  params = init_params(model, seed=2, scale=2.0)
  src = jnp.asarray(random_tokens(np.random.default_rng(2), 3, 5, VOCAB, lengths=[5, 4, 2]))
  (searched,) = translator.search_params([model], [params], partitioning.data_mesh())
  matrix = params["embed"]["embedding"] if shared else params["decoder"]["output_embedding"]
  np.testing.assert_array_equal(searched["decoder"][SEARCH_MATRIX], np.asarray(matrix).T)
  limits = np.array([8, 6, 5])
  result = beam(model, searched, src, limits, 9, beam_size=3, nbest=3)
  for row in range(len(limits)):
    expected = reference.beam_search(model, params, src[row], limits[row], 3, 0.6, nbest=3)
    assert as_lists(result.tokens[row])[:len(expected)] == [seq for seq, _ in expected]
    np.testing.assert_allclose(np.asarray(result.scores[row])[:len(expected)],
                               [score for _, score in expected], rtol=1e-5, atol=1e-5)
  # The decoder reads the transposed copy when it is there: a different matrix, other log-probs.
  other = {**searched, "decoder": {**searched["decoder"], SEARCH_MATRIX: -searched["decoder"][
      SEARCH_MATRIX]}}
  assert not np.allclose(beam(model, other, src, limits, 9, beam_size=3).scores,
                         result.scores[:, :1])


def test_an_ensemble_of_one_model_twice_is_the_model(setup):
  model, params, src = setup
  limits = jnp.array([9, 7, 5, 8])
  single = beam(model, params, src, limits, 10, beam_size=3)
  double = beam((model, model), (params, params), src, limits, 10, beam_size=3)
  np.testing.assert_array_equal(double.tokens, single.tokens)
  np.testing.assert_allclose(double.scores, single.scores, rtol=1e-6)


def test_ensemble_scores_are_mean_log_probabilities_of_different_models(setup):
  model, params, src = setup
  other = Transformer(tiny_model_config(vocab_size=VOCAB, num_layers=1, d_model=8, num_heads=2))
  other_params = init_params(other, seed=3, scale=2.0)
  limits = jnp.array([9, 7, 5, 8])
  models, both = (model, other), (params, other_params)
  result = beam(models, both, src, limits, 10, beam_size=3, alpha=0.6)
  tgt, scores = jnp.asarray(result.tokens[:, 0]), result.scores[:, 0]
  mean = (decoding.forced_log_probs(model, params, src, tgt)
          + decoding.forced_log_probs(other, other_params, src, tgt)) / 2
  np.testing.assert_allclose(decoding.forced_log_probs(models, both, src, tgt), mean, atol=1e-6)
  lengths = (tgt != PAD_ID).sum(-1)
  np.testing.assert_allclose(scores, mean.sum(-1) / decoding.length_penalty(lengths, 0.6),
                             rtol=1e-4, atol=1e-4)


def test_forced_log_probs_are_log_softmax_at_the_targets(setup):
  model, params, src = setup
  tgt = random_tokens(np.random.default_rng(2), 4, 5, VOCAB, lengths=[5, 2, 4, 1])
  got = np.asarray(decoding.forced_log_probs(model, params, src, jnp.asarray(tgt)))
  for row in range(4):
    prefix = ()
    for t, token in enumerate(tgt[row]):
      if token == PAD_ID:
        assert got[row, t] == 0.0
        continue
      expected = next_log_probs(model, params, src[row], [prefix])[0, token]
      np.testing.assert_allclose(got[row, t], expected, rtol=1e-5, atol=1e-5)
      prefix += (int(token),)


def test_a_search_names_itself_and_its_options_in_reports():
  """describe() (what names a search's reports and their files) comes from the search's own name
  and options: a Greedy subclass that writes no describe() of its own does not pass for greedy."""
  import dataclasses

  from transformer.decoding.options import Option

  @dataclasses.dataclass(frozen=True)
  class Widest(decoding.Greedy):
    name = "toy_widest"
    OPTIONS = (Option("toy_width", 2, "A toy option."),)
    toy_width: int = 2

  assert Widest(toy_width=3).describe() == {"search": "toy_widest", "toy_width": 3, "beam_size": 1}
  assert decoding.Greedy().describe() == {"search": "greedy", "beam_size": 1}
  assert decoding.BeamSearch(5, 1.0, 2).describe() == {"search": "beam", "beam_size": 5,
                                                       "alpha": 1.0, "nbest": 2}


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_beam_search_with_fairseqs_length_penalty_is_the_reference_search_with_it(setup, alpha):
  """fairseq's --lenpen: a finished hypothesis scored log p / n ** alpha; the same early stop."""
  model, params, src = setup
  limits = np.array([9, 7, 5, 8])
  search = decoding.BeamSearch(3, alpha, 3, length_penalty="fairseq")
  result = jax.jit(lambda p, s, lim: decoding.decode(search, model, p, s, lim, 10))(
      params, src, jnp.asarray(limits))
  differs = False
  for row in range(len(limits)):
    expected = reference.beam_search(model, params, src[row], limits[row], 3, alpha, nbest=3,
                                     length_penalty="fairseq")
    assert as_lists(result.tokens[row])[:len(expected)] == [seq for seq, _ in expected]
    np.testing.assert_allclose(np.asarray(result.scores[row])[:len(expected)],
                               [score for _, score in expected], rtol=1e-5, atol=1e-5)
    gnmt = reference.beam_search(model, params, src[row], limits[row], 3, alpha, nbest=3)
    differs |= [score for _, score in gnmt] != [score for _, score in expected]
  assert differs  # the two penalties score the same hypotheses differently
