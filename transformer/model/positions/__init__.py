"""Positional encodings, by the name `config.model.positional` takes.

Every kind is one file in this folder: a `PositionalEncoding` subclass decorated with `@register`.
The model adds it to the embeddings; the parameter count, the searches' length limits, the export
to inference engines and the attention-map figures ask it what they need (`table`, `longest`,
`param_count`), so nothing else names a kind. Files here are imported when the package is, so a new
file is the whole change.
"""

from __future__ import annotations

import importlib
import pkgutil

from transformer.model.positions import sinusoidal  # noqa: E402,F401  (the default, listed first)
from transformer.model.positions.base import PositionalEncoding, get, kinds, register

for _module in pkgutil.iter_modules(__path__):
  if _module.name not in ("base", "sinusoidal"):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PositionalEncoding", "get", "kinds", "register"]
