"""The optional dropouts beyond the paper's: on the feed-forward's hidden units
(model.activation_dropout) and on whole tokens' embeddings (model.word_dropout), each checked
against its formula on the values the layer saw, and neither moving the paper's dropout masks."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer.model.transformer import FeedForward, Transformer, shift_right


def captured(tree, *path):
  """The first output of the submodule at `path` that apply(capture_intermediates=True) recorded."""
  for name in path:
    tree = tree[name]
  return np.asarray(tree["__call__"][0])


def test_activation_dropout_zeroes_hidden_units_and_scales_the_rest(rng):
  p = 0.4
  layer = FeedForward(tiny_model_config(activation_dropout=p), deterministic=False)
  x = jnp.asarray(rng.normal(size=(4, 50, 16)), jnp.float32)
  params = nn.unbox(layer.init(jax.random.key(0), x)["params"])
  out, seen = layer.apply({"params": params}, x, rngs={"dropout": jax.random.key(1)},
                          capture_intermediates=True, mutable=["intermediates"])
  wi, wo = (jax.tree.map(np.asarray, params[k]) for k in ("wi", "wo"))
  hidden = np.maximum(np.asarray(x) @ wi["kernel"] + wi["bias"], 0)
  dropped = captured(seen["intermediates"], "activation_dropout")
  kept = dropped != 0
  np.testing.assert_allclose(dropped[kept], hidden[kept] / (1 - p), atol=1e-5)
  assert abs(1 - kept[hidden > 0].mean() - p) < 0.05  # ~3,200 positive units: std 0.009
  np.testing.assert_allclose(out, dropped @ wo["kernel"] + wo["bias"], atol=1e-5)
  # Evaluation (deterministic) is the plain formula.
  plain = FeedForward(tiny_model_config(activation_dropout=p)).apply({"params": params}, x)
  np.testing.assert_allclose(plain, hidden @ wo["kernel"] + wo["bias"], atol=1e-5)


def test_word_dropout_drops_whole_tokens_on_both_sides(rng):
  p = 0.3
  model = Transformer(tiny_model_config(word_dropout=p))
  params = init_params(model)
  src, tgt = random_tokens(rng, 8, 50, 24), random_tokens(rng, 8, 40, 24)
  tgt_in = shift_right(tgt)
  _, seen = model.apply({"params": params}, src, tgt_in, deterministic=False,
                        rngs={"dropout": jax.random.key(2)}, capture_intermediates=True,
                        mutable=["intermediates"])
  table = np.asarray(params["embed"]["embedding"]) * math.sqrt(16)
  masks = []
  for side, tokens in (("encoder", src), ("decoder", tgt_in)):
    dropped = captured(seen["intermediates"], side, "word_dropout")
    rows_kept = np.abs(dropped).sum(-1) != 0
    expected = table[np.asarray(tokens)] / (1 - p)
    np.testing.assert_allclose(dropped[rows_kept], expected[rows_kept], atol=1e-5)
    assert abs(1 - rows_kept.mean() - p) < 0.08  # 320-400 tokens: std ~0.025
    masks.append(rows_kept)
  assert (masks[0][:, :40] != masks[1]).any()  # each side draws its own mask
  # Evaluation never drops.
  np.testing.assert_allclose(model.apply({"params": params}, src, tgt_in),
                             Transformer(tiny_model_config()).apply({"params": params}, src, tgt_in),
                             atol=1e-6)


@pytest.mark.parametrize("extra", ["activation_dropout", "word_dropout"])
def test_an_extra_dropout_leaves_the_papers_masks_as_they_were(rng, extra):
  """At a vanishing rate the extra dropout drops nothing, so the logits equal a run's without it
  under the same key only if the residual and embedding dropouts drew the same masks."""
  src, tgt_in = random_tokens(rng, 3, 6, 24), shift_right(random_tokens(rng, 3, 5, 24))
  run = lambda **kw: Transformer(tiny_model_config(dropout=0.3, **kw)).apply(
      {"params": params}, src, tgt_in, deterministic=False, rngs={"dropout": jax.random.key(5)})
  params = init_params(Transformer(tiny_model_config()))
  np.testing.assert_allclose(run(**{extra: 1e-7}), run(), atol=1e-5)
  assert not np.allclose(run(**{extra: 0.5}), run(), atol=1e-3)
