"""Positional encodings, by the name `config.model.positional` takes.

Every kind is one file in this folder: a `PositionalEncoding` subclass decorated with `@register`
(base.py says what a kind may do: add to the embeddings, bias the attention scores, act on each
self-attention layer's queries, keys and values). The config, the parameter and FLOP counts, the
searches' length limits, the export to inference engines and the figures ask it what they need, so
nothing else names a kind. Files here are imported when the package is, so a new file is the whole
change.
"""

from __future__ import annotations

import importlib
import pkgutil

from transformer.model.positions.base import (
  Drawing,
  Key,
  PositionalEncoding,
  Terms,
  adds_tables,
  all_keys,
  check_config,
  ctranslate2_refusal,
  get,
  in_ctranslate2,
  kinds,
  option,
  positive_param,
  register,
)

# The default first and the paper's other kind second, then the rest as the documentation lists them;
# a new file needs no entry here (it follows, alphabetically).
_LISTED = ("sinusoidal", "learned", "relative", "t5", "rotary", "alibi", "none")
for _name in (*_LISTED, *sorted(m.name for m in pkgutil.iter_modules(__path__))):
  if _name != "base":
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["Drawing", "Key", "PositionalEncoding", "Terms", "adds_tables", "all_keys",
           "check_config", "ctranslate2_refusal", "get", "in_ctranslate2", "kinds", "option",
           "positive_param", "register"]
