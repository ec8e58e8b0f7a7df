"""Files written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
  """Writes `data` (text as UTF-8) to a temporary file beside `path` and renames it over `path`:
  a reader sees the old file or the new one, and a run killed midway never leaves half a file."""
  path = Path(path)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
  os.replace(tmp, path)


def user_cache_dir(kind: str) -> Path:
  """$XDG_CACHE_HOME/transformer/<kind> (~/.cache/transformer/<kind>): caches shared by runs."""
  return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "transformer" / kind
