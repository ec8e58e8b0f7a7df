"""Beam search as the paper (and tensor2tensor) run it, with fairseq's rule for finishing.

Beam size K, GNMT length penalty lp(n) = ((5 + n) / 6) ** alpha on finished hypotheses (n counts
generated tokens, EOS included; `length_penalty='fairseq'`: fairseq's n ** alpha), and early
termination: a sentence is decided once no live
hypothesis can still beat its n-th best finished one, even if it kept its current log-probability
to the length limit. A hypothesis finishes when its EOS is among the K best extensions of the beam.
With alpha = 0 a beam of 1 is greedy search; with alpha > 0 it may still prefer the runner-up
continuation where greedy stopped, because the penalty favours longer outputs.

The best 2K extensions of a sentence are found over all K x vocabulary candidates at once by
base.top_k (chunk maxima first, so no sort runs over them). reference.beam_search is the same search
written plainly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer.decoding.base import (
  IMPOSSIBLE,
  LENGTH_PENALTIES,
  Result,
  Search,
  Step,
  at_position,
  length_penalty,
  top_k,
)
from transformer.decoding.options import Option
from transformer.model.transformer import BOS_ID, EOS_ID, PAD_ID


@flax.struct.dataclass
class BeamState:
  alive_seqs: jax.Array        # [R, K, L] live hypotheses
  alive_log_probs: jax.Array   # [R, K]
  origin: jax.Array            # [R, K, L] cache slot of each live hypothesis's positions
  finished_seqs: jax.Array     # [R, K, L] the best finished so far, best first
  finished_scores: jax.Array   # [R, K] log-probability / lp(length)


def gather_beams(x: jax.Array, beams: jax.Array) -> jax.Array:
  """x[r, beams[r, j]] for arrays shaped [R, K', ...]."""
  return jnp.take_along_axis(x, beams.reshape(beams.shape + (1,) * (x.ndim - 2)), axis=1)


@dataclasses.dataclass(frozen=True)
class BeamSearch(Search):
  name = "beam"
  OPTIONS = (
      Option("beam_size", 4, "Beam size (1 = greedy search).", lambda v: v >= 1,
             ">= 1 (1 = greedy search)", tag="beam", in_config=True),
      Option("alpha", 0.6, "Length-penalty exponent: ((5 + length) / 6) ** alpha divides a "
             "finished hypothesis' log-probability.", lambda v: v >= 0, ">= 0", in_config=True,
             about="the length-penalty exponent"),
      Option("length_penalty", "gnmt", "What alpha is the exponent of: 'gnmt', (5 + length) / 6 "
             "(the paper's, from GNMT); 'fairseq', the length (fairseq's --lenpen: alpha 1 scores "
             "a hypothesis by its mean log-probability a token).",
             lambda v: v in LENGTH_PENALTIES, f"one of {', '.join(LENGTH_PENALTIES)}", tag="lp",
             in_config=True, choices=LENGTH_PENALTIES),
  )
  beam_size: int = 4
  alpha: float = 0.6
  nbest: int = 1
  length_penalty: str = "gnmt"

  def __post_init__(self):
    if not 1 <= self.nbest <= self.beam_size:
      raise ValueError(f"nbest must be between 1 and the beam size {self.beam_size}, got {self.nbest}")

  @classmethod
  def from_settings(cls, settings: Any, index: jax.Array | None = None) -> BeamSearch:
    return cls(settings.beam_size, settings.alpha, settings.candidates, settings.length_penalty)

  def describe(self) -> dict[str, Any]:
    described = {**super().describe(), "nbest": self.nbest}
    if self.length_penalty == "gnmt":  # reports of the paper's penalty keep their keys
      described.pop("length_penalty")
    return described

  def fresh(self, slots: int, decode_len: int) -> BeamState:
    # All K hypotheses start identical, so only the first starts alive.
    first = jnp.where(jnp.arange(self.beam_size) == 0, 0.0, IMPOSSIBLE)
    empty = jnp.full((slots, self.beam_size, decode_len), PAD_ID, jnp.int32)
    return BeamState(alive_seqs=empty, alive_log_probs=jnp.broadcast_to(first, empty.shape[:2]),
                     origin=jnp.zeros_like(empty), finished_seqs=empty,
                     finished_scores=jnp.full(empty.shape[:2], IMPOSSIBLE))

  def inputs(self, state: BeamState, position: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each hypothesis's last token (BOS at the start) and `origin` with the current position
    written by each hypothesis's own slot."""
    at = jnp.maximum(position - 1, 0)[:, None, None]
    last = jnp.take_along_axis(state.alive_seqs, at, axis=2)[..., 0]
    tokens = jnp.where(position[:, None] == 0, BOS_ID, last)
    own = jnp.arange(self.beam_size, dtype=jnp.int32)[None, :, None]
    here = at_position(position, state.origin.shape[-1])
    return tokens, jnp.where(here, own, state.origin)

  def update(self, state: BeamState, step: Step) -> BeamState:
    """Extends every live hypothesis by every token and keeps the best K live and K finished."""
    log_probs, beam = step.log_probs, self.beam_size
    slots, vocab, decode_len = log_probs.shape[0], log_probs.shape[-1], state.alive_seqs.shape[-1]
    # 2K candidates always hold K that do not end in EOS; ties go to the lower hypothesis, then token.
    candidates = (state.alive_log_probs[:, :, None] + log_probs).reshape(slots, -1)
    top_scores, top_ids = top_k(candidates, 2 * beam)
    top_beams, top_tokens = top_ids // vocab, top_ids % vocab
    top_seqs = jnp.where(at_position(step.position, decode_len), top_tokens[:, :, None],
                         gather_beams(state.alive_seqs, top_beams))
    is_eos = top_tokens == EOS_ID

    alive_log_probs, keep = jax.lax.top_k(jnp.where(is_eos, IMPOSSIBLE, top_scores), beam)
    parent = gather_beams(top_beams, keep)  # [R, K] which old hypothesis each new one extends

    # As in fairseq, a hypothesis finishes only if its EOS is among the K best candidates.
    finishing = is_eos & (jnp.arange(2 * beam) < beam) & (top_scores > IMPOSSIBLE / 2)
    penalty = self._penalty(step.position + 1)[:, None]
    new_scores = jnp.where(finishing, top_scores / penalty, IMPOSSIBLE)
    all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
    all_seqs = jnp.concatenate([state.finished_seqs, top_seqs], axis=1)
    finished_scores, best = jax.lax.top_k(all_scores, beam)
    return BeamState(alive_seqs=gather_beams(top_seqs, keep), alive_log_probs=alive_log_probs,
                     origin=gather_beams(step.origin, parent),
                     finished_seqs=gather_beams(all_seqs, best), finished_scores=finished_scores)

  def decided(self, state: BeamState, limit: jax.Array) -> jax.Array:
    """No live hypothesis can beat the n-th best finished one, even at the length limit."""
    best_possible = state.alive_log_probs[:, 0] / self._penalty(limit)
    return state.finished_scores[:, self.nbest - 1] >= best_possible

  def result(self, state: BeamState) -> Result:
    return Result(state.finished_seqs[:, :self.nbest], state.finished_scores[:, :self.nbest], None)

  def finish(self, result: Result) -> Result:
    """The log-probabilities: score × lp(length)."""
    lengths = (result.tokens != PAD_ID).sum(-1)
    return result.replace(log_probs=result.scores * self._penalty(lengths))

  def _penalty(self, length: jax.Array) -> jax.Array:
    return length_penalty(length, self.alpha, self.length_penalty)
