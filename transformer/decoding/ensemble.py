"""The next-token distribution a search reads: one model's, or the mean of an ensemble's, with caches.

`Ensemble` runs the encoder once per sentence of a queue `src` [N, S] and projects the source's keys
and values once per sentence (kv_cache.SOURCE), not once per hypothesis: the G hypotheses of a
sentence are the decoder's query axis. A sentence's source keys are copied into a slot when it
starts (`load`); every slot's self-attention cache (kv_cache.SELF) lives in the loop state. One
model is an ensemble of one; several models (sharing a vocabulary) each keep their own caches, and
the search sees the mean of their log-probabilities.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer.model import kv_cache
from transformer.model.transformer import BOS_ID, PAD_ID, Transformer, shift_right

Models = Transformer | Sequence[Transformer]


def as_ensemble(models: Models, params: Any) -> tuple[tuple[Transformer, ...], tuple[Any, ...]]:
  """(models, params) as equal-length tuples: one model is an ensemble of one."""
  if isinstance(models, Transformer):
    return (models,), (params,)
  return tuple(models), tuple(params)


def mean(log_probs: Sequence[jax.Array]) -> jax.Array:
  """The ensemble's log-probabilities: the members' mean (one member's, untouched)."""
  return log_probs[0] if len(log_probs) == 1 else jnp.mean(jnp.stack(log_probs), axis=0)


@flax.struct.dataclass
class Caches:
  """Every member's caches for the slots: self-attention (written each step) and source keys."""
  own: tuple
  source: tuple


class Ensemble:
  """One decoding step of `models` over `slots` sentences of the queue `src` [N, S]."""

  def __init__(self, models: Models, params: Any, src: jax.Array, decode_len: int, beam_size: int,
               slots: int):
    self.models, self.params = as_ensemble(models, params)
    self.src, self.decode_len, self.beam_size, self.slots = src, decode_len, beam_size, slots
    self.source = tuple(self._source(model, p) for model, p in zip(self.models, self.params))

  def _source(self, model: Transformer, params: Any) -> Any:
    """The source keys/values of all N sentences ([N, ...]; scanned layers [layers, N, ...])."""
    encoded = model.apply({"params": params}, self.src, method=Transformer.encode)
    # One step of one position creates every cache; only the source's is kept.
    _, cache = model.apply({"params": params}, encoded, self.src,
                           jnp.full((self.src.shape[0], 1), BOS_ID), decode=True, decode_len=1,
                           step=0, self_mask=jnp.ones((1, 1, 1, 1), bool),
                           mutable=[kv_cache.SELF, kv_cache.SOURCE], method=Transformer.decode)
    return cache[kv_cache.SOURCE]

  @property
  def never_written(self) -> tuple[int, ...]:
    """The ids no search writes: every member's padding and start token."""
    return tuple(sorted({i for model in self.models for i in model.config.never_written}))

  def _batch_axis(self, i: int) -> int:
    return 1 if self.models[i].config.scan_layers else 0

  def initial(self, sentence: jax.Array) -> Caches:
    """Caches with the sentences `sentence` [slots] loaded and self-attention zeroed."""
    take = lambda axis, x: jnp.take(x, sentence, axis=axis, mode="clip")
    source = tuple(jax.tree.map(functools.partial(take, self._batch_axis(i)), self.source[i])
                   for i in range(len(self.models)))
    own = []
    for i in range(len(self.models)):
      shapes = jax.eval_shape(functools.partial(
          self._apply, i, None, source[i], sentence,
          jnp.zeros((self.slots, self.beam_size), jnp.int32), jnp.zeros((self.slots,), jnp.int32),
          jnp.ones((self.slots, 1, self.beam_size, self.decode_len * self.beam_size), bool)))[1]
      own.append(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
    return Caches(own=tuple(own), source=source)

  def load(self, caches: Caches, slot: jax.Array, sentence: jax.Array) -> Caches:
    """Copies the source keys/values of `sentence` [F] into slots `slot` [F] (a slot index of
    `slots` writes nothing)."""
    def put(axis: int, cached: jax.Array, everything: jax.Array) -> jax.Array:
      new = jnp.take(everything, sentence, axis=axis, mode="clip")
      return (cached.at[:, slot] if axis else cached.at[slot]).set(new, mode="drop")
    source = tuple(jax.tree.map(functools.partial(put, self._batch_axis(i)), c, self.source[i])
                   for i, c in enumerate(caches.source))
    return caches.replace(source=source)

  def _apply(self, i: int, own: Any, source: Any, sentence: jax.Array, tokens: jax.Array,
             position: jax.Array, mask: jax.Array) -> tuple[jax.Array, Any]:
    slot_src = jnp.take(self.src, sentence, axis=0, mode="clip")  # for the source padding mask
    variables = {"params": self.params[i], kv_cache.SOURCE: source}
    if own is not None:
      variables[kv_cache.SELF] = own
    logits, mutated = self.models[i].apply(
        variables, None, slot_src, tokens, decode=True, decode_len=self.decode_len, step=position,
        self_mask=mask, mutable=[kv_cache.SELF], method=Transformer.decode)
    return logits, mutated[kv_cache.SELF]

  def __call__(self, caches: Caches, sentence: jax.Array, tokens: jax.Array, position: jax.Array,
               mask: jax.Array) -> tuple[jax.Array, Caches]:
    """Log-probabilities [slots, G, V] after `tokens` [slots, G] at `position` [slots]."""
    log_probs, own = [], []
    for i in range(len(self.models)):
      logits, cache = self._apply(i, caches.own[i], caches.source[i], sentence, tokens, position,
                                  mask)
      log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32)))
      own.append(cache)
    return mean(log_probs), caches.replace(own=tuple(own))


def forced_log_probs(models: Models, params: Any, src: jax.Array, tgt: jax.Array) -> jax.Array:
  """Log-probability [B, T] of each given target token (0 at padding): teacher forcing, the
  ensemble's mean log-probabilities as in the searches. Their sum scores a sentence for rescoring;
  the mean over non-padding tokens is the teacher-forced NLL that training's evaluation reports.
  Compiled as one program, as decoding.decode is."""
  def one_program(params, src, tgt):
    log_probs = []
    for model, p in zip(*as_ensemble(models, params)):
      logits = model.apply({"params": p}, src, shift_right(tgt))
      log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32)))
    chosen = jnp.take_along_axis(mean(log_probs), tgt[..., None], -1)[..., 0]
    return jnp.where(tgt != PAD_ID, chosen, 0.0)
  return jax.jit(one_program)(params, src, tgt)
