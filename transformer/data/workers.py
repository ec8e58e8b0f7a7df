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

Signals are the parent's alone. Ctrl-C, a closed terminal and a scheduler's cancel signal the whole
process group, workers and multiprocessing's resource tracker included; a worker that died of it
would print its traceback, and a tracker killed by SIGHUP is restarted by the parent's clean-up and
then complains of every name it never saw (`KeyError: '/mp-...'`). So both are started with
SIGINT, SIGTERM and SIGHUP blocked (a mask survives fork and exec), and a worker ignores them
before it unblocks them: it ends when its parent shuts it down or dies.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import multiprocessing
import multiprocessing.resource_tracker
import os
import signal
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


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
  """Holds the stop signals back while a child process starts, and answers them once it has.
  Blocked in this thread, so the child starts with them blocked (a mask survives fork and exec);
  and, since Python runs its handlers in the main thread whichever thread a signal reached,
  recorded there by a stand-in handler and raised again afterwards."""
  caught: list[int] = []
  handlers = ({sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
               for sig in STOP_SIGNALS} if threading.current_thread() is threading.main_thread()
              else {})
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    for sig, handler in handlers.items():
      signal.signal(sig, handler)
    for sig in dict.fromkeys(caught):
      signal.raise_signal(sig)


class _Executor(concurrent.futures.ProcessPoolExecutor):
  """Spawns each worker with the stop signals blocked (ProcessPoolExecutor spawns on demand, from
  `submit`, through this method)."""

  def _spawn_process(self) -> None:
    with stop_signals_held():
      super()._spawn_process()


def leave_stops_to_parent(*_) -> None:
  """First thing in a child started under `stop_signals_held`: the stop signals are ignored (the
  pending ones dropped) and unblocked; the parent answers them and ends its children."""
  for sig in STOP_SIGNALS:
    signal.signal(sig, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _start_worker(parent: int, initializer: Callable[..., None], initargs: tuple) -> None:
  leave_stops_to_parent()
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
  with stop_signals_held():  # the resource tracker starts here, with the executor's queues
    multiprocessing.resource_tracker.ensure_running()
    executor = _Executor(workers, mp_context=multiprocessing.get_context("spawn"),
                         initializer=_start_worker, initargs=(os.getpid(), initializer, initargs))
  try:
    yield executor
  except Exception:
    executor.shutdown(wait=True, cancel_futures=True)  # the running tasks finish: seconds
    raise
  except BaseException:  # a stop (Ctrl-C, SIGTERM): their work is not wanted, end them now
    _kill_workers(executor)
    try:
      executor.shutdown(wait=True, cancel_futures=True)
    finally:  # a second Ctrl-C while shutting down: still no worker left behind
      _kill_workers(executor)
    raise
  executor.shutdown(wait=True)


def _kill_workers(executor: concurrent.futures.ProcessPoolExecutor) -> None:
  """SIGKILL to every worker (they ignore the others); the executor sees a broken pool and ends."""
  for process in list((executor._processes or {}).values()):  # no public handle on the workers
    with contextlib.suppress(OSError, ValueError):
      process.kill()


def finish_shared_memory_frees() -> None:
  """Waits for the thread in which Grain frees the shared memory its workers' batches came in: a
  block whose free was still queued when the program exits (a stop exits at once) would be
  reported by multiprocessing's resource tracker as leaked. The thread is one (Grain starts it
  with `enable_async_del(1)`), so a task given to it runs after every free queued before it."""
  from grain._src.python.ipc.shared_memory_array import SharedMemoryArray
  pool = getattr(SharedMemoryArray, "_del_thread_pool", None)  # no public handle on it
  if pool is not None:
    pool.apply(int)
