"""The plain, slow definitions that the fast code is tested against: what "correct" means here.

- `beam_search` / `greedy_search`: the searches of decoding/ written as a textbook writes them, one
  sentence at a time, every step a full forward pass of the model over the whole prefix (no cache,
  no slots, no blocks, no reordering tricks), in float64 numpy.
- `loss_sums`: label-smoothed cross-entropy as the formula reads, differentiated by autodiff
  (step.loss_sums writes its gradient by hand).

tests/ compare the fast paths with these (same hypotheses, scores to 1e-5), and
`transformer-benchmark --reference=N` checks N of its sentences against `beam_search`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import positions
from transformer.model.transformer import BOS_ID, EOS_ID, PAD_ID, Transformer

Hypothesis = tuple[tuple[int, ...], float]  # tokens (EOS last) and score


@functools.partial(jax.jit, static_argnums=0)
def _logits(model: Transformer, params: Any, src: jax.Array, tgt_in: jax.Array) -> jax.Array:
  return model.apply({"params": params}, src, tgt_in)


def padded_shape(model: Transformer, limit: int, beam_size: int) -> tuple[int, int]:
  """(rows, width) that hold `beam_size` prefixes of up to `limit` tokens (BOS first), rounded up
  to powers of two so that searches of other limits and beams share one compilation (a learned
  table caps the width at its rows)."""
  width = 1 << int(limit).bit_length()
  longest = positions.get(model.config.positional).longest(model.config)
  if longest is not None:
    width = max(limit + 1, min(width, longest))
  return 1 << max(beam_size - 1, 0).bit_length(), width


def next_log_probs(model: Transformer, params: Any, src_row: np.ndarray,
                   prefixes: Sequence[Sequence[int]], shape: tuple[int, int]) -> np.ndarray:
  """log p(next token | source, prefix) [len(prefixes), V]: a full forward pass, no cache, over
  the prefixes padded into `shape` (rows, width) (padded_shape); causal attention keeps what
  follows a prefix out of it."""
  rows, width = shape
  tgt_in = np.full((rows, width), PAD_ID, np.int32)
  for i, prefix in enumerate(prefixes):
    tgt_in[i, :len(prefix) + 1] = [BOS_ID, *prefix]
  src = np.repeat(np.asarray(src_row, np.int32)[None], rows, axis=0)
  logits = np.asarray(_logits(model, params, src, tgt_in), np.float64)
  logits = logits[np.arange(len(prefixes)), [len(p) for p in prefixes]]
  return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def _allowed(log_probs: np.ndarray, length: int, limit: int, min_len: int,
             never: tuple[int, ...]) -> np.ndarray:
  """Forbids `never` (padding and the start token), every token but EOS at the limit, EOS before
  `min_len` tokens."""
  log_probs = log_probs.copy()
  log_probs[..., list(never)] = -np.inf
  if length + 1 >= limit:
    log_probs[..., np.arange(log_probs.shape[-1]) != EOS_ID] = -np.inf
  if length < min_len:
    log_probs[..., EOS_ID] = -np.inf
  return log_probs


def beam_search(model: Transformer, params: Any, src_row: np.ndarray, limit: int, beam_size: int,
                alpha: float, min_len: int = 0, nbest: int = 1, length_penalty: str = "gnmt"
                ) -> list[Hypothesis]:
  """K live hypotheses; each step the 2K best extensions; an EOS among the K best finishes a
  hypothesis with score log p / ((5 + n) / 6) ** alpha (n tokens, EOS included); the K best
  non-EOS extensions live on; stop when no live hypothesis can beat the `nbest`-th best finished
  one even at the length `limit` (EOS included). Returns the finished hypotheses, best first.
  `length_penalty='fairseq'`: the score is log p / n ** alpha instead."""
  penalty = lambda n: (n if length_penalty == "fairseq" else (5.0 + n) / 6.0) ** alpha
  alive: list[Hypothesis] = [((), 0.0)]
  finished: list[Hypothesis] = []
  shape = padded_shape(model, limit, beam_size)
  for length in range(limit):
    log_probs = _allowed(next_log_probs(model, params, src_row, [s for s, _ in alive], shape),
                         length, limit, min_len, model.config.never_written)
    candidates = sorted(((score + log_probs[i, token], i * log_probs.shape[1] + token, seq + (token,))
                         for i, (seq, score) in enumerate(alive)
                         for token in np.flatnonzero(log_probs[i] > -np.inf)),
                        key=lambda c: (-c[0], c[1]))[:2 * beam_size]
    for rank, (score, _, seq) in enumerate(candidates):
      if seq[-1] == EOS_ID and rank < beam_size:
        finished.append((seq, score / penalty(len(seq))))
    finished = sorted(finished, key=lambda f: -f[1])[:beam_size]
    alive = [(tuple(int(t) for t in seq), score) for score, _, seq in candidates
             if seq[-1] != EOS_ID][:beam_size]
    if not alive or (len(finished) >= nbest and finished[nbest - 1][1] >= alive[0][1] / penalty(limit)):
      break
  return [(tuple(int(t) for t in seq), score) for seq, score in finished]


def greedy_search(model: Transformer, params: Any, src_row: np.ndarray, limit: int,
                  min_len: int = 0) -> Hypothesis:
  """The most probable allowed token at every step until EOS or the limit; (tokens, log p)."""
  seq: tuple[int, ...] = ()
  total = 0.0
  shape = padded_shape(model, limit, 1)
  while not seq or (seq[-1] != EOS_ID and len(seq) < limit):
    log_probs = _allowed(next_log_probs(model, params, src_row, [seq], shape)[0], len(seq),
                         limit, min_len, model.config.never_written)
    token = int(np.argmax(log_probs))
    seq, total = seq + (token,), total + float(log_probs[token])
  return seq, total


def loss_sums(logits: jax.Array, targets: jax.Array, smoothing: float) -> dict[str, jax.Array]:
  """Label-smoothed cross-entropy and NLL summed over non-padding targets, as the formula reads:
  the target gets 1 - smoothing, every other word smoothing / (V - 1); autodiff differentiates it."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  off = smoothing / (logits.shape[-1] - 1)
  weights = (targets != PAD_ID).astype(jnp.float32)
  smoothed = -((1 - smoothing - off) * target + off * log_probs.sum(-1))
  return {"loss": (smoothed * weights).sum(), "nll": (-target * weights).sum(),
          "tokens": weights.sum()}
