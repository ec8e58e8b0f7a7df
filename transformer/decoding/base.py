"""The contract every search keeps, and what the slot loop (loop.py) hands it at each step.

A search is a small frozen object of settings (beam size, length penalty, ...) with five pure
methods over a typed state of its own (a `flax.struct` dataclass with a leading slot axis R), and
an optional sixth (`finish`, by default the identity):

    fresh(slots, decode_len)  -> state       an empty state for R slots
    inputs(state, position)   -> tokens [R, G], origin [R, G, L]
    update(state, step: Step) -> state       consume one step's log-probabilities
    decided(state, limit)     -> [R] bool    nothing better can come for this sentence
    result(state)             -> Result      what a decided slot writes out
    finish(result)            -> Result      once, after the loop, over all N results

G is the search's `beam_size` (hypotheses the decoder advances per sentence; 1 for greedy search
and sampling). `origin` says, for every hypothesis and earlier position, which of the G cache slots
holds its keys and values (the cache is never reordered; loop.history_mask). The loop refills
slots, runs the decoder, forbids impossible tokens in `Step.log_probs`, and writes results out; a
search only chooses tokens. Searches are registered by name in decoding/__init__.py.
"""

from __future__ import annotations

import abc
import functools
from typing import TYPE_CHECKING, Any, ClassVar

import flax
import jax
import jax.numpy as jnp

from transformer.model.transformer import EOS_ID

if TYPE_CHECKING:
  from transformer.decoding.options import Option

IMPOSSIBLE = -1.0e7  # the score of a forbidden token or an empty hypothesis: finite, so sums stay NaN-free


@flax.struct.dataclass
class Step:
  """One decoding step as a search sees it, per slot (R slots, G hypotheses, V tokens, L positions)."""
  log_probs: jax.Array  # [R, G, V] next-token log-probabilities, forbidden tokens at IMPOSSIBLE
  origin: jax.Array     # [R, G, L] the `origin` returned by `inputs` for this step
  position: jax.Array   # [R] index of the token being chosen (= tokens generated so far)
  limit: jax.Array      # [R] the sentence's output length limit, EOS included
  sentence: jax.Array   # [R] the slot's sentence (index into the queue)


@flax.struct.dataclass
class Result:
  """A decided slot's n-best list, best first: tokens [R, n, L] (PAD after EOS), the score the
  search ranks by and the model's log-probability, both [R, n] (IMPOSSIBLE where fewer).
  `log_probs` may be None inside the loop when `finish` derives it from the rest."""
  tokens: jax.Array
  scores: jax.Array
  log_probs: jax.Array | None


class Search(abc.ABC):
  """A decoding strategy. Subclasses are frozen dataclasses of settings, so jit sees constants."""
  name: ClassVar[str]
  OPTIONS: ClassVar[tuple[Option, ...]] = ()  # its own settings (options.py), beside options.COMMON
  beam_size: int = 1  # G: hypotheses the decoder advances per sentence
  nbest: int = 1      # hypotheses written out per sentence

  @classmethod
  @abc.abstractmethod
  def from_settings(cls, settings: Any, index: jax.Array | None = None) -> Search:
    """The search a `translator.SearchSettings` asks for; `index` [N]: each queue entry's sentence
    number in the input (for per-sentence randomness that does not depend on batching)."""

  @abc.abstractmethod
  def fresh(self, slots: int, decode_len: int) -> Any: ...

  @abc.abstractmethod
  def inputs(self, state: Any, position: jax.Array) -> tuple[jax.Array, jax.Array]: ...

  @abc.abstractmethod
  def update(self, state: Any, step: Step) -> Any: ...

  @abc.abstractmethod
  def decided(self, state: Any, limit: jax.Array) -> jax.Array: ...

  @abc.abstractmethod
  def result(self, state: Any) -> Result: ...

  def finish(self, result: Result) -> Result:
    """The final results [N, n, ...] from what `result` wrote: work that need not run at every
    step of the loop goes here (beam search's log-probabilities)."""
    return result

  def describe(self) -> dict[str, Any]:
    """The settings that identify this search in reports, metrics and report file names
    (translator.SearchSettings.tag): its name and the values of its own options."""
    return {"search": self.name, **{option.name: getattr(self, option.name) for option in self.OPTIONS}}


def allowed(log_probs: jax.Array, at_limit: jax.Array, too_short: jax.Array,
            never: tuple[int, ...]) -> jax.Array:
  """`log_probs` [R, G, V] with the ids `never` (padding and the decoder's start token:
  ModelConfig.never_written) forbidden everywhere, every token but EOS in the rows `at_limit` [R],
  and EOS in the rows `too_short` [R]."""
  token = jnp.arange(log_probs.shape[-1])
  # Masks of the full [R, G, V] shape: XLA's CPU loop over a mask broadcast along G ran 2x slower.
  per_row = lambda rows: jnp.broadcast_to(rows[:, None], log_probs.shape[:2])[..., None]
  at_limit, too_short = per_row(at_limit), per_row(too_short)
  forbidden = (functools.reduce(jnp.logical_or, [token == i for i in never])
               | (at_limit & (token != EOS_ID)) | (too_short & (token == EOS_ID)))
  return jnp.where(forbidden, IMPOSSIBLE, log_probs)


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """jax.lax.top_k over the last axis (the same values and indices, ties to the lower index), in
  two cheap passes instead of XLA's CPU sort: the maximum of each chunk of `chunk` entries (a
  vectorised reduction), then a top-k over the k chunks with the largest maxima only. Exact: each
  of the k best entries lies in a chunk whose maximum is among the k largest (ties to the lower
  chunk). Falls back to lax.top_k where the axis has no chunk size between 16 and 128 that divides
  it (padding a copy costs more than it saves). On CPUs several times faster than lax.top_k over a
  beam's candidates (docs/performance.md)."""
  n = x.shape[-1]
  sizes = sorted((c for c in range(16, 129) if n % c == 0), key=lambda c: abs(c - 48))
  if not sizes or k * sizes[0] * 4 > n:
    return jax.lax.top_k(x, k)
  chunk = sizes[0]
  chunks = x.reshape(x.shape[:-1] + (n // chunk, chunk))
  best = jnp.sort(jax.lax.top_k(chunks.max(-1), k)[1], axis=-1)  # in order, so ties keep theirs
  picked = jnp.take_along_axis(chunks, best[..., None], axis=-2).reshape(x.shape[:-1] + (-1,))
  values, at = jax.lax.top_k(picked, k)
  return values, jnp.take_along_axis(best, at // chunk, axis=-1) * chunk + at % chunk


def at_position(position: jax.Array, decode_len: int) -> jax.Array:
  """[R, 1, L] one-hot of each slot's `position`, for per-slot writes into [R, *, L] arrays."""
  return (jnp.arange(decode_len) == position[:, None])[:, None, :]


LENGTH_PENALTIES = ("gnmt", "fairseq")


def length_penalty(length: jax.Array, alpha: float, kind: str = "gnmt") -> jax.Array:
  """GNMT's lp(n) = ((5 + n) / 6) ** alpha, or fairseq's n ** alpha (its --lenpen: with alpha 1 a
  hypothesis is scored by its mean log-probability a token); n counts generated tokens, EOS
  included."""
  n = length.astype(jnp.float32)
  return (n if kind == "fairseq" else (5.0 + n) / 6.0) ** alpha
