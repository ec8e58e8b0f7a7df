"""Greedy search: the most probable next token at every step, one hypothesis per sentence.

Also the base of searches that keep one hypothesis per sentence and differ only in how they pick
its next token (`choose`): sampling.py is one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer.decoding.base import Result, Search, Step, at_position, top_k
from transformer.model.transformer import BOS_ID, EOS_ID, PAD_ID


@flax.struct.dataclass
class OneHypothesis:
  tokens: jax.Array    # [R, L] generated so far, PAD after
  log_prob: jax.Array  # [R] their summed log-probability
  finished: jax.Array  # [R] the last token was EOS


@dataclasses.dataclass(frozen=True)
class Greedy(Search):
  name = "greedy"

  @classmethod
  def from_settings(cls, settings: Any, index: jax.Array | None = None) -> Greedy:
    return cls()

  def describe(self) -> dict[str, Any]:
    return {**super().describe(), "beam_size": 1}

  def choose(self, step: Step, log_probs: jax.Array) -> jax.Array:
    """The next token [R] from `log_probs` [R, V]: the first maximum, as argmax picks it (base.top_k
    finds it at a fraction of argmax's cost on CPUs)."""
    return top_k(log_probs, 1)[1][:, 0]

  def fresh(self, slots: int, decode_len: int) -> OneHypothesis:
    return OneHypothesis(tokens=jnp.full((slots, decode_len), PAD_ID, jnp.int32),
                         log_prob=jnp.zeros((slots,), jnp.float32),
                         finished=jnp.zeros((slots,), bool))

  def inputs(self, state: OneHypothesis, position: jax.Array) -> tuple[jax.Array, jax.Array]:
    last = jnp.take_along_axis(state.tokens, jnp.maximum(position - 1, 0)[:, None], axis=1)
    origin = jnp.zeros((position.shape[0], 1, state.tokens.shape[1]), jnp.int32)
    return jnp.where(position[:, None] == 0, BOS_ID, last), origin

  def update(self, state: OneHypothesis, step: Step) -> OneHypothesis:
    log_probs = step.log_probs[:, 0]
    token = self.choose(step, log_probs).astype(jnp.int32)
    chosen = jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0]
    here = at_position(step.position, state.tokens.shape[1])[:, 0]
    return OneHypothesis(tokens=jnp.where(here, token[:, None], state.tokens),
                         log_prob=state.log_prob + chosen, finished=token == EOS_ID)

  def decided(self, state: OneHypothesis, limit: jax.Array) -> jax.Array:
    return state.finished

  def result(self, state: OneHypothesis) -> Result:
    return Result(state.tokens[:, None], state.log_prob[:, None], state.log_prob[:, None])
