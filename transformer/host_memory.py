"""Host memory that XLA's CPU runtime can reuse from call to call.

XLA's CPU runtime allocates each call's temporaries as one block (600 MB for the default config's
train step) and frees it when the call ends. glibc's malloc serves a block that large with a fresh
`mmap` and returns it with `munmap`, so every step touched 150k new pages: each a page fault the
kernel zero-fills, 12-17% of the default CPU step (docs/performance.md). The numbers computed do not
change, only where the memory comes from.

`reuse_freed_memory()` makes malloc serve large blocks from the heap and keep what is freed, so the
same pages come back every step. That holds for the main thread's heap only: other threads' malloc
arenas map large blocks anyway. So it also turns off JAX's asynchronous dispatch on the CPU, which
runs each call on the calling (main) thread instead of a worker: the step measured no slower for
it, and compiling keeps its own threads (forcing every thread onto one arena instead made compiling
30% slower). Accelerators' dispatch is not affected.

It must run before JAX starts its backend; the programs call it first thing (cli.run_program).
Elsewhere than glibc (macOS, musl) it only sets the dispatch; with the environment variable
TRANSFORMER_MALLOC_DEFAULTS=1 it does nothing (to measure the difference, or to use another allocator
through LD_PRELOAD).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger("transformer")

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1  # free memory at the top of the heap kept before it is given back
M_MMAP_MAX = -4  # how many blocks may be served by mmap: 0 = none, all come from the heap
KEEP_FREED_BYTES = 2**31 - 1  # mallopt takes an int: keep up to 2 GiB of freed memory


@functools.cache
def _glibc() -> ctypes.CDLL | None:
  """The C library if it is glibc (found once: `find_library` runs a subprocess), else None."""
  name = ctypes.util.find_library("c")
  libc = ctypes.CDLL(name) if name else None
  return libc if libc is not None and hasattr(libc, "gnu_get_libc_version") else None


def reuse_freed_memory() -> bool:
  """Sets glibc's malloc to keep and reuse large freed blocks, and CPU calls to run on the calling
  thread; False where malloc was left as it is."""
  if os.environ.get("TRANSFORMER_MALLOC_DEFAULTS") == "1":
    return False
  import jax  # (here: the input side's worker processes import this module, and never JAX)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  libc = _glibc()
  if libc is None:
    return False  # not glibc: its malloc has its own policy
  done = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES) == 1
  if not done:
    log.warning("Could not set glibc's malloc to reuse freed memory; CPU steps may be ~15% slower")
  return done


def release_freed_memory() -> None:
  """Gives the memory malloc holds freed back to the system (glibc's malloc_trim): after one-off
  work (training a vocabulary, planning an epoch) whose temporaries `reuse_freed_memory` would
  otherwise keep resident for the rest of the run. A no-op elsewhere than glibc."""
  libc = _glibc()
  if libc is not None:
    libc.malloc_trim(0)
