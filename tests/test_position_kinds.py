"""Every registered positional encoding, exact everywhere: the cached searches against full forward
passes without a cache (textbook.py) and forced decoding, packed rows against the same pairs one per
row, bf16 products against float32, sharding rules, parameter and FLOP counts; and each kind's own
arithmetic against a plain numpy reference (T5's buckets, ALiBi's slopes, a rotation, Shaw's
attention written with the [T, S, d] tables the fast path never builds)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer import decoding, partitioning
from transformer.config import ConfigError, base_config, validate
from transformer.data import batching
from transformer.decoding import textbook
from transformer.model import positions
from transformer.model.positions.alibi import alibi_slopes
from transformer.model.positions.rotary import rotate, rotation_angles
from transformer.model.positions.t5 import relative_bucket
from transformer.model.size import analytic_param_count, training_flops_per_target_token
from transformer.model.transformer import PAD_ID, Transformer, initial_params

KINDS = positions.kinds()
VOCAB = 12
pytestmark = pytest.mark.core


@functools.cache
def kind_model(kind: str, **overrides):
  """A tiny model of `kind` (small clip and buckets so that short outputs reach their limits)."""
  options = {"relative_clip": 2, "t5_buckets": 8, "t5_max_distance": 12}
  model = Transformer(tiny_model_config(vocab_size=VOCAB, positional=kind,
                                        position_options=tuple(options.items()), **overrides))
  return model, init_params(model, seed=3, scale=2.0)


SOURCE = jnp.asarray(random_tokens(np.random.default_rng(1), 3, 9, VOCAB, lengths=[9, 6, 3]))
LIMITS = np.array([12, 9, 7])


@pytest.mark.slow  # the default run checks every kind's cache through beam search's scores below
@pytest.mark.parametrize("kind", KINDS)
def test_cached_greedy_is_the_search_without_a_cache(kind):
  model, params = kind_model(kind)
  result = decoding.decode(decoding.Greedy(), model, params, SOURCE, jnp.asarray(LIMITS), 12)
  for row in range(len(LIMITS)):
    seq, log_prob = textbook.greedy_search(model, params, np.asarray(SOURCE[row]), int(LIMITS[row]))
    assert tuple(int(t) for t in np.asarray(result.tokens[row, 0]) if t != PAD_ID) == seq
    np.testing.assert_allclose(float(result.scores[row, 0]), log_prob, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_beam_scores_are_forced_decoding_scores(kind):
  """Three hypotheses a sentence in the cache (slot = position x 3 + hypothesis): each one's score
  is its full forward pass's log-probability over the length penalty."""
  model, params = kind_model(kind)
  result = decoding.decode(decoding.BeamSearch(3, 0.6, 3), model, params, SOURCE,
                           jnp.asarray(LIMITS), 12)
  for hypothesis in range(3):
    tokens = result.tokens[:, hypothesis]
    forced = decoding.forced_log_probs(model, params, SOURCE, tokens).sum(-1)
    penalty = decoding.length_penalty((tokens != PAD_ID).sum(-1), 0.6)
    np.testing.assert_allclose(result.scores[:, hypothesis], forced / penalty, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_is_the_textbook_beam_search(kind):
  model, params = kind_model(kind)
  result = decoding.decode(decoding.BeamSearch(3, 0.6, 3), model, params, SOURCE,
                           jnp.asarray(LIMITS), 12)
  for row in range(len(LIMITS)):
    expected = textbook.beam_search(model, params, SOURCE[row], LIMITS[row], 3, 0.6, nbest=3)
    got = [tuple(int(t) for t in np.asarray(result.tokens[row, i]) if t != PAD_ID)
           for i in range(len(expected))]
    assert got == [seq for seq, _ in expected]


@pytest.mark.parametrize("kind", KINDS)
def test_packed_rows_keep_each_pairs_positions_to_itself(kind):
  """Packed several to a row or one per row, every target token's log-probability is the same: no
  bias, rotation or embedding crosses a pair, and each pair's positions start at 0."""
  model, params = kind_model(kind)
  rng = np.random.default_rng(4)
  lengths = [(3, 5), (6, 2), (2, 2), (7, 6), (4, 8)]
  source = [np.append(rng.integers(4, VOCAB, a), 1).astype(np.int32) for a, _ in lengths]
  target = [np.append(rng.integers(4, VOCAB, b), 1).astype(np.int32) for _, b in lengths]
  rows = [[0, 1, 2], [3, 4]]
  packed = batching.pairs_batch(source, target, rows, 16, len(rows), packed=True)
  alone = batching.pairs_batch(source, target, [[i] for i in range(len(lengths))], 10,
                               len(lengths), packed=False)

  def log_probs(batch):
    from transformer.model.transformer import shift_right
    extra = {k: batch[k] for k in ("src_segments", "src_positions", "tgt_segments", "tgt_positions")
             if k in batch}
    tgt_in = shift_right(batch["tgt"], batch.get("tgt_segments"))
    logits = model.apply({"params": params}, batch["src"], tgt_in, **extra)
    return np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), batch["tgt"][..., None], -1)[..., 0]

  packed_lp, alone_lp = log_probs(packed), log_probs(alone)
  for r, members in enumerate(rows):
    for segment, i in enumerate(members, start=1):
      np.testing.assert_allclose(packed_lp[r][packed["tgt_segments"][r] == segment],
                                 alone_lp[i][:len(target[i])], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_products_follow_float32(kind):
  """bf16 activations and products: the positions' terms stay float32, so logits move by bf16's
  rounding only (~0.5% of a logit here, as the paper's sinusoids do)."""
  options = kind_model(kind)[0].config.position_options
  model = Transformer(tiny_model_config(vocab_size=VOCAB, positional=kind, position_options=options))
  low = model.clone(config=tiny_model_config(vocab_size=VOCAB, positional=kind, position_options=options,
                                             dtype=jnp.bfloat16, matmul_dtype=jnp.dtype(jnp.bfloat16)))
  params = init_params(model, seed=3)
  full = model.apply({"params": params}, SOURCE, SOURCE[:, ::-1])
  half = low.apply({"params": params}, SOURCE, SOURCE[:, ::-1])
  assert half.dtype == jnp.float32
  error = np.abs(np.asarray(half - full))
  assert error.max() < 0.08 and error.mean() < 0.012 * float(jnp.abs(full).mean()) / 0.8


@pytest.mark.parametrize("kind", KINDS)
def test_counts_and_sharding_rules_cover_the_kinds_parameters(kind):
  model, params = kind_model(kind)
  assert analytic_param_count(model.config) == sum(x.size for x in jax.tree.leaves(params))
  boxed = jax.eval_shape(lambda: initial_params(model, jax.random.key(0), logical_axes=True))
  known = {name for name, _ in partitioning.RULES}
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: hasattr(x, "names")):
    assert set(leaf.names) <= known, leaf.names
  base = training_flops_per_target_token(kind_model("sinusoidal")[0].config, 20, 22)
  own = training_flops_per_target_token(model.config, 20, 22)
  expected = 3 * positions.get(kind).flops_per_target_token(model.config, 20, 22)
  assert own == pytest.approx(base + expected)


@pytest.mark.parametrize("kind", KINDS)
def test_the_figure_draws_what_the_kind_declares(kind):
  model, params = kind_model(kind)
  for drawing in positions.get(kind).drawings(model.config, params, 6).values():
    assert drawing.values.ndim == 2 and drawing.values.size


# ----------------------------------------------------------------------- each kind's own arithmetic

def test_t5_buckets_are_t5s():
  """T5's function (mesh-tensorflow's _relative_position_bucket) by hand: 32 buckets, 128 at most."""
  offsets = np.array([-200, -128, -64, -20, -16, -15, -8, -7, -1, 0, 1, 7, 8, 15, 16, 20, 64, 200])
  def reference(n, bidirectional, buckets=32, max_distance=128):
    n, bucket = -n, 0
    if bidirectional:
      buckets //= 2
      bucket = buckets if n < 0 else 0
      n = abs(n)
    else:
      n = max(n, 0)
    exact = buckets // 2
    if n < exact:
      return bucket + n
    far = exact + int(np.float32(np.log(np.float32(n) / exact)) / math.log(max_distance / exact)
                      * (buckets - exact))
    return bucket + min(far, buckets - 1)
  for bidirectional in (True, False):
    got = relative_bucket(jnp.asarray(offsets), bidirectional, 32, 128)
    assert list(np.asarray(got)) == [reference(int(n), bidirectional) for n in offsets]
  assert list(np.asarray(relative_bucket(jnp.asarray([-1, 0, 1]), True, 32, 128))) == [1, 0, 17]


def test_t5s_check_accepts_exactly_the_settings_whose_buckets_stay_in_range():
  """Bucket counts from 4 to 32, maximum distances around both stacks' ends of their exact buckets
  (t5_buckets / 4 and / 2) and beyond: the check accepts a setting
  if and only if both stacks' buckets of every offset lie in [0, t5_buckets); in the smallest
  setting accepted for 8 buckets the decoder's logits are finite."""
  offsets = jnp.arange(-300, 301)
  for buckets in (4, 6, 8, 10, 16, 32):
    quarter, half = buckets // 4, buckets // 2
    for distance in sorted({max(quarter - 1, 2), quarter, quarter + 1, half - 1, half, half + 1,
                            half + 2, 4 * buckets} - {0, 1}):
      cfg = base_config()
      cfg.model.positional, cfg.model.t5_buckets, cfg.model.t5_max_distance = "t5", buckets, distance
      try:
        positions.check_config(cfg)
        accepted = True
      except ConfigError as e:
        assert "where the decoder's exact buckets end" in str(e)
        accepted = False
      in_range = all(bool(((b >= 0) & (b < buckets)).all())
                     for b in (relative_bucket(offsets, bidirectional, buckets, distance)
                               for bidirectional in (True, False)))
      assert accepted == in_range, (buckets, distance)
  # The smallest distance accepted for 8 buckets: finite logits over 40 target positions.
  model = Transformer(tiny_model_config(vocab_size=VOCAB, positional="t5", max_len=48,
                                        position_options=(("t5_buckets", 8), ("t5_max_distance", 5))))
  target = jnp.asarray(random_tokens(np.random.default_rng(2), 3, 40, VOCAB))
  logits = model.apply({"params": init_params(model, seed=3, scale=2.0)}, SOURCE, target)
  assert bool(jnp.isfinite(logits).all())
  cfg = base_config()
  cfg.model.positional, cfg.model.t5_buckets, cfg.model.t5_max_distance = "t5", 8, 4
  with pytest.raises(ConfigError, match=r"t5_max_distance \(4\) must be more than "
                                        r"config.model.t5_buckets / 2 \(4\)"):
    validate(cfg)


def test_alibi_slopes_are_the_papers():
  np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
  # 6 heads: the 4 of a power of two, then every other slope of 8 heads
  np.testing.assert_allclose(alibi_slopes(6), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def test_rotation_is_complex_multiplication_and_depends_on_offsets_only(rng):
  x = rng.normal(size=(1, 5, 2, 8)).astype(np.float32)
  at = jnp.arange(5)[None] + 3
  turned = np.asarray(rotate(jnp.asarray(x), rotation_angles(at, 8, 10000.0)))
  theta = 10000.0 ** (-np.arange(0, 8, 2) / 8)
  pairs = x[..., 0::2] + 1j * x[..., 1::2]
  expected = pairs * np.exp(1j * (np.arange(5)[:, None] + 3) * theta)[None, :, None, :]
  np.testing.assert_allclose(turned[..., 0::2], expected.real, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(turned[..., 1::2], expected.imag, rtol=1e-5, atol=1e-5)
  shifted = np.asarray(rotate(jnp.asarray(x), rotation_angles(at + 40, 8, 10000.0)))
  scores = lambda r: np.einsum("thk,shk->hts", r[0], r[0])
  np.testing.assert_allclose(scores(turned), scores(shifted), rtol=1e-4, atol=1e-4)


def test_relative_attention_is_shaws_written_with_full_tables(rng):
  """The encoder's first self-attention against e_ij = q_i (k_j + a^K_ij) / sqrt(d),
  z_i = sum_j w_ij (v_j + a^V_ij), with a^K, a^V [T, S, d] built in numpy."""
  model, params = kind_model("relative")
  cfg = model.config
  x = rng.normal(size=(1, 6, cfg.d_model)).astype(np.float32)
  layer = params["encoder"]["layer_0"]["self_attention"]
  from transformer.model.transformer import MultiHeadAttention
  prepared = positions.get("relative")(cfg).prepare(jnp.arange(6)[None], jnp.arange(6)[None], False)
  got = MultiHeadAttention(cfg, relate=True).apply({"params": layer}, x, x, None, deterministic=True,
                                                   prepared=prepared)
  proj = lambda name: np.einsum("btd,dhk->bthk", x, layer[name]["kernel"]) + layer[name]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")
  clip = positions.option(cfg, "relative_clip")
  index = np.clip(np.arange(6)[None, :] - np.arange(6)[:, None], -clip, clip) + clip
  a_k, a_v = np.asarray(layer["relative_keys"])[index], np.asarray(layer["relative_values"])[index]
  logits = (np.einsum("bthk,bshk->bhts", q, k) + np.einsum("bthk,tsk->bhts", q, a_k)) / np.sqrt(q.shape[-1])
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  z = np.einsum("bhts,bshv->bthv", w, v) + np.einsum("bhts,tsv->bthv", w, a_v)
  want = np.einsum("bthv,hvd->btd", z, layer["out"]["kernel"]) + layer["out"]["bias"]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
