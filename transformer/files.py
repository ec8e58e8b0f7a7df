"""Files written whole or not at all, directories checked before long work, and locks that make
processes preparing the same thing wait for each other."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
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
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)  # read-only, or not ours to write
log = logging.getLogger("transformer")


def disk_problem(error: OSError) -> str:
  """What an OSError from a write means for the user, in a few words and what to do."""
  if error.errno in DISK_FULL:
    return f"the disk is full ({error.strerror}); free space or write elsewhere"
  if error.errno in NOT_WRITABLE:
    return f"it cannot be written ({error.strerror}); write elsewhere"
  return f"{error.strerror or error}"


def writable_directory(path: str | os.PathLike, setting: str, create: bool = True,
                       advice: str = "") -> Path:
  """`path`, created if missing and checked to take a file; else a UserError naming it and the
  `setting` that moves it (a read-only or another user's directory), or giving `advice`. With
  `create=False` nothing is made: the directory, or the nearest folder above it that exists, must
  take a file (a check before long work whose outputs come at the end)."""
  path = Path(path)
  advice = advice or f"point {setting} at a directory this job can write, or make it writable"
  try:
    if create:
      path.mkdir(parents=True, exist_ok=True)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
      raise UserError(f"cannot write in {path}: {existing} is a file, not a directory; point "
                      f"{setting} elsewhere")
    with tempfile.TemporaryFile(dir=existing):
      pass
  except OSError as e:
    if e.errno in DISK_FULL:
      raise UserError(f"cannot write in {path}: the disk is full ({e.strerror}); free space or "
                      f"point {setting} elsewhere") from None
    raise UserError(f"cannot write in {path} ({e.strerror}): {advice}") from None
  return path


def writable_file(path: str | os.PathLike, setting: str, advice: str = "") -> Path:
  """`path` checked, before long work, to be a file this job can write or add to (its folder
  takes a new file; the file, if there, opens for writing); nothing is changed or created. Else a
  UserError naming it and the `setting` that moves it, or giving `advice`."""
  path = Path(path)
  if path.is_dir():
    raise UserError(f"{setting}={path} is a directory; pass a file name")
  writable_directory(path.parent, setting, create=False, advice=advice or (
      f"point {setting} into a directory this job can write, or make it writable"))
  if path.exists():
    try:
      with open(path, "ab"):  # opened for appending, nothing written: the file stays as it is
        pass
    except OSError as e:
      advice = advice or f"point {setting} at a file this job can write, or make it writable"
      raise UserError(f"cannot write {path} ({e.strerror}): {advice}") from None
  return path


STALE_SECONDS = 600  # a partial build of another host (or an older version) untouched this long


def partial_directory(target: Path) -> Path:
  """A new temporary directory beside `target` to build it in, named for this host and process
  (`.NAME.partial-HOST-PID-*`): a later build can tell one a killed build left
  (`remove_stale_partials`)."""
  return Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-{socket.gethostname()}-"
                                      f"{os.getpid()}-", dir=target.parent))


def remove_stale_partials(target: Path, what: str) -> int:
  """Removes the temporary directories killed builds of `target` (`what`: its kind, for the log
  line) left beside it: this host's whose process is gone, and others (another host's, an older
  version's) none of whose files changed for STALE_SECONDS. Returns the bytes freed, and logs
  them."""
  freed, count, host = 0, 0, socket.gethostname()
  for partial in target.parent.glob(f".{target.name}.partial-*"):
    tail = partial.name.rsplit(".partial-", 1)[1].rsplit("-", 2)
    ours = len(tail) == 3 and tail[0] == host and tail[1].isdigit()
    try:
      stats = [f.stat() for f in partial.rglob("*")] + [partial.stat()]
    except OSError:
      continue  # gone meanwhile
    if ours and _alive(int(tail[1])):
      continue
    if not ours and time.time() - max(s.st_mtime for s in stats) < STALE_SECONDS:
      continue
    shutil.rmtree(partial, ignore_errors=True)
    freed, count = freed + sum(s.st_size for s in stats[:-1]), count + 1
  if count:
    log.info("Removed %d partial build(s) of %s %s that killed builds left (%.1f MB freed)", count,
             what, target.name, freed / 1e6)
  return freed


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # another user's process
  return True


@contextlib.contextmanager
def exclusive(lock: str | os.PathLike, what: str) -> Iterator[None]:
  """Holds an exclusive lock on the file `lock` (made beside what it guards, removed afterwards)
  while the block runs: another process asking for it waits, saying for what and whom. An flock,
  which Linux's NFS client turns into an NFS lock, so hosts sharing the disk wait for each other
  too; on a file system without locks a warning says so and the block runs unguarded."""
  lock = Path(lock)
  while True:
    f = open(lock, "a+")
    try:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        log.info("Waiting for %s, which %s is making (lock: %s)", what, holder, lock)
        fcntl.flock(f, fcntl.LOCK_EX)
    except OSError as e:  # ENOLCK, EOPNOTSUPP: no locks on this file system
      f.close()
      lock.unlink(missing_ok=True)
      log.warning("cannot lock %s (%s): processes making %s at once will each make it (the last "
                  "one's is kept); make it once before starting several", lock, e.strerror, what)
      yield
      return
    try:  # the holder before us removed the file: lock the one that is there now
      if os.fstat(f.fileno()).st_ino == os.stat(lock).st_ino:
        break
    except FileNotFoundError:
      pass
    f.close()
  try:
    f.seek(0)
    f.truncate()
    f.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    f.flush()
    yield
  finally:
    lock.unlink(missing_ok=True)  # while still held: a waiter then finds its file gone, retries
    f.close()


def user_cache_dir(kind: str) -> Path:
  """$XDG_CACHE_HOME/transformer/<kind> (~/.cache/transformer/<kind>): caches shared by runs."""
  return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "transformer" / kind
