"""The slot loop: runs any search over a queue of sentences, `slots` at a time, in one while_loop.

When a sentence is decided its result is written out and the next sentence of the queue takes its
slot at the next step, so no compute goes to sentences that are already done, and the loop ends when
the queue is empty. At most `slots // 2` sentences start per step (more only when the loop starts),
so loading their source keys costs a fraction of a full copy; a slot left free runs idle.

The self-attention cache is never reordered: each step writes the G new keys and values in place,
and a search's `origin` records which of the G cache slots wrote each earlier position of each of
its hypotheses; attention reads a hypothesis's own history through `history_mask`. Choosing parents
moves a [R, G, L] table of small integers instead of every layer's cache.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer.decoding.base import IMPOSSIBLE, Result, Search, Step, allowed
from transformer.decoding.ensemble import Caches, Ensemble
from transformer.model.transformer import PAD_ID


def history_mask(origin: jax.Array, position: jax.Array) -> jax.Array:
  """[R, 1, G, L * G] self-attention mask of G hypotheses per sentence at `position` ([R]).

  `origin` [R, G, L] holds, for each hypothesis and each position up to `position`, the slot
  (0..G-1) whose keys and values at that position belong to the hypothesis's own history.
  """
  slots, beam_size, decode_len = origin.shape
  mask = ((origin[..., None] == jnp.arange(beam_size))
          & (jnp.arange(decode_len) <= position[:, None, None])[..., None])
  return mask.reshape(slots, 1, beam_size, decode_len * beam_size)


@flax.struct.dataclass
class Slots:
  sentence: jax.Array  # [R] queue index of the sentence in each slot; N = empty
  position: jax.Array  # [R] tokens generated so far
  free: jax.Array      # [R] decided or empty: refilled at the next step
  next: jax.Array      # queue index of the next sentence to start
  done: jax.Array      # sentences written out
  search: Any          # the search's state
  caches: Caches       # every model's slot caches
  out: Result          # [N + 1, ...] results (row N takes the writes of empty slots)


def _refill(search: Search, ensemble: Ensemble, state: Slots, count: jax.Array, total: int
            ) -> Slots:
  """Starts queued sentences in the free slots (at most slots // 2 of them)."""
  slots = ensemble.slots
  arrivals = max(1, slots // 2)
  rank = jnp.cumsum(state.free) - 1
  take = state.free & (rank < arrivals)
  slot = jnp.nonzero(take, size=arrivals, fill_value=slots)[0]
  arriving = state.next + jnp.arange(arrivals)
  arriving = jnp.where((jnp.arange(arrivals) < take.sum()) & (arriving < count), arriving, total)
  sentence = jnp.where(state.free, total, state.sentence).at[slot].set(arriving, mode="drop")
  fresh = search.fresh(slots, ensemble.decode_len)
  reset = lambda new, old: jnp.where(state.free.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
  return state.replace(sentence=sentence, position=jnp.where(state.free, 0, state.position),
                       next=jnp.minimum(state.next + take.sum(), count),
                       search=jax.tree.map(reset, fresh, state.search),
                       caches=ensemble.load(state.caches, slot, arriving))


def run(search: Search, ensemble: Ensemble, limits: jax.Array, min_len: jax.Array | None = None
        ) -> Result:
  """Runs `search` over the queue of `ensemble`, `ensemble.slots` sentences at a time.

  `limits` [N]: each sentence's output length limit (EOS included); entries of 0 are padding (they
  must come last) and are not decoded. `min_len` [N]: tokens each output has at least before its
  EOS (EOS is forbidden until then). Returns [N, nbest, ...] results.
  """
  total, slots, decode_len = limits.shape[0], ensemble.slots, ensemble.decode_len
  count = jnp.sum(limits > 0)
  limit_of = jnp.concatenate([limits, jnp.ones((1,), limits.dtype)])  # empty slots: 1
  min_len_of = jnp.zeros((total + 1,), jnp.int32) if min_len is None else jnp.concatenate(
      [min_len, jnp.zeros((1,), min_len.dtype)])

  def body(state: Slots) -> Slots:
    state = _refill(search, ensemble, state, count, total)
    limit = limit_of[state.sentence]
    tokens, origin = search.inputs(state.search, state.position)
    log_probs, caches = ensemble(state.caches, state.sentence, tokens, state.position,
                                 history_mask(origin, state.position))
    log_probs = allowed(log_probs, state.position + 1 >= limit,
                        state.position < min_len_of[state.sentence], ensemble.never_written)
    found = search.update(state.search, Step(log_probs, origin, state.position, limit,
                                             state.sentence))
    position = state.position + 1
    empty = state.sentence == total
    decided = empty | (position >= limit) | search.decided(found, limit)
    target = jnp.where(decided, state.sentence, total)
    out = jax.tree.map(lambda all_, new: all_.at[target].set(new), state.out, search.result(found))
    return state.replace(position=position, free=decided, search=found, caches=caches,
                         done=state.done + (decided & ~empty).sum(), out=out)

  first = jnp.arange(slots)
  first = jnp.where(first < count, first, total)
  written = jax.eval_shape(search.result, search.fresh(slots, decode_len))
  empty_out = lambda x: jnp.full((total + 1,) + x.shape[1:], PAD_ID if jnp.issubdtype(
      x.dtype, jnp.integer) else IMPOSSIBLE, x.dtype)
  state = Slots(sentence=first, position=jnp.zeros((slots,), jnp.int32),
                free=jnp.zeros((slots,), bool), next=jnp.minimum(count, slots), done=jnp.int32(0),
                search=search.fresh(slots, decode_len), caches=ensemble.initial(first),
                out=jax.tree.map(empty_out, written))
  state = jax.lax.while_loop(lambda s: s.done < count, body, state)
  return search.finish(jax.tree.map(lambda x: x[:total], state.out))
