"""A paper-faithful JAX/Flax Transformer for machine translation; docs/architecture.md maps it."""

import multiprocessing
import os
import sys

from transformer import hardware


def _import_jax_quietly() -> None:
  """A program (a console script or `python -m`) imports JAX here, first, with stderr closed when
  the machine has no GPU: JAX's CUDA plugin, installed for transformer-compile, otherwise prints
  "could not find cuda drivers" lines as JAX loads it (cli.run_program quiets its registration).
  Where a GPU exists nothing is hidden; other processes (tests, data workers, which need no JAX)
  import nothing here."""
  program = os.path.basename(sys.argv[0]) if sys.argv else ""
  if not (program.startswith("transformer-") or program == "-m") or "jax" in sys.modules:
    return
  if multiprocessing.parent_process() is not None:  # a worker spawned with the program's argv
    return
  if hardware.accelerator_devices()["gpu"]:
    return
  try:
    with hardware.silenced_stderr():
      import jax  # noqa: F401
  except Exception:  # noqa: S110 (an import that fails here fails again, loudly, where it is used)
    pass


_import_jax_quietly()
