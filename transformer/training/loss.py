"""The label-smoothed loss over the vocabulary (section 5.4), from logits or from the decoder's
output without ever holding the logits.

`loss_sums(logits, ...)` is the loss of a batch's [B, T, V] float32 logits. At WMT's shapes those
logits are the step's largest tensor (25k tokens x 37k words x 4 bytes = 3.7 GB, and as much again
for their gradient), written to memory and read back several times. `projected_loss_sums(x, matrix,
...)` computes the same sums from the decoder's output x [B, T, D] and the output matrix [V, D]: the
projection, log-softmax, loss and their backward pass run a chunk of target positions at a time
(a scan over T), so no more than [B, T / chunks, V] logits exist at once. The backward pass
recomputes each chunk's logits (one more projection: +10% of base's matmul FLOPs compiled for
8xH100, experiments/results/accelerators/loss_chunks/) instead of keeping them. Same numbers:
tests/test_loss.py checks both sums and gradients against `loss_sums` on the projected logits.

Both gradients are written by hand (p - q): autodiff of a log-softmax over the vocabulary made the
largest single op of a CPU step.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from transformer.tokens import PAD_ID


def loss_sums(logits: jax.Array, targets: jax.Array, smoothing: float) -> dict[str, jax.Array]:
  """Summed float32 losses over non-padding target tokens.

  'loss' is label-smoothed cross-entropy: the true class gets probability 1 - smoothing and the
  smoothing mass is spread evenly over the other V - 1 classes. 'nll' is the plain negative
  log-likelihood (for perplexity), 'correct' counts tokens whose target has the largest logit,
  'tokens' counts real tokens.
  """
  return _sums(*_token_losses(logits.astype(jnp.float32), targets, smoothing), targets)


def rdrop_loss_sums(logits: jax.Array, targets: jax.Array, smoothing: float, alpha: float
                    ) -> dict[str, jax.Array]:
  """R-Drop's loss (Liang et al., 2021) of logits [2B, T, V] whose rows come in pairs: rows 2i and
  2i + 1 are pair i of `targets` [B, T] under two dropout masks.

  Their objective per token is CE_1 + CE_2 + alpha * (KL(P_1 || P_2) + KL(P_2 || P_1)) / 2; here it
  is halved ('loss': the mean of the two smoothed cross-entropies plus alpha / 2 times the
  symmetric term), so that 'loss', 'nll' and 'correct' (the two passes' means) read as a plain
  run's, and Adam's update is the same. 'rdrop_kl' sums the symmetric term over real tokens.
  """
  logits = logits.astype(jnp.float32)
  loss, nll, correct = _token_losses(logits, jnp.repeat(targets, 2, axis=0), smoothing)
  log_p = jax.nn.log_softmax(logits)
  log_p = log_p.reshape(targets.shape[0], 2, *log_p.shape[1:])  # rows stay on their device
  first, second = log_p[:, 0], log_p[:, 1]
  # KL(P1 || P2) + KL(P2 || P1) = sum_v (p1 - p2)(log p1 - log p2); halved, as theirs.
  kl = 0.5 * ((jnp.exp(first) - jnp.exp(second)) * (first - second)).sum(axis=-1)
  mean = lambda a: a.reshape(targets.shape[0], 2, *a.shape[1:]).mean(axis=1)
  sums = _sums(mean(loss) + 0.5 * alpha * kl, mean(nll), mean(correct), targets)
  sums["rdrop_kl"] = (kl * (targets != PAD_ID)).sum()
  return sums


def projected_loss_sums(x: jax.Array, matrix: jax.Array, targets: jax.Array, smoothing: float,
                        product_dtype: Any, chunks: int, bias: jax.Array | None = None
                        ) -> dict[str, jax.Array]:
  """`loss_sums` of the logits x [B, T, D] . matrix [V, D]^T (+ `bias` [V] where the model has
  one; a product in `product_dtype` with float32 sums, as model/vocab_projection.py's), computed
  `chunks` target positions' worth at a time. T is padded to a multiple of `chunks` (the padding
  carries PAD targets: it counts nothing)."""
  pad = -x.shape[1] % chunks
  if pad:
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)), constant_values=PAD_ID)
  losses = _projected_token_losses(x, matrix, bias, targets, smoothing, jnp.dtype(product_dtype),
                                   chunks)
  return _sums(*losses, targets)


def _sums(loss: jax.Array, nll: jax.Array, correct: jax.Array, targets: jax.Array
          ) -> dict[str, jax.Array]:
  weights = (targets != PAD_ID).astype(jnp.float32)
  return {"loss": (loss * weights).sum(), "nll": (nll * weights).sum(),
          "correct": (correct * weights).sum(), "tokens": weights.sum()}


def _smoothed_target(vocab_size: int, smoothing: float) -> tuple[float, float]:
  """(probability of the target, probability of each other word) of the smoothed distribution."""
  return 1.0 - smoothing, smoothing / (vocab_size - 1)


def _stats(logits: jax.Array, targets: jax.Array, smoothing: float):
  """Per token (smoothed cross-entropy, NLL, 1.0 where the target's logit is the largest), and the
  log partition function the backward pass needs."""
  top = logits.max(axis=-1)
  log_z = jnp.log(jnp.exp(logits - top[..., None]).sum(axis=-1)) + top
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  on, off = _smoothed_target(logits.shape[-1], smoothing)
  nll = log_z - target_logit
  # -sum_v q_v log p_v with q = off everywhere, plus (on - off) at the target.
  loss = (on - off) * nll + off * (logits.shape[-1] * log_z - logits.sum(axis=-1))
  correct = (target_logit >= top).astype(jnp.float32)
  return (loss, nll, correct), log_z


def _logits_grad(logits, log_z, targets, d_loss, d_nll, smoothing: float) -> jax.Array:
  """d loss / d logits = p - q (q the smoothed target distribution); d nll / d logits = p - onehot."""
  on, off = _smoothed_target(logits.shape[-1], smoothing)
  p = jnp.exp(logits - log_z[..., None])
  is_target = jnp.arange(logits.shape[-1]) == targets[..., None]
  return ((d_loss + d_nll)[..., None] * p - (d_loss * off)[..., None]
          - jnp.where(is_target, (d_loss * (on - off) + d_nll)[..., None], 0.0))


# ---------------------------------------------------------------------------------- from logits

@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits: jax.Array, targets: jax.Array, smoothing: float):
  return _stats(logits, targets, smoothing)[0]


def _token_losses_fwd(logits, targets, smoothing):
  losses, log_z = _stats(logits, targets, smoothing)
  return losses, (logits, log_z, targets)


def _token_losses_bwd(smoothing, residuals, cotangents):
  logits, log_z, targets = residuals
  d_loss, d_nll, _ = cotangents
  return _logits_grad(logits, log_z, targets, d_loss, d_nll, smoothing), None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


# ------------------------------------------------------------------- from the decoder's output

def _chunked(a: jax.Array, chunks: int) -> jax.Array:
  """[B, T, ...] -> [chunks, B, T / chunks, ...]: the scan runs over chunks; rows stay where the
  batch's sharding put them."""
  b, t = a.shape[:2]
  return jnp.moveaxis(a.reshape(b, chunks, t // chunks, *a.shape[2:]), 1, 0)


def _unchunked(a: jax.Array) -> jax.Array:
  chunks, b, t = a.shape[:3]
  return jnp.moveaxis(a, 0, 1).reshape(b, chunks * t, *a.shape[3:])


def _project(x: jax.Array, matrix: jax.Array, bias: jax.Array | None, dtype: Any) -> jax.Array:
  with jax.named_scope("output_logits"):  # as model/vocab_projection.py names it, for profiles
    logits = jnp.einsum("btd,vd->btv", x.astype(dtype), matrix.astype(dtype),
                        preferred_element_type=jnp.float32)
    return logits if bias is None else logits + bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _projected_token_losses(x, matrix, bias, targets, smoothing, dtype, chunks):
  return _projected_fwd(x, matrix, bias, targets, smoothing, dtype, chunks)[0]


def _projected_fwd(x, matrix, bias, targets, smoothing, dtype, chunks):
  def chunk(_, inputs):
    x_c, targets_c = inputs
    losses, log_z = _stats(_project(x_c, matrix, bias, dtype), targets_c, smoothing)
    return None, (*losses, log_z)
  _, outputs = jax.lax.scan(chunk, None, (_chunked(x, chunks), _chunked(targets, chunks)))
  loss, nll, correct, log_z = map(_unchunked, outputs)
  return (loss, nll, correct), (x, matrix, bias, targets, log_z)


def _projected_bwd(smoothing, dtype, chunks, residuals, cotangents):
  x, matrix, bias, targets, log_z = residuals
  d_loss, d_nll, _ = cotangents

  def chunk(carry, inputs):
    d_matrix, d_bias = carry
    x_c, targets_c, log_z_c, d_loss_c, d_nll_c = inputs
    with jax.named_scope("output_logits_grad"):
      d_logits = _logits_grad(_project(x_c, matrix, bias, dtype), log_z_c, targets_c, d_loss_c,
                              d_nll_c, smoothing)
      d_x = jnp.einsum("btv,vd->btd", d_logits.astype(dtype), matrix.astype(dtype),
                       preferred_element_type=jnp.float32)
      # [tokens, D]^T x [tokens, V] as a 2-D product, as model/vocab_projection.py's backward
      d_matrix += jax.lax.dot_general(
          x_c.reshape(-1, x.shape[-1]), d_logits.astype(x.dtype).reshape(-1, d_logits.shape[-1]),
          (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32).T
      if d_bias is not None:
        d_bias += d_logits.sum((0, 1))
    return (d_matrix, d_bias), d_x.astype(x.dtype)

  inputs = tuple(_chunked(a, chunks) for a in (x, targets, log_z, d_loss, d_nll))
  zeros = lambda a: None if a is None else jnp.zeros(a.shape, jnp.float32)
  (d_matrix, d_bias), d_x = jax.lax.scan(chunk, (zeros(matrix), zeros(bias)), inputs)
  return (_unchunked(d_x), d_matrix.astype(matrix.dtype),
          None if bias is None else d_bias.astype(bias.dtype), None)


_projected_token_losses.defvjp(_projected_fwd, _projected_bwd)
