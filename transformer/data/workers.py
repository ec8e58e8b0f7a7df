"""Worker processes for the input side's one-off jobs (tokenizing a corpus, writing the stand-in).

An executor whose shutdown is deterministic however the block ends: on an error the tasks not yet
started are cancelled and the running ones (one a worker) finish, so a failed job ends in seconds;
a worker that dies (killed, out of memory) is `BrokenProcessPool` at the next result, not a hang.
multiprocessing.Pool could hang for ever in its terminate() while its task thread was blocked
sending a large task to workers that had stopped reading (a full disk in the writer did that).
Workers are spawned, never forked: the parent may have JAX's threads. With one worker the tasks run
in this process, where processes would cost more than they save.

No worker outlives its parent, however the parent ends: a stop at SIGTERM shuts the executor down
on the way out, and each worker also watches its parent (`_watch_parent`) and exits within a
second of its death, a `kill -9` included (a worker blocked on its pipe would otherwise wait for
ever, and keep multiprocessing's resource tracker alive with it).
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator

BrokenWorkers = concurrent.futures.process.BrokenProcessPool


class InProcess(concurrent.futures.Executor):
  """An executor that runs each task at once, in this process."""

  def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
      future.set_result(fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001  (raised by result(), as from a process)
      future.set_exception(e)
    return future

  def map(self, fn, *iterables, timeout=None, chunksize=1) -> Iterator:
    """Lazily, one task as each result is asked for (not all of them first)."""
    return map(fn, *iterables)


PARENT_POLL_SECONDS = 0.5


def _watch_parent(parent: int) -> None:
  """Ends this worker as soon as its parent is gone (it is then reparented: getppid changes)."""
  while os.getppid() == parent:
    time.sleep(PARENT_POLL_SECONDS)
  os._exit(1)


def _start_worker(parent: int, initializer: Callable[..., None], initargs: tuple) -> None:
  threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                   name="watch-parent").start()
  initializer(*initargs)


@contextlib.contextmanager
def worker_processes(workers: int, initializer: Callable[..., None], initargs: tuple = ()
                     ) -> Iterator[concurrent.futures.Executor]:
  """`workers` processes, each set up by `initializer(*initargs)`; shut down on leaving."""
  if workers <= 1:
    initializer(*initargs)
    yield InProcess()
    return
  executor = concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
      initargs=(os.getpid(), initializer, initargs))
  try:
    yield executor
  finally:
    executor.shutdown(wait=True, cancel_futures=True)
