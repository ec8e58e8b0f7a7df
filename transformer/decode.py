"""Beam search, greedy search, sampling and forced scoring on the decoder's cache, jit-compilable.

Beam search follows the paper (and tensor2tensor): beam size K, GNMT length penalty
lp(n) = ((5 + n) / 6) ** alpha applied to finished hypotheses (n counts generated tokens, EOS
included), and early termination: a sentence is done once no live hypothesis can still beat its best
finished one (its n-th best, for n-best lists), even if it kept its current log-probability to the
maximum length. A hypothesis finishes when its EOS is among the K best extensions of the beam (as in
fairseq). Each sentence has its own maximum output length (`max_lengths`, input length + 50 in the
paper); at that length only EOS is allowed; PAD and BOS are never generated. With alpha = 0 beam
size 1 is exactly greedy search; with alpha > 0 a beam of 1 may still prefer the runner-up
continuation where greedy stopped, because the penalty favours longer outputs.

How the work is kept small (docs/performance.md has the profile behind each point):
- Slots: the search runs `slots` sentences at a time from a queue of N. When a sentence is decided its
  result is written out and the next sentence of the queue takes its slot at the next step, so no
  compute goes to sentences that are already done, and the loop ends when the queue is empty.
- The encoder runs once per sentence, and its keys and values are projected once per sentence, not
  once per hypothesis: the K hypotheses of a sentence are the decoder's query axis (model.py).
- The self-attention cache is never reordered. Each step writes the K new keys and values in place,
  and `origin` records which of the K cache slots wrote each earlier position of every live
  hypothesis; attention reads its own history through that mask (`history_mask`). Choosing parents
  moves a [B, K, L] table of small integers instead of every layer's cache.
- The best 2K extensions of a sentence are found among the best 2K of each hypothesis, so no top-k
  runs over K x vocabulary candidates.

An ensemble is a tuple of models (and a tuple of their parameters) sharing one vocabulary: each
keeps its own encoder output and cache, and the search sees the mean of their log-probabilities at
every step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import traverse_util

from transformer.model import BOS_ID, EOS_ID, PAD_ID, Transformer, shift_right

NEG_INF = -1.0e7  # a finite "minus infinity" keeps arithmetic on impossible beams NaN-free

Models = Transformer | Sequence[Transformer]


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT's lp(n) = ((5 + n) / 6) ** alpha."""
  return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def as_ensemble(models: Models, params: Any) -> tuple[tuple[Transformer, ...], tuple[Any, ...]]:
  """(models, params) as equal-length tuples: one model is an ensemble of one."""
  if isinstance(models, Transformer):
    return (models,), (params,)
  return tuple(models), tuple(params)


def _mean(log_probs: list[jax.Array]) -> jax.Array:
  """The ensemble's log-probabilities: the members' mean (one member's, untouched)."""
  return log_probs[0] if len(log_probs) == 1 else jnp.mean(jnp.stack(log_probs), axis=0)


def history_mask(origin: jax.Array, step: jax.Array) -> jax.Array:
  """[B, 1, G, L * G] self-attention mask of G hypotheses per sentence at position `step` ([B]).

  `origin` [B, G, L] holds, for each hypothesis and each position up to `step`, the slot (0..G-1)
  whose keys and values at that position belong to the hypothesis's own history.
  """
  batch, group, length = origin.shape
  mask = ((origin[..., None] == jnp.arange(group))
          & (jnp.arange(length) <= step[:, None, None])[..., None])
  return mask.reshape(batch, 1, group, length * group)


def _at(step: jax.Array, length: int) -> jax.Array:
  """[B, 1, L] one-hot of each row's `step`, for per-row writes into [B, *, L] arrays."""
  return (jnp.arange(length) == step[:, None])[:, None, :]


def _allowed(log_probs: jax.Array, at_limit: jax.Array,
             too_short: jax.Array | None = None) -> jax.Array:
  """Forbids PAD and BOS everywhere, every token but EOS in the rows where `at_limit`, and EOS in
  the rows that are `too_short`."""
  token = jnp.arange(log_probs.shape[-1])
  forbidden = (token == PAD_ID) | (token == BOS_ID) | (at_limit[..., None] & (token != EOS_ID))
  if too_short is not None:
    forbidden = forbidden | (too_short[..., None] & (token == EOS_ID))
  return jnp.where(forbidden, NEG_INF, log_probs)


# ------------------------------------------------------------------------------ the decoder step

def _is_cross(path: tuple) -> bool:
  return "cross_attention" in path


class _Decoder:
  """One decoding step of an ensemble over `slots` sentences of a queue `src` [N, S].

  The encoder output and the encoder-decoder keys/values of all N sentences are computed once
  (`cross`); a sentence's are copied into its slot when it starts (`load`). The caches of the
  slots ([slots, ...] per layer: self-attention blocks and encoder-decoder keys/values) belong to
  the loop state.
  """

  def __init__(self, models: Models, params: Any, src: jax.Array, decode_len: int, group: int,
               slots: int):
    self.models, self.params = as_ensemble(models, params)
    self.src, self.decode_len, self.group, self.slots = src, decode_len, group, slots
    self.cross = []  # per model: flat {path: [N, ...]} (scanned layers: [layers, N, ...])
    for model, p in zip(self.models, self.params):
      encoded = model.apply({"params": p}, src, method=Transformer.encode)
      # One step of one position creates every cache; only the source-side part is kept.
      _, cache = model.apply({"params": p}, encoded, src, jnp.full((src.shape[0], 1), BOS_ID),
                             decode=True, decode_len=1, step=0, self_mask=jnp.ones((1, 1, 1, 1), bool),
                             mutable=["cache"], method=Transformer.decode)
      flat = traverse_util.flatten_dict(cache["cache"])
      self.cross.append({k: v for k, v in flat.items() if _is_cross(k)})

  def initial_caches(self, sentence: jax.Array) -> tuple:
    """Every model's slot caches with the sentences `sentence` [slots] loaded, self-attention
    zeroed."""
    caches = []
    for i in range(len(self.models)):
      cross = {k: jnp.take(v, sentence, axis=1 if "layers" in k else 0, mode="clip")
               for k, v in self.cross[i].items()}
      shapes = jax.eval_shape(functools.partial(
          self._apply, i, traverse_util.unflatten_dict(cross), sentence,
          jnp.zeros((self.slots, self.group), jnp.int32), jnp.zeros((self.slots,), jnp.int32),
          None))[1]
      caches.append({**cross, **{k: jnp.zeros(v.shape, v.dtype) for k, v in
                                 traverse_util.flatten_dict(shapes).items() if not _is_cross(k)}})
    return tuple(caches)

  def load(self, caches: tuple, slot: jax.Array, sentence: jax.Array) -> tuple:
    """Copies the encoder-decoder keys/values of `sentence` [F] into slots `slot` [F] (a slot
    index of `slots` writes nothing)."""
    def put(path, cached, everything):
      if "layers" in path:
        return cached.at[:, slot].set(jnp.take(everything, sentence, axis=1, mode="clip"),
                                      mode="drop")
      return cached.at[slot].set(jnp.take(everything, sentence, axis=0, mode="clip"), mode="drop")
    return tuple({k: put(k, v, self.cross[i][k]) if _is_cross(k) else v for k, v in c.items()}
                 for i, c in enumerate(caches))

  def _apply(self, i: int, cache: Any, sentence: jax.Array, tokens: jax.Array, step: jax.Array,
             mask: jax.Array | None):
    if mask is None:
      mask = jnp.ones((self.slots, 1, self.group, self.decode_len * self.group), bool)
    slot_src = jnp.take(self.src, sentence, axis=0, mode="clip")  # for the source padding mask
    logits, mutated = self.models[i].apply(
        {"params": self.params[i], "cache": cache}, None, slot_src, tokens, decode=True,
        decode_len=self.decode_len, step=step, self_mask=mask, mutable=["cache"],
        method=Transformer.decode)
    return logits, mutated["cache"]

  def __call__(self, caches: tuple, sentence: jax.Array, tokens: jax.Array, step: jax.Array,
               mask: jax.Array) -> tuple[jax.Array, tuple]:
    """Log-probabilities [slots, G, V] after `tokens` [slots, G] at positions `step` [slots]."""
    log_probs, new_caches = [], []
    for i in range(len(self.models)):
      logits, cache = self._apply(i, traverse_util.unflatten_dict(caches[i]), sentence, tokens,
                                  step, mask)
      log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32)))
      new_caches.append(traverse_util.flatten_dict(cache))
    return _mean(log_probs), tuple(new_caches)


# ----------------------------------------------------------------------------- the slot loop

@flax.struct.dataclass
class _Slots:
  sentence: jax.Array  # [R] queue index of the sentence in each slot; N = empty
  step: jax.Array      # [R] tokens generated so far
  free: jax.Array      # [R] decided or empty: refilled at the next step
  next: jax.Array      # queue index of the next sentence to start
  done: jax.Array      # sentences written out
  search: Any          # the search's per-slot state
  caches: tuple        # every model's slot caches (self-attention blocks, encoder-decoder keys)
  tokens: jax.Array    # [N + 1, n, L] results (row N takes the writes of empty slots)
  scores: jax.Array    # [N + 1, n]


def _run(search: Any, decoder: _Decoder, max_lengths: jax.Array, min_lengths: jax.Array | None,
         nbest: int) -> tuple[jax.Array, jax.Array]:
  """Runs `search` over the queue, `decoder.slots` sentences at a time; returns its results.

  Queue entries with a maximum length of 0 are padding (they must come last) and are not decoded.
  """
  total, slots, length = max_lengths.shape[0], decoder.slots, decoder.decode_len
  count = jnp.sum(max_lengths > 0)
  limits = jnp.concatenate([max_lengths, jnp.ones((1,), max_lengths.dtype)])  # empty slots: 1
  minimum = None if min_lengths is None else jnp.concatenate(
      [min_lengths, jnp.zeros((1,), min_lengths.dtype)])

  # At most `arrivals` sentences start per step (more only when the loop starts), so loading
  # their encoder-decoder keys/values costs a fraction of a full copy; a slot left free runs idle.
  arrivals = max(1, slots // 2)

  def refill(state: _Slots) -> _Slots:
    rank = jnp.cumsum(state.free) - 1
    take = state.free & (rank < arrivals)
    slot = jnp.nonzero(take, size=arrivals, fill_value=slots)[0]
    arriving = state.next + jnp.arange(arrivals)
    arriving = jnp.where((jnp.arange(arrivals) < take.sum()) & (arriving < count), arriving, total)
    sentence = jnp.where(state.free, total, state.sentence).at[slot].set(arriving, mode="drop")
    fresh = search.fresh(slots)
    reset = lambda new, old: jnp.where(state.free.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
    return state.replace(sentence=sentence, step=jnp.where(state.free, 0, state.step),
                         next=jnp.minimum(state.next + take.sum(), count),
                         search=jax.tree.map(reset, fresh, state.search),
                         caches=decoder.load(state.caches, slot, arriving))

  def body(state: _Slots) -> _Slots:
    state = refill(state)
    limit = limits[state.sentence]
    too_short = None if minimum is None else state.step + 1 < minimum[state.sentence]
    tokens, origin = search.inputs(state.search, state.step)
    log_probs, caches = decoder(state.caches, state.sentence, tokens, state.step,
                                history_mask(origin, state.step))
    found = search.update(state.search, origin, log_probs, state.step, limit, too_short,
                          state.sentence)
    step = state.step + 1
    empty = state.sentence == total
    decided = empty | (step >= limit) | search.decided(found, limit)
    out_tokens, out_scores = search.result(found)
    target = jnp.where(decided, state.sentence, total)
    return state.replace(step=step, free=decided, search=found, caches=caches,
                         done=state.done + (decided & ~empty).sum(),
                         tokens=state.tokens.at[target].set(out_tokens),
                         scores=state.scores.at[target].set(out_scores))

  first = jnp.arange(slots)
  first = jnp.where(first < count, first, total)
  state = _Slots(sentence=first, step=jnp.zeros((slots,), jnp.int32),
                 free=jnp.zeros((slots,), bool), next=jnp.minimum(count, slots),
                 done=jnp.int32(0), search=search.fresh(slots), caches=decoder.initial_caches(first),
                 tokens=jnp.full((total + 1, nbest, length), PAD_ID, jnp.int32),
                 scores=jnp.full((total + 1, nbest), NEG_INF, jnp.float32))
  state = jax.lax.while_loop(lambda s: s.done < count, body, state)
  return state.tokens[:total], state.scores[:total]


# ------------------------------------------------------------------ one hypothesis per sentence

class _OnePerSentence:
  """Greedy search or sampling: one hypothesis per sentence, extended by `choose`."""

  def __init__(self, length: int, choose: Callable):
    self.length, self.choose = length, choose

  def fresh(self, slots: int) -> dict:
    return {"tokens": jnp.full((slots, self.length), PAD_ID, jnp.int32),
            "log_prob": jnp.zeros((slots,), jnp.float32), "finished": jnp.zeros((slots,), bool)}

  def inputs(self, state: dict, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    last = jnp.take_along_axis(state["tokens"], jnp.maximum(step - 1, 0)[:, None], axis=1)
    return jnp.where(step[:, None] == 0, BOS_ID, last), jnp.zeros((step.shape[0], 1, self.length),
                                                                  jnp.int32)

  def update(self, state, origin, log_probs, step, limit, too_short, sentence) -> dict:
    log_probs = _allowed(log_probs[:, 0], step + 1 >= limit, too_short)
    token = self.choose(step, log_probs, sentence).astype(jnp.int32)
    chosen = jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0]
    return {"tokens": jnp.where(_at(step, self.length)[:, 0], token[:, None], state["tokens"]),
            "log_prob": state["log_prob"] + chosen, "finished": token == EOS_ID}

  def decided(self, state: dict, limit: jax.Array) -> jax.Array:
    return state["finished"]

  def result(self, state: dict) -> tuple[jax.Array, jax.Array]:
    return state["tokens"][:, None], state["log_prob"][:, None]


def greedy_search(models: Models, params: Any, src: jax.Array, max_lengths: jax.Array,
                  decode_len: int, slots: int | None = None, min_lengths: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
  """Most probable next token at every step. Returns tokens [N, decode_len] (PAD after EOS) and
  their summed log-probabilities. (top_k(1) picks the first maximum, as argmax does, at a third of
  argmax's cost on CPUs.) `slots`: sentences decoded at a time (default: all)."""
  choose = lambda step, log_probs, sentence: jax.lax.top_k(log_probs, 1)[1][:, 0]
  decoder = _Decoder(models, params, src, decode_len, 1, slots or src.shape[0])
  tokens, scores = _run(_OnePerSentence(decode_len, choose), decoder, max_lengths, min_lengths, 1)
  return tokens[:, 0], scores[:, 0]


def sample(models: Models, params: Any, src: jax.Array, max_lengths: jax.Array, decode_len: int,
           keys: jax.Array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           slots: int | None = None, min_lengths: jax.Array | None = None
           ) -> tuple[jax.Array, jax.Array]:
  """Ancestral sampling from softmax(log p / temperature), restricted to the `top_k` most probable
  tokens (0 = all) and to the smallest set whose probability reaches `top_p` (1 = all).

  `keys` [N] holds one PRNG key per sentence, so a sentence's sample depends on its key alone, not
  on the batch or slot it is decoded in. Returns tokens [N, decode_len] and their summed
  log-probabilities under the model (untempered).
  """
  def choose(step, log_probs, sentence):
    logits = log_probs / temperature
    if top_k:
      kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, NEG_INF, logits)
    if top_p < 1.0:
      ordered = jnp.sort(logits, axis=-1)[:, ::-1]
      probs = jax.nn.softmax(ordered, axis=-1)
      before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more probable tokens
      threshold = jnp.min(jnp.where(before < top_p, ordered, jnp.inf), axis=-1, keepdims=True)
      logits = jnp.where(logits < threshold, NEG_INF, logits)
    slot_keys = keys[jnp.minimum(sentence, keys.shape[0] - 1)]
    step_keys = jax.vmap(jax.random.fold_in)(slot_keys, step)
    return jax.vmap(jax.random.categorical)(step_keys, logits)

  decoder = _Decoder(models, params, src, decode_len, 1, slots or src.shape[0])
  tokens, scores = _run(_OnePerSentence(decode_len, choose), decoder, max_lengths, min_lengths, 1)
  return tokens[:, 0], scores[:, 0]


# ----------------------------------------------------------------------------------- beam search

def _gather_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """x[b, beam_indices[b, j]] for arrays shaped [B, K', ...]."""
  return jnp.take_along_axis(x, beam_indices.reshape(beam_indices.shape + (1,) * (x.ndim - 2)),
                             axis=1)


class _Beam:
  """Beam search state per slot: K live and K finished hypotheses."""

  def __init__(self, beam: int, length: int, alpha: float, nbest: int):
    self.beam, self.length, self.alpha, self.nbest = beam, length, alpha, nbest

  def fresh(self, slots: int) -> dict:
    # All K hypotheses start identical, so only the first starts alive.
    first = jnp.where(jnp.arange(self.beam) == 0, 0.0, NEG_INF)
    return {"alive_seqs": jnp.full((slots, self.beam, self.length), PAD_ID, jnp.int32),
            "alive_log_probs": jnp.broadcast_to(first, (slots, self.beam)),
            "origin": jnp.zeros((slots, self.beam, self.length), jnp.int32),
            "finished_seqs": jnp.full((slots, self.beam, self.length), PAD_ID, jnp.int32),
            "finished_scores": jnp.full((slots, self.beam), NEG_INF)}

  def inputs(self, state: dict, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each hypothesis's last token (BOS at the start) and `origin` with the current position
    written by each hypothesis's own slot."""
    at = jnp.maximum(step - 1, 0)[:, None, None]
    last = jnp.take_along_axis(state["alive_seqs"], at, axis=2)[..., 0]
    tokens = jnp.where(step[:, None] == 0, BOS_ID, last)
    own = jnp.arange(self.beam, dtype=jnp.int32)[None, :, None]
    return tokens, jnp.where(_at(step, self.length), own, state["origin"])

  def update(self, state, origin, log_probs, step, limit, too_short, sentence) -> dict:
    """Extends every live hypothesis by every token and keeps the best K live and K finished."""
    slots, beam = log_probs.shape[:2]
    log_probs = _allowed(log_probs, jnp.broadcast_to((step + 1 >= limit)[:, None], (slots, beam)),
                         None if too_short is None else
                         jnp.broadcast_to(too_short[:, None], (slots, beam)))
    # The best 2K extensions of a sentence are among the best 2K of each of its hypotheses, and 2K
    # candidates always hold K that do not end in EOS.
    per_beam = min(2 * beam, log_probs.shape[-1])
    beam_log_probs, beam_tokens = jax.lax.top_k(log_probs, per_beam)  # [R, K, per_beam]
    candidates = (state["alive_log_probs"][:, :, None] + beam_log_probs).reshape(slots, -1)
    top_scores, top_ids = jax.lax.top_k(candidates, 2 * beam)
    top_beams = top_ids // per_beam
    top_tokens = jnp.take_along_axis(beam_tokens.reshape(slots, -1), top_ids, axis=1)
    top_seqs = jnp.where(_at(step, self.length), top_tokens[:, :, None],
                         _gather_beams(state["alive_seqs"], top_beams))
    is_eos = top_tokens == EOS_ID

    alive_scores = jnp.where(is_eos, NEG_INF, top_scores)
    alive_log_probs, keep = jax.lax.top_k(alive_scores, beam)
    parent = _gather_beams(top_beams, keep)  # [R, K] which old hypothesis each new one extends

    # As in fairseq, a hypothesis finishes only if its EOS is among the K best candidates.
    finishing = is_eos & (jnp.arange(2 * beam) < beam) & (top_scores > NEG_INF / 2)
    new_scores = jnp.where(finishing,
                           top_scores / length_penalty(step + 1, self.alpha)[:, None], NEG_INF)
    all_scores = jnp.concatenate([state["finished_scores"], new_scores], axis=1)
    all_seqs = jnp.concatenate([state["finished_seqs"], top_seqs], axis=1)
    finished_scores, best = jax.lax.top_k(all_scores, beam)
    return {"alive_seqs": _gather_beams(top_seqs, keep), "alive_log_probs": alive_log_probs,
            "origin": _gather_beams(origin, parent),
            "finished_seqs": _gather_beams(all_seqs, best), "finished_scores": finished_scores}

  def decided(self, state: dict, limit: jax.Array) -> jax.Array:
    """No live hypothesis can beat the n-th best finished one, even at the length limit."""
    best_possible = state["alive_log_probs"][:, 0] / length_penalty(limit, self.alpha)
    return state["finished_scores"][:, self.nbest - 1] >= best_possible

  def result(self, state: dict) -> tuple[jax.Array, jax.Array]:
    return state["finished_seqs"][:, :self.nbest], state["finished_scores"][:, :self.nbest]


def beam_search_nbest(models: Models, params: Any, src: jax.Array, max_lengths: jax.Array,
                      decode_len: int, beam_size: int = 4, alpha: float = 0.6, nbest: int = 1,
                      min_lengths: jax.Array | None = None, slots: int | None = None
                      ) -> tuple[jax.Array, jax.Array]:
  """The `nbest` (<= beam_size) best finished hypotheses per sentence, best first: tokens
  [N, nbest, decode_len] (PAD after EOS) and scores [N, nbest] (log-probability / lp(length);
  NEG_INF where fewer finished).

  `slots`: sentences searched at a time (default: all N). `min_lengths` forbids EOS until a
  hypothesis, EOS included, is that long (fairseq's --min-len m is m + 1 here): 2 rules out the
  empty translation; the benchmark sets the limits to time decoding to given lengths whatever the
  parameters.
  """
  if not 1 <= nbest <= beam_size:
    raise ValueError(f"nbest must be between 1 and the beam size {beam_size}, got {nbest}")
  decoder = _Decoder(models, params, src, decode_len, beam_size, slots or src.shape[0])
  return _run(_Beam(beam_size, decode_len, alpha, nbest), decoder, max_lengths, min_lengths, nbest)


def beam_search(models: Models, params: Any, src: jax.Array, max_lengths: jax.Array,
                decode_len: int, beam_size: int = 4, alpha: float = 0.6,
                min_lengths: jax.Array | None = None, slots: int | None = None
                ) -> tuple[jax.Array, jax.Array]:
  """Best finished hypothesis per sentence: tokens [N, decode_len] (PAD after EOS) and its score."""
  tokens, scores = beam_search_nbest(models, params, src, max_lengths, decode_len, beam_size, alpha,
                                     min_lengths=min_lengths, slots=slots)
  return tokens[:, 0], scores[:, 0]


# ------------------------------------------------------------------------------- forced decoding

def forced_log_probs(models: Models, params: Any, src: jax.Array, tgt: jax.Array) -> jax.Array:
  """Log-probability [B, T] of each given target token (0 at padding): teacher forcing, the
  ensemble's mean log-probabilities as in the searches. Their sum scores a sentence for rescoring;
  the mean over non-padding tokens is the teacher-forced NLL that training's evaluation reports."""
  log_probs = []
  for model, p in zip(*as_ensemble(models, params)):
    logits = model.apply({"params": p}, src, shift_right(tgt))
    log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32)))
  mean = _mean(log_probs)
  return jnp.where(tgt != PAD_ID, jnp.take_along_axis(mean, tgt[..., None], -1)[..., 0], 0.0)
