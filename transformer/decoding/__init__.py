"""Decoding: searches over a model's (or an ensemble's) next-token distribution, jit-compilable.

    result = decoding.decode(BeamSearch(beam_size=4, alpha=0.6), model, params, src, limits,
                             decode_len=64)          # Result: tokens [N, n, L], scores, log_probs

One contract (base.Search), one file per search, one registry (SEARCHES, by the name `--search`
takes), one loop that runs any of them (loop.py), one next-token model (ensemble.Ensemble: one
model or the mean of several). To add a search: a new file with a `Search` subclass, a line below,
and its tests against a plain reference (textbook.py); docs/architecture.md shows one such diff.
"""

from __future__ import annotations

from typing import Any

import jax

from transformer.decoding.base import IMPOSSIBLE, Result, Search, Step, length_penalty, top_k
from transformer.decoding.beam import BeamSearch
from transformer.decoding.ensemble import Ensemble, Models, as_ensemble, forced_log_probs
from transformer.decoding.greedy import Greedy
from transformer.decoding.loop import history_mask, run
from transformer.decoding.sampling import Sampling

SEARCHES: dict[str, type[Search]] = {
    "beam": BeamSearch,
    "greedy": Greedy,
    "sample": Sampling,
}


def decode(search: Search, models: Models, params: Any, src: jax.Array, limits: jax.Array,
           decode_len: int, min_len: jax.Array | None = None, slots: int | None = None) -> Result:
  """Runs `search` on the sentences `src` [N, S] (EOS-terminated, PAD after) with one model or an
  ensemble (a sequence of models and one of their parameters).

  `limits` [N]: output length limit per sentence, EOS included (0 = a padding entry, last in the
  queue); `decode_len` >= max(limits): the static length of outputs and caches; `min_len` [N]:
  tokens before EOS at least; `slots`: sentences decoded at a time (default: all N).
  Compiled as one program (called outside jit, the encoder and the loop's set-up would otherwise
  run op by op, several times slower for small inputs); inside a jitted function it is inlined.
  """
  def one_program(params, src, limits, min_len):
    ensemble = Ensemble(models, params, src, decode_len, search.beam_size, slots or src.shape[0])
    return run(search, ensemble, limits, min_len)
  return jax.jit(one_program)(params, src, limits, min_len)


__all__ = ["IMPOSSIBLE", "SEARCHES", "BeamSearch", "Ensemble", "Greedy", "Result", "Sampling",
           "Search", "Step", "as_ensemble", "decode", "forced_log_probs", "history_mask",
           "length_penalty", "top_k"]
