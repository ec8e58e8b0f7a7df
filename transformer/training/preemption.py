"""Stopping a training run cleanly on SIGTERM, SIGHUP or SIGINT (preemption, `scancel`, a closed
terminal, Ctrl-C).

The first signal only sets a flag: the trainer finishes the step it is in, writes a checkpoint, and
exits with status EXIT_INTERRUPTED and one line saying where it stopped. A second SIGINT stops at
once (Ctrl-C twice). A run killed harder than that (`kill -9`, a lost node) resumes from its latest
complete checkpoint: Orbax writes each one under a temporary name and renames it when complete.

In a multi-process job every process must save the same step, so the decision goes through JAX's
preemption service: it catches SIGTERM in every process, tells the others, and
`reached_preemption_sync_point(step)` becomes true at the same step everywhere. SIGINT and SIGHUP
are forwarded to it as SIGTERM.
"""

from __future__ import annotations

import os
import signal
import types

import jax

from transformer import stops

# sysexits.h EX_TEMPFAIL, "a temporary failure; the user is invited to retry": schedulers and
# wrapper scripts can requeue on it, and tell it from success (0) and errors (1).
EXIT_INTERRUPTED = 75


class Interrupted(Exception):
  """Training stopped at a signal after saving a checkpoint; the message says where."""


class StopRequests:
  """Catches SIGTERM/SIGHUP/SIGINT while training; `requested(step)` says whether to stop after `step`.

  Use as a context manager around the training loop: outside it the default handlers apply (a
  signal during start-up, before there is anything to save, ends the program as usual).
  """

  def __init__(self):
    self.signal_name: str | None = None
    self._multi_process = jax.process_count() > 1
    self._previous: dict[int, object] = {}

  def __enter__(self) -> StopRequests:
    signals = ((signal.SIGINT, signal.SIGHUP) if self._multi_process else
               (signal.SIGINT, signal.SIGHUP, signal.SIGTERM))
    for sig in signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    if self.signal_name is not None and signum == signal.SIGINT:
      stops.interrupt_now(signum, frame)  # the second Ctrl-C: stop now
    self.signal_name = signal.Signals(signum).name
    if self._multi_process:  # JAX's preemption service agrees on the step with the other processes
      os.kill(os.getpid(), signal.SIGTERM)

  def requested(self, step: int) -> bool:
    """True once a stop was asked for (in any process of the job), at the step to save."""
    if self._multi_process:
      from jax.experimental import multihost_utils
      if multihost_utils.reached_preemption_sync_point(step):
        self.signal_name = self.signal_name or "SIGTERM"
        return True
      return False
    return self.signal_name is not None
