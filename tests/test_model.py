"""The model against references: numpy attention, the paper's formulas, masking and caching laws."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, model_config, random_tokens, tiny_model_config

from transformer.model import kv_cache
from transformer.model.attention import CACHE, Keys, attention
from transformer.model.positions.sinusoidal import sinusoidal_encoding
from transformer.model.size import analytic_param_count, param_counts
from transformer.model.transformer import Transformer, embed_tokens, shift_right
from transformer.model.vocab_projection import output_logits

pytestmark = pytest.mark.core


def dot_product_attention(q, k, v, mask):
  """The model's attention over full sequences (one block of keys)."""
  return attention(q, [Keys(k, v, mask)])[0]


def numpy_attention(q, k, v, mask):
  """softmax(Q K^T / sqrt(d_k)) V per batch and head, with float64 loops over heads."""
  b, t, h, d = q.shape
  out = np.zeros((b, t, h, d))
  for bi in range(b):
    for hi in range(h):
      scores = q[bi, :, hi] @ k[bi, :, hi].T / math.sqrt(d)
      scores = np.where(mask[bi, 0], scores, -np.inf)
      weights = np.exp(scores - scores.max(-1, keepdims=True))
      weights /= weights.sum(-1, keepdims=True)
      out[bi, :, hi] = weights @ v[bi, :, hi]
  return out


def test_attention_matches_numpy(rng):
  q, k, v = (rng.standard_normal((2, 5, 3, 8)) for _ in range(3))
  k, v = k[:, :4], v[:, :4]
  mask = rng.random((2, 1, 5, 4)) < 0.7
  mask[..., 0] = True  # every query sees at least one key
  got = dot_product_attention(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                              jnp.asarray(v, jnp.float32), jnp.asarray(mask))
  np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), atol=1e-5)


@pytest.mark.parametrize("reached", [40, 20])
def test_attention_over_cache_blocks_is_the_softmax_over_all_keys(rng, reached):
  """Decoding's blocks (16, 16, 32 positions; flash attention's merge; blocks past the furthest
  query position skipped) give the softmax over the whole cache, in the cache's layout."""
  b, h, g, d, n = 2, 3, 2, 8, 64
  q, k, v = rng.standard_normal((b, h, g, d)), rng.standard_normal((b, h, n, d)), rng.standard_normal((b, h, n, d))
  mask = (rng.random((b, 1, g, n)) < 0.7) & (np.arange(n) <= reached)
  mask[..., 0] = True
  blocks = [Keys(jnp.asarray(np.swapaxes(k[:, :, s:s + w], 2, 3), jnp.float32),
                 jnp.asarray(v[:, :, s:s + w], jnp.float32), jnp.asarray(mask[..., s:s + w]), s)
            for s, w in ((0, 16), (16, 16), (32, 32))]
  got, _ = attention(jnp.asarray(q, jnp.float32), blocks, CACHE, reached=jnp.asarray(reached))
  expected = numpy_attention(np.swapaxes(q, 1, 2), np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2),
                             np.broadcast_to(mask, (b, 1, g, n)))
  np.testing.assert_allclose(got, np.swapaxes(expected, 1, 2), atol=1e-5)


@pytest.mark.parametrize("activation,reference", [
    ("relu", lambda h: np.maximum(h, 0)),
    ("swish", lambda h: h / (1 + np.exp(-h))),
    ("gelu", lambda h: 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2))))])
def test_feed_forward_layer_is_its_formula_with_each_activation(rng, activation, reference):
  from transformer.model.transformer import FeedForward
  layer = FeedForward(tiny_model_config(activation=activation))
  x = jnp.asarray(rng.normal(size=(2, 3, 16)), jnp.float32)
  params = nn.unbox(layer.init(jax.random.key(0), x)["params"])
  wi, wo = (jax.tree.map(np.asarray, params[k]) for k in ("wi", "wo"))
  wi["bias"], wo["bias"] = wi["bias"] + 0.1, wo["bias"] - 0.2  # non-zero biases count too
  out = layer.apply({"params": {"wi": wi, "wo": wo}}, x)
  expected = reference(np.asarray(x) @ wi["kernel"] + wi["bias"]) @ wo["kernel"] + wo["bias"]
  np.testing.assert_allclose(out, expected, atol=1e-5)


def test_sinusoidal_table_is_the_papers_formula():
  length, d = 50, 16
  expected = np.zeros((length, d))
  for pos in range(length):
    for i in range(d // 2):
      expected[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / d))
      expected[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / d))
  np.testing.assert_allclose(sinusoidal_encoding(jnp.arange(length), d), expected, atol=2e-5)


@pytest.mark.parametrize("norm,positional", [("post", "sinusoidal"), ("pre", "learned")])
def test_decoder_is_causal(rng, norm, positional):
  model = Transformer(tiny_model_config(norm=norm, positional=positional))
  params = init_params(model)
  src = random_tokens(rng, 2, 6, 24)
  tgt = random_tokens(rng, 2, 7, 24)
  changed = tgt.copy()
  changed[:, 4] = (changed[:, 4] + 1 - 4) % 20 + 4  # a different real input token at position 4
  before = model.apply({"params": params}, src, tgt)
  after = model.apply({"params": params}, src, changed)
  np.testing.assert_allclose(before[:, :4], after[:, :4], atol=1e-5)
  assert np.abs(before[:, 4:] - after[:, 4:]).max(axis=(0, 2)).min() > 1e-4  # later ones see it


def test_padding_does_not_change_real_positions(rng):
  model = Transformer(tiny_model_config())
  params = init_params(model)
  src, tgt = random_tokens(rng, 2, 6, 24), random_tokens(rng, 2, 5, 24)
  logits = model.apply({"params": params}, src, shift_right(tgt))
  padded_src = np.pad(src, ((0, 0), (0, 3)))
  padded_tgt = np.pad(tgt, ((0, 0), (0, 4)))
  padded = model.apply({"params": params}, padded_src, shift_right(padded_tgt))
  np.testing.assert_allclose(padded[:, :5], logits, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"norm": "pre", "positional": "learned"},
                                       {"share_embeddings": False}, {"d_k": 3, "d_v": 5},
                                       {"scan_layers": True, "remat": "full"},
                                       {"activation": "swish"}])
def test_kv_cache_decoding_equals_full_forward(rng, overrides):
  model = Transformer(tiny_model_config(**overrides))
  params = init_params(model)
  src = random_tokens(rng, 3, 6, 24, lengths=[6, 4, 2])
  tgt_in = shift_right(random_tokens(rng, 3, 5, 24))
  full = model.apply({"params": params}, src, tgt_in)
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  variables, steps = {"params": params}, []
  for t in range(tgt_in.shape[1]):
    mask = (jnp.arange(8) <= t)[None, None, None, :]  # one hypothesis per sentence
    logits, mutated = model.apply(variables, encoded, src, tgt_in[:, t:t + 1], decode=True,
                                  decode_len=8, step=t, self_mask=mask,
                                  mutable=[kv_cache.SELF, kv_cache.SOURCE], method=Transformer.decode)
    variables = {"params": params, **mutated}
    steps.append(logits)
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_logits_are_float32_with_bfloat16_activations(rng):
  model = Transformer(tiny_model_config(dtype=jnp.bfloat16))
  params = init_params(model)
  logits = model.apply({"params": params}, random_tokens(rng, 1, 4, 24), random_tokens(rng, 1, 4, 24))
  assert logits.dtype == jnp.float32
  assert jax.tree.leaves(params)[0].dtype == jnp.float32


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_output_projection_gradients_match_autodiff_of_the_einsum(rng, dtype):
  x = jnp.asarray(rng.normal(size=(3, 5, 16)), dtype)
  matrix = jnp.asarray(rng.normal(size=(40, 16)) / 4, dtype)
  weights = jnp.asarray(rng.normal(size=(3, 5, 40)), jnp.float32)  # a loss that uses every logit
  einsum = lambda x, m: jnp.einsum("btd,vd->btv", x, m, preferred_element_type=jnp.float32)
  loss = lambda project: lambda x, m: (jnp.sin(project(x, m)) * weights).sum()
  ours = jax.grad(loss(output_logits), argnums=(0, 1))(x, matrix)
  reference = jax.grad(loss(einsum), argnums=(0, 1))(x, matrix)
  np.testing.assert_array_equal(output_logits(x, matrix), einsum(x, matrix))
  tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
  for got, want in zip(ours, reference):
    assert got.dtype == want.dtype == dtype
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tolerance, atol=tolerance)


def test_output_projection_backward_multiplies_in_bfloat16_with_bfloat16_inputs(rng):
  x = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.bfloat16)
  matrix = jnp.asarray(rng.normal(size=(16, 8)), jnp.bfloat16)
  _, pullback = jax.vjp(output_logits, x, matrix)
  d_logits = jnp.asarray(rng.normal(size=(2, 3, 16)), jnp.float32)
  jaxpr = jax.make_jaxpr(pullback)(d_logits)
  products = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  assert len(products) == 2
  assert all(v.aval.dtype == jnp.bfloat16 for e in products for v in e.invars)
  d_x, _ = pullback(d_logits)  # the rounded cotangent, by hand
  want = jnp.einsum("btv,vd->btd", d_logits.astype(jnp.bfloat16).astype(jnp.float32),
                    matrix.astype(jnp.float32)).astype(jnp.bfloat16)
  np.testing.assert_allclose(np.float32(d_x), np.float32(want), rtol=1e-2)


def test_bfloat16_embedding_gradient_sums_repeated_tokens_in_float32(rng):
  """A token repeated 1,000 times in a batch (EOS, 'a'): its row's gradient is the float32 sum of
  the rows' bf16 gradients (summed in bf16, as nn.Embed's gather of a bf16 table did, ~5% off)."""
  config = tiny_model_config(dtype=jnp.bfloat16)
  embed = nn.Embed(config.vocab_size, config.d_model, dtype=config.dtype)  # as Transformer makes it
  tokens = jnp.asarray(np.where(rng.random((40, 50)) < 0.5, 3, rng.integers(4, 24, (40, 50))))
  weights = jnp.asarray(rng.normal(size=(40, 50, config.d_model)), jnp.bfloat16)
  table = jnp.asarray(rng.normal(size=(config.vocab_size, config.d_model)) / 4, jnp.float32)
  loss = lambda t: (embed.apply({"params": {"embedding": t}}, tokens, method=lambda e, x: embed_tokens(
      config, e, x)) * weights).astype(jnp.float32).sum()
  grad = jax.jit(jax.grad(loss))(table)
  row_grads = np.float64(weights * jnp.asarray(math.sqrt(config.d_model), jnp.bfloat16))  # bf16 products
  want = np.zeros(table.shape)
  np.add.at(want, np.asarray(tokens), row_grads)
  assert int((tokens == 3).sum()) > 900
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-4)


PAPER_SIZES = {  # (N, d_model, d_ff, heads) -> exact count at a shared vocabulary of 37000
    "base": ((6, 512, 2048, 8), 63_082_496),
    "big": ((6, 1024, 4096, 16), 214_245_376),
}


def hand_count(n, d, f, v, decoder_n=None):
  attention = 4 * (d * d + d)
  ffn = 2 * d * f + f + d
  return n * (attention + ffn + 4 * d) + (decoder_n or n) * (2 * attention + ffn + 6 * d) + v * d


@pytest.mark.parametrize("size", ["base", "big"])
def test_paper_model_parameter_counts(size):
  (n, d, f, h), expected = PAPER_SIZES[size]
  assert hand_count(n, d, f, 37000) == expected
  config = model_config(37000, num_layers=n, d_model=d, d_ff=f, num_heads=h)
  counts = param_counts(config)
  assert sum(c for k, c in counts.items() if "/" not in k) == expected
  assert analytic_param_count(config) == expected


@pytest.mark.parametrize("overrides", [
    dict(num_layers=2),                          # Table 3 row C, N=2
    dict(d_model=256, num_heads=4),              # row C, d_model 256 (d_k 64)
    dict(d_ff=4096),                             # row C, d_ff 4096
    dict(positional="learned", max_len=100),     # row E
    dict(d_k=16),                                # row B (d_v stays 64)
    dict(num_heads=32),                          # row A (d_k = d_v = 16)
    dict(d_model=256, d_k=48, d_v=24),           # widths that are not d_model / h
    dict(norm="pre", share_embeddings=False),
    dict(num_layers=3, decoder_layers=1),        # a deeper encoder than decoder
])
def test_table3_variants_match_the_analytic_formula(overrides):
  config = model_config(37000, **overrides)
  counts = param_counts(config)
  assert sum(c for k, c in counts.items() if "/" not in k) == analytic_param_count(config)


def test_training_flops_per_token_of_the_base_model():
  """Hand count for base at length 32: 3 x (decoder + output per target, encoder per source)."""
  from transformer.model.size import training_flops_per_target_token
  d, f, v, n, length = 512, 2048, 37000, 6, 32
  encoder = n * (2 * (4 * d * d + 2 * d * f) + 2 * 2 * length * d)
  decoder = n * (2 * (8 * d * d + 2 * d * f) + 2 * 2 * length * d * 2)
  expected = 3 * (encoder + decoder + 2 * v * d)
  config = model_config(v)
  assert training_flops_per_target_token(config, length, length) == pytest.approx(expected)
  assert expected / 1e9 == pytest.approx(0.381, abs=5e-4)


def test_a_decoder_of_its_own_depth_has_that_many_layers_and_their_cost():
  """model.decoder_layers: 4 encoder layers, 1 decoder layer, by hand and in the built model."""
  from transformer.model.size import training_flops_per_target_token
  d, f, v, length = 512, 2048, 37000, 32
  config = model_config(v, num_layers=4, decoder_layers=1)
  counts = param_counts(config)
  assert [k for k in counts if k.count("/") == 1 and k.startswith("decoder/layer_")] == ["decoder/layer_0"]
  assert sum(k.startswith("encoder/layer_") and k.count("/") == 1 for k in counts) == 4
  assert sum(c for k, c in counts.items() if "/" not in k) == hand_count(4, d, f, v, decoder_n=1)
  encoder = 4 * (2 * (4 * d * d + 2 * d * f) + 2 * 2 * length * d)
  decoder = 1 * (2 * (8 * d * d + 2 * d * f) + 2 * 2 * length * d * 2)
  expected = 3 * (encoder + decoder + 2 * v * d)
  assert training_flops_per_target_token(config, length, length) == pytest.approx(expected)


@pytest.mark.parametrize("d_k, paper_millions", [(16, 58), (32, 60)])
def test_table3_row_b_removes_the_papers_parameters(d_k, paper_millions):
  """Row B shrinks only the query/key projections: the paper's 65M base loses 7M (d_k 16), 5M (32)."""
  base = analytic_param_count(model_config(37000))
  smaller = analytic_param_count(model_config(37000, d_k=d_k))
  assert round((base - smaller) / 1e6) == 65 - paper_millions


def test_attention_with_unequal_key_and_value_widths_matches_numpy(rng):
  q, k, v = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 6, 4, 5)), rng.normal(size=(2, 6, 4, 7))
  logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(5)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  expected = np.einsum("bhts,bshv->bthv", weights, v)
  np.testing.assert_allclose(dot_product_attention(q, k, v, None), expected, rtol=1e-5, atol=1e-6)


def test_fairseqs_query_key_value_gain_scales_those_initial_weights_alone():
  """model.qkv_init_gain: the same draws as Glorot-uniform (gain 1, the default, unchanged),
  scaled by the gain in the query, key and value projections and nowhere else; every weight
  within the scaled bound gain * sqrt(6 / (fan_in + fan_out))."""
  plain = init_params(Transformer(tiny_model_config()))
  gain = 2 ** -0.5
  scaled = init_params(Transformer(tiny_model_config(qkv_init_gain=gain)))
  flat_plain = dict(jax.tree_util.tree_leaves_with_path(plain))
  projections = 0
  for path, weight in jax.tree_util.tree_leaves_with_path(scaled):
    names = [str(getattr(p, "key", p)) for p in path]
    if names[-1] == "kernel" and names[-2] in ("query", "key", "value"):
      projections += 1
      np.testing.assert_allclose(weight, flat_plain[path] * gain, rtol=1e-6)
      d_model, heads, depth = weight.shape
      assert np.abs(weight).max() <= gain * math.sqrt(6 / (d_model + heads * depth))
    else:
      np.testing.assert_array_equal(weight, flat_plain[path])
  assert projections == 3 * (2 + 2 * 2)  # 2 encoder self-attentions, 2 x 2 decoder attentions
