"""Greedy and beam search on the decoder's key/value cache, as jit-compilable functions.

Beam search follows the paper (and tensor2tensor): beam size K, GNMT length penalty
lp(n) = ((5 + n) / 6) ** alpha applied to finished hypotheses (n counts generated tokens, EOS
included), and early termination: a sentence is done once no live hypothesis can still beat its best
finished one, even if it kept its current log-probability to the maximum length. A hypothesis
finishes when its EOS is among the K best extensions of the beam (as in fairseq). Each sentence has its
own maximum output length (`max_lengths`, input length + 50 in the paper); at that length only EOS is
allowed; PAD and BOS are never generated. With alpha = 0 beam size 1 is exactly greedy search; with alpha > 0 a beam of 1 may still
prefer the runner-up continuation where greedy stopped, because the penalty favours longer outputs.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer.model import BOS_ID, EOS_ID, PAD_ID, Transformer

NEG_INF = -1.0e7  # a finite "minus infinity" keeps arithmetic on impossible beams NaN-free


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT's lp(n) = ((5 + n) / 6) ** alpha."""
  return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _decode_step(model: Transformer, params: Any, cache: Any, encoded: jax.Array, src: jax.Array,
                 tokens: jax.Array, decode_len: int) -> tuple[jax.Array, Any]:
  """Log-probabilities [N, V] of the next token after `tokens` [N]; creates the cache on first use."""
  variables = {"params": params} if cache is None else {"params": params, "cache": cache}
  logits, mutated = model.apply(variables, encoded, src, tokens[:, None], decode=True,
                                decode_len=decode_len, mutable=["cache"], method=Transformer.decode)
  return jax.nn.log_softmax(logits[:, 0].astype(jnp.float32)), mutated["cache"]


def _allowed(log_probs: jax.Array, at_limit: jax.Array,
             too_short: jax.Array | None = None) -> jax.Array:
  """Forbids PAD and BOS everywhere, every token but EOS in the rows where `at_limit`, and EOS in
  the rows that are `too_short`."""
  token = jnp.arange(log_probs.shape[-1])
  forbidden = (token == PAD_ID) | (token == BOS_ID) | (at_limit[..., None] & (token != EOS_ID))
  if too_short is not None:
    forbidden = forbidden | (too_short[..., None] & (token == EOS_ID))
  return jnp.where(forbidden, NEG_INF, log_probs)


def greedy_search(model: Transformer, params: Any, src: jax.Array, max_lengths: jax.Array,
                  decode_len: int) -> jax.Array:
  """Most probable next token at every step. Returns tokens [B, decode_len], PAD after EOS."""
  batch = src.shape[0]
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  tokens = jnp.full((batch, decode_len), PAD_ID, jnp.int32)

  def choose(t, log_probs, finished, tokens):
    next_token = _allowed(log_probs, t + 1 >= max_lengths).argmax(-1).astype(jnp.int32)
    next_token = jnp.where(finished, PAD_ID, next_token)
    return tokens.at[:, t].set(next_token), finished | (next_token == EOS_ID), next_token

  log_probs, cache = _decode_step(model, params, None, encoded, src,
                                  jnp.full((batch,), BOS_ID, jnp.int32), decode_len)
  tokens, finished, last = choose(0, log_probs, jnp.zeros((batch,), bool), tokens)

  def body(state):
    t, tokens, finished, last, cache = state
    log_probs, cache = _decode_step(model, params, cache, encoded, src, last, decode_len)
    tokens, finished, last = choose(t, log_probs, finished, tokens)
    return t + 1, tokens, finished, last, cache

  def cond(state):
    t, _, finished, _, _ = state
    return (t < decode_len) & ~finished.all()

  _, tokens, _, _, _ = jax.lax.while_loop(cond, body, (1, tokens, finished, last, cache))
  return tokens


@flax.struct.dataclass
class BeamState:
  step: jax.Array            # tokens generated so far
  alive_seqs: jax.Array      # [B, K, L] live hypotheses (generated tokens, no BOS)
  alive_log_probs: jax.Array  # [B, K] their summed log-probabilities
  finished_seqs: jax.Array   # [B, K] best finished hypotheses, ending in EOS
  finished_scores: jax.Array  # [B, K] their log-probabilities / lp(length)
  cache: Any                 # decoder cache for the B * K live hypotheses


def _gather_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """x[b, beam_indices[b, j]] for arrays shaped [B, K', ...]."""
  return jnp.take_along_axis(x, beam_indices.reshape(beam_indices.shape + (1,) * (x.ndim - 2)),
                             axis=1)


def _reorder(path: tuple, x: jax.Array, flat_parent: jax.Array) -> jax.Array:
  """Cache rows follow their beams; cross-attention keys/values and counters are the same for all.

  Layers run by one `nn.scan` ('layers' in the path) stack their caches on a leading layer axis.
  """
  names = [getattr(p, "key", None) for p in path]
  batch_axis = 1 if "layers" in names else 0
  if x.ndim <= batch_axis or "cross_attention" in names:
    return x
  return jnp.take(x, flat_parent, axis=batch_axis)


def _beam_update(state: BeamState, log_probs: jax.Array, cache: Any, max_lengths: jax.Array,
                 alpha: float, min_lengths: jax.Array | None = None) -> BeamState:
  """Extends every live hypothesis by every token and keeps the best K live and K finished."""
  batch, beam, length = state.alive_seqs.shape
  vocab = log_probs.shape[-1]
  log_probs = log_probs.reshape(batch, beam, vocab)
  too_short = None if min_lengths is None else jnp.broadcast_to(
      (state.step + 1 < min_lengths)[:, None], (batch, beam))
  log_probs = _allowed(log_probs, jnp.broadcast_to((state.step + 1 >= max_lengths)[:, None],
                                                   (batch, beam)), too_short)
  candidates = (state.alive_log_probs[:, :, None] + log_probs).reshape(batch, beam * vocab)
  # 2K candidates always hold K that do not end in EOS.
  top_scores, top_ids = jax.lax.top_k(candidates, 2 * beam)
  top_beams, top_tokens = top_ids // vocab, (top_ids % vocab).astype(jnp.int32)
  top_seqs = _gather_beams(state.alive_seqs, top_beams)
  top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_tokens[:, :, None], state.step, 2)
  is_eos = top_tokens == EOS_ID

  alive_scores = jnp.where(is_eos, NEG_INF, top_scores)
  alive_log_probs, keep = jax.lax.top_k(alive_scores, beam)
  alive_seqs = _gather_beams(top_seqs, keep)
  parent = _gather_beams(top_beams, keep)  # [B, K] which old beam each new one extends
  flat_parent = (jnp.arange(batch)[:, None] * beam + parent).reshape(-1)
  cache = jax.tree_util.tree_map_with_path(lambda path, x: _reorder(path, x, flat_parent), cache)

  # As in fairseq, a hypothesis finishes only if its EOS is among the K best candidates.
  finishing = is_eos & (jnp.arange(2 * beam) < beam) & (top_scores > NEG_INF / 2)
  new_scores = jnp.where(finishing,
                         top_scores / length_penalty(state.step + 1, alpha), NEG_INF)
  all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
  all_seqs = jnp.concatenate([state.finished_seqs, top_seqs], axis=1)
  finished_scores, best = jax.lax.top_k(all_scores, beam)
  return BeamState(step=state.step + 1, alive_seqs=alive_seqs, alive_log_probs=alive_log_probs,
                   finished_seqs=_gather_beams(all_seqs, best), finished_scores=finished_scores,
                   cache=cache)


def beam_search(model: Transformer, params: Any, src: jax.Array, max_lengths: jax.Array,
                decode_len: int, beam_size: int = 4, alpha: float = 0.6,
                min_lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Best finished hypothesis per sentence: tokens [B, decode_len] (PAD after EOS) and its score.

  `min_lengths` (as fairseq's --min-len) forbids EOS before that many tokens; the benchmark sets it
  to `max_lengths` to time full-length decoding whatever the parameters.
  """
  batch = src.shape[0]
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  # Every sentence is decoded as K rows; all start identical, so only beam 0 starts alive.
  src_k = jnp.repeat(src, beam_size, axis=0)
  encoded_k = jnp.repeat(encoded, beam_size, axis=0)
  log_probs, cache = _decode_step(model, params, None, encoded_k, src_k,
                                  jnp.full((batch * beam_size,), BOS_ID, jnp.int32), decode_len)
  initial_log_probs = jnp.where(jnp.arange(beam_size) == 0, 0.0, NEG_INF)
  state = BeamState(
      step=jnp.zeros((), jnp.int32),
      alive_seqs=jnp.full((batch, beam_size, decode_len), PAD_ID, jnp.int32),
      alive_log_probs=jnp.broadcast_to(initial_log_probs, (batch, beam_size)),
      finished_seqs=jnp.full((batch, beam_size, decode_len), PAD_ID, jnp.int32),
      finished_scores=jnp.full((batch, beam_size), NEG_INF),
      cache=cache)
  state = _beam_update(state, log_probs, cache, max_lengths, alpha, min_lengths)

  def cond(state: BeamState) -> jax.Array:
    best_possible = state.alive_log_probs[:, 0] / length_penalty(max_lengths, alpha)
    undecided = state.finished_scores[:, 0] < best_possible
    return (state.step < decode_len) & undecided.any()

  def body(state: BeamState) -> BeamState:
    last = jax.lax.dynamic_index_in_dim(state.alive_seqs, state.step - 1, axis=2, keepdims=False)
    log_probs, cache = _decode_step(model, params, state.cache, encoded_k, src_k,
                                    last.reshape(-1), decode_len)
    return _beam_update(state, log_probs, cache, max_lengths, alpha, min_lengths)

  state = jax.lax.while_loop(cond, body, state)
  return state.finished_seqs[:, 0], state.finished_scores[:, 0]
