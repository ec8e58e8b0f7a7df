"""Which code is running: the git commit of the checkout the package is imported from, so that a
run's metrics (its 'start' record) and every record say what trained or measured them."""

from __future__ import annotations

import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def commit(excluded: Path | None = None, checkout: Path = PACKAGE) -> str:
  """The commit of the checkout holding `checkout` (default: this package's), with ' + uncommitted
  changes' when tracked files differ from it; files under `excluded` do not count (a record's own
  folder: recording rewrites it, and it is the record, not the code). 'unknown (not a git
  checkout)' for an installed copy."""
  def git(*args: str) -> str:
    try:
      return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                            check=False).stdout
    except OSError:  # no git on this machine
      return ""
  head = git("rev-parse", "--short=12", "HEAD").strip()
  if not head:
    return "unknown (not a git checkout)"
  changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
  if excluded is not None:
    top, folder = Path(git("rev-parse", "--show-toplevel").strip()), Path(excluded).resolve()
    if folder.is_relative_to(top):
      changed = [path for path in changed if not Path(path).is_relative_to(folder.relative_to(top))]
  return head + (" + uncommitted changes" if changed else "")
