"""The model's speed options compute what the plain model computes: fused attention kernels
(XLA's, cuDNN's), one scan over the layers, rematerialisation. Not in `pytest -m core`: they change
how the model runs, not what it is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config
from test_model import dot_product_attention

from transformer import decoding
from transformer.model.attention import attention_kernel
from transformer.model.transformer import Transformer, shift_right


@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("mask_kind", ["padding", "causal", "random"])
def test_fused_attention_matches_the_reference(rng, dtype, atol, mask_kind):
  """jax.nn.dot_product_attention (the 'xla' kernel; 'cudnn' on GPUs) against our reference."""
  q, k, v = (jnp.asarray(rng.standard_normal((2, 6, 4, 8)), dtype) for _ in range(3))
  if mask_kind == "padding":
    mask = jnp.asarray([[True] * 6, [True] * 3 + [False] * 3])[:, None, None, :]
  elif mask_kind == "causal":
    mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  else:
    mask = jnp.asarray(rng.random((2, 1, 6, 6)) < 0.6).at[..., 0].set(True)
  fused = jax.nn.dot_product_attention(q, k, v, mask=jnp.broadcast_to(mask, (*mask.shape[:2], 6, 6)),
                                       implementation="xla")
  reference = dot_product_attention(q, k, v, mask)
  assert fused.dtype == dtype
  np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(reference, np.float32),
                             atol=atol)


def test_the_model_gives_the_same_logits_with_every_attention_kernel(rng):
  src = random_tokens(rng, 3, 6, 24, lengths=[6, 4, 2])
  tgt_in = shift_right(random_tokens(rng, 3, 5, 24, lengths=[5, 2, 3]))
  params = init_params(Transformer(tiny_model_config()))
  logits = {kind: Transformer(tiny_model_config(attention=kind)).apply({"params": params}, src, tgt_in)
            for kind in ("xla", "reference")}
  np.testing.assert_allclose(logits["xla"], logits["reference"], atol=1e-5)


def test_attention_kernel_falls_back_to_the_reference_where_fused_kernels_cannot_follow():
  assert attention_kernel(tiny_model_config(), with_dropout=False) == "xla"  # auto, on this CPU
  assert attention_kernel(tiny_model_config(), with_dropout=True) == "reference"
  assert attention_kernel(tiny_model_config(d_k=3, d_v=5), with_dropout=False) == "reference"
  assert attention_kernel(tiny_model_config(attention="cudnn"), with_dropout=False) == "cudnn"
  assert attention_kernel(tiny_model_config(attention="reference"), with_dropout=False) == "reference"


def stack_layers_of(params):
  """Unrolled 'layer_0', 'layer_1', ... parameters stacked as one scanned 'layers' entry."""
  names = sorted(k for k in params if k.startswith("layer_"))
  stacked = {k: v for k, v in params.items() if not k.startswith("layer_")}
  stacked["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[n] for n in names])
  return stacked


@pytest.mark.parametrize("remat, depths", [
    ("none", {}), pytest.param("full", {}, marks=pytest.mark.slow),
    pytest.param("dots", {}, marks=pytest.mark.slow),
    pytest.param("none", {"num_layers": 3, "decoder_layers": 1}, marks=pytest.mark.slow)])
def test_scanned_and_rematerialised_layers_compute_what_unrolled_layers_compute(rng, remat, depths):
  unrolled = Transformer(tiny_model_config(**depths))
  scanned = Transformer(tiny_model_config(scan_layers=True, remat=remat, **depths))
  params = init_params(unrolled)
  as_scanned = {**params, "encoder": stack_layers_of(params["encoder"]),
                "decoder": stack_layers_of(params["decoder"])}
  assert (jax.tree.structure(as_scanned)
          == jax.tree.structure(init_params(scanned)))  # same parameters, stacked
  src = random_tokens(rng, 3, 6, 24, lengths=[6, 4, 2])
  tgt = random_tokens(rng, 3, 5, 24, lengths=[5, 3, 4])
  loss = lambda model: jax.jit(lambda p: model.apply({"params": p}, src, shift_right(tgt)).mean())
  np.testing.assert_allclose(loss(scanned)(as_scanned), loss(unrolled)(params), rtol=1e-6)
  grads = jax.jit(jax.grad(loss(unrolled)))(params)
  scanned_grads = jax.jit(jax.grad(loss(scanned)))(as_scanned)
  expected = {**grads, "encoder": stack_layers_of(grads["encoder"]),
              "decoder": stack_layers_of(grads["decoder"])}
  for a, b in zip(jax.tree.leaves(scanned_grads), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)
  limits = jnp.array([8, 8, 8])
  search = decoding.BeamSearch(beam_size=3)
  tokens = decoding.decode(search, unrolled, params, src, limits, 8).tokens
  scanned_tokens = decoding.decode(search, scanned, as_scanned, src, limits, 8).tokens
  np.testing.assert_array_equal(scanned_tokens, tokens)
