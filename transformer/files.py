"""Files written whole or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from transformer.errors import UserError


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
  """Writes `data` (text as UTF-8) to a temporary file beside `path` and renames it over `path`:
  a reader sees the old file or the new one, and a run killed midway never leaves half a file.
  A failed write (a full disk) removes the temporary file and is a UserError saying so."""
  path = Path(path)
  tmp = path.with_name(path.name + ".tmp")
  try:
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    raise UserError(f"could not write {path}: {disk_problem(e)}") from None


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a full disk or a spent quota


def disk_problem(error: OSError) -> str:
  """What an OSError from a write means for the user, in a few words and what to do."""
  if error.errno in DISK_FULL:
    return f"the disk is full ({error.strerror}); free space or write elsewhere"
  return f"{error.strerror or error}"


def user_cache_dir(kind: str) -> Path:
  """$XDG_CACHE_HOME/transformer/<kind> (~/.cache/transformer/<kind>): caches shared by runs."""
  return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "transformer" / kind
