"""Ancestral sampling from softmax(log p / temperature), optionally restricted to the `top_k` most
probable tokens (0 = all) and to the smallest set whose probability reaches `top_p` (1 = all).

`keys` [N] holds one PRNG key per queue entry, so a sentence's sample depends on its key alone, not
on the batch or slot it is decoded in. Scores are the model's (untempered) log-probabilities.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from transformer.decoding.base import IMPOSSIBLE, Step, top_k
from transformer.decoding.greedy import Greedy
from transformer.decoding.options import Option


@dataclasses.dataclass(frozen=True)
class Sampling(Greedy):
  name = "sample"
  OPTIONS = (
      Option("temperature", 1.0, "Divide log-probabilities by this before sampling.",
             lambda v: v > 0, "> 0", tag="t"),
      Option("top_k", 0, "Sample only from the K most probable tokens (0 = all).",
             lambda v: v >= 0, ">= 0 (0 = no limit)", tag="k"),
      Option("top_p", 1.0, "Sample only from the most probable tokens whose probabilities sum to P "
             "(nucleus sampling).", lambda v: 0 < v <= 1, "in (0, 1]", tag="p"),
      Option("seed", 0, "The random seed; a sentence's sample does not depend on its batch."),
  )
  keys: jax.Array | None = None
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0  # for reports; `keys` decide

  @classmethod
  def from_settings(cls, settings: Any, index: jax.Array | None = None) -> Sampling:
    keys = None if index is None else jax.vmap(jax.random.fold_in, (None, 0))(
        jax.random.key(settings.seed), index)
    return cls(keys=keys, temperature=settings.temperature, top_k=settings.top_k,
               top_p=settings.top_p, seed=settings.seed)

  def choose(self, step: Step, log_probs: jax.Array) -> jax.Array:
    logits = log_probs / self.temperature
    if self.top_k:
      kth = top_k(logits, self.top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, IMPOSSIBLE, logits)
    if self.top_p < 1.0:
      ordered = jnp.sort(logits, axis=-1)[:, ::-1]
      probs = jax.nn.softmax(ordered, axis=-1)
      before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more probable tokens
      threshold = jnp.min(jnp.where(before < self.top_p, ordered, jnp.inf), axis=-1, keepdims=True)
      logits = jnp.where(logits < threshold, IMPOSSIBLE, logits)
    slot_keys = self.keys[jnp.minimum(step.sentence, self.keys.shape[0] - 1)]
    step_keys = jax.vmap(jax.random.fold_in)(slot_keys, step.position)
    return jax.vmap(jax.random.categorical)(step_keys, logits)
