"""SIGTERM and SIGHUP outside the training loop: a clean stop, not a kill.

A cluster ends a job with SIGTERM (SLURM at its time limit, Kubernetes at eviction, a TPU VM at
preemption) and a closed terminal sends SIGHUP. Python's default for both is to die on the spot,
which leaves a half-built cache and its worker processes behind. `cli.run_program` installs
`raise_stopped` for both instead: the signal becomes a `Stopped` exception in the main thread, so
every `with` block on the way out runs (a partial token cache is removed, worker processes are shut
down) and the program ends with one line and EXIT_STOPPED, the status the trainer uses when it stops
at a signal with a checkpoint. The training loop replaces these handlers with its own while it runs
(training/preemption.py: it finishes the step and saves first).

`Stopped` derives from BaseException, like KeyboardInterrupt, so `except Exception` never swallows it.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import types

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped before the end; the same command again goes on
SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
  """The program was asked to stop (SIGTERM, SIGHUP) before it finished."""

  def __init__(self, signal_name: str):
    super().__init__(signal_name)
    self.signal_name = signal_name


def raise_stopped(signum: int, frame: types.FrameType | None) -> None:
  raise Stopped(signal.Signals(signum).name)


EXIT_INTERRUPTED_TWICE = 130  # the shell's status for SIGINT
_program = "transformer"


def install(program: str = "transformer") -> None:
  """Makes SIGTERM and SIGHUP raise `Stopped` in the main thread (where Python runs handlers), and
  SIGINT KeyboardInterrupt once: a second SIGINT ends the program at once (`interrupt_now`)."""
  global _program
  _program = program
  if threading.current_thread() is threading.main_thread():
    for sig in SIGNALS:
      signal.signal(sig, raise_stopped)
    signal.signal(signal.SIGINT, first_interrupt)


def first_interrupt(signum: int, frame: types.FrameType | None) -> None:
  """The first Ctrl-C: KeyboardInterrupt, so that the `with` blocks clean up; the next one is
  `interrupt_now`."""
  signal.signal(signal.SIGINT, interrupt_now)
  raise KeyboardInterrupt


def interrupt_now(signum: int, frame: types.FrameType | None) -> None:
  """A second Ctrl-C ends the program at once, whatever the first one's clean-up was doing. It
  raises nothing: an exception raised where Python runs the handler next (a finalizer, one of the
  garbage collector's callbacks) would only be printed as 'Exception ignored in ...'."""
  os.write(2, f"{_program}: interrupted\n".encode())
  os._exit(EXIT_INTERRUPTED_TWICE)


def exit_now(status: int) -> None:
  """Ends the process at once, its output flushed: the `with` blocks have cleaned up, and a thread
  still inside native code (SentencePiece's trainer) would abort the interpreter's finalisation.
  What is unreachable is collected first, so finalizers that release shared resources (the
  semaphores of multiprocessing's queues) run rather than leave them to its resource tracker."""
  gc.collect()
  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  os._exit(status)
