"""What the command-line programs share: one runner (`run_program`), flag parsing that fails in one
line, and log set-up.

Every program ends the same way: a user's mistake (a flag, a config value, a path, a file:
errors.UserError, or absl's UsageError) prints `<program>: error: <what and how to fix it>` on
stderr and exits with status 2; `--help` prints the usage and exits 0; anything else is a bug and
keeps its traceback (status 1).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import ml_collections
from absl import app, flags

from transformer import stops
from transformer.errors import EXIT_USER_ERROR, UserError
from transformer.files import (
  DISK_FULL,
  NOT_WRITABLE,
  disk_problem,
  user_cache_dir,
  writable_directory,
)


def flags_parser(program: str) -> Callable[[list[str]], list[str]]:
  """An `app.run(flags_parser=...)` that turns every flag or config mistake into one line."""
  def parse(argv: list[str]) -> list[str]:
    logging.getLogger("absl").setLevel(logging.ERROR)  # ml_collections' warnings: ours are clearer
    try:
      remaining = flags.FLAGS(argv)
      for name, path in config_files(argv).items():
        config = flags.FLAGS[name].value
        if config is not None:
          config.get("seed")  # ml_collections reports a failed load only on first use
        if not isinstance(config, ml_collections.ConfigDict):
          what = "None" if config is None else f"a {type(config).__name__}"
          fail(program, f"cannot load --{name}={path}: its get_config() returned {what}, not an "
                        "ml_collections.ConfigDict; end it with `return config`")
      return remaining
    except SystemExit as e:  # absl's --help exits 1 after printing the usage; asking is no error
      if e.code == 1 and any(a.split("=")[0] in HELP_FLAGS for a in argv[1:]):
        sys.exit(0)
      raise
    except BrokenPipeError:  # `--help | head`: the reader has gone; leave quietly
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      sys.exit(1)
    except Exception as e:  # noqa: BLE001 - each kind is told apart below
      fail(program, flag_error(e, argv))
  return parse


def flag_error(error: Exception, argv: list[str]) -> str:
  """The one line for an exception raised while parsing the flags: from inside a config file
  (anything its code raises, with the file's line), the config file itself (missing, not Python,
  no get_config()), or a flag (unknown, a bad value, an override of a key that does not exist)."""
  files = config_files(argv)
  inside = raised_inside(error, files.values())
  if inside:
    name, path = next((n, p) for n, p in files.items() if p.split(":")[0] == inside[1])
    cause, line = inside[0], inside[2]
    if isinstance(cause, UserError):  # ours (an unknown ':size'): it says what to do
      return f"cannot load --{name}={path}: {cause}"
    what = str(cause) if type(cause) is ValueError else f"{type(cause).__name__}: {cause}"
    return f"cannot load --{name}={path}: {what} (line {line} of {inside[1]})"
  name, path = next(iter(files.items()), ("config", "?"))
  if isinstance(error, SyntaxError):  # the config file is not valid Python
    return f"cannot load --{name}={path}: {error.msg} at line {error.lineno} of {error.filename}"
  if isinstance(error, flags.Error):
    return str(error).strip().splitlines()[0]
  if isinstance(error, (AttributeError, KeyError)):  # an override of a key that does not exist
    if "get_config" in str(error):
      return (f"cannot load --{name}={path}: it defines no get_config() function (see "
              "configs/multi30k.py)")
    key = str(error).strip("\"'")
    bad = [a.split("=")[0] for a in argv
           if a.startswith("--") and re.search(rf"[.]{re.escape(key)}\b", a.split("=")[0])]
    where = f" ({bad[0]})" if bad else ""
    return f"unknown config key {key!r}{where}; every key is listed in transformer/config.py"
  if isinstance(error, OSError):  # ml_collections could not open the config file
    reason = str(error).strip().splitlines()[-1].strip()
    return f"cannot load --{name}={path}: {reason.split('earlier failure to load: ')[-1]}"
  if isinstance(error, ValueError):  # a flag's value that cannot be parsed
    return str(error)
  raise error  # a bug of ours: its traceback stays


def config_files(argv: list[str]) -> dict[str, str]:
  """{flag name: the value given} of the config-file flags on the command line (--config, --base)."""
  names = [name for name in ("config", "base") if name in flags.FLAGS]
  given = {}
  for i, arg in enumerate(argv):
    for name in names:
      if arg.startswith(f"--{name}="):
        given[name] = arg.split("=", 1)[1]
      elif arg == f"--{name}" and i + 1 < len(argv):
        given[name] = argv[i + 1]
  return given


def raised_inside(error: BaseException, paths) -> tuple[BaseException, str, int] | None:
  """(the exception, the file, its line) where `error` or an exception it was raised from came
  out of one of the config files at `paths` (its last frame there), else None."""
  files = {str(Path(p.split(":")[0]).resolve()): p.split(":")[0] for p in paths}
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    found, tb = None, error.__traceback__
    while tb is not None:
      name = tb.tb_frame.f_code.co_filename
      if name in files or str(Path(name).resolve()) in files:
        found = (error, files.get(name) or files[str(Path(name).resolve())], tb.tb_lineno)
      tb = tb.tb_next
    if found:
      return found
    error = error.__cause__ or error.__context__
  return None


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def fail(program: str, message: object) -> None:
  """Ends the program for a user's mistake: one line on stderr, exit status 2."""
  print(f"{program}: error: {message}", file=sys.stderr)
  sys.exit(EXIT_USER_ERROR)


def config_path(argv: list[str]) -> str:
  return config_files(argv).get("config", "?")


def define_distributed_flags() -> None:
  """The flags of programs that can run as one process of a multi-host job (distributed.py)."""
  flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                    "Join a multi-process job: 'auto' when the flags below or the environment "
                    "(SLURM, Open MPI, JAX_COORDINATOR_ADDRESS) describe one; 'on' always (JAX "
                    "detects the cluster, e.g. a TPU pod slice); 'off' never.")
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (with the next two).")
  flags.DEFINE_integer("num_processes", None, "Processes in the job.")
  flags.DEFINE_integer("process_id", None, "This process's index, 0 .. num_processes - 1.")


def define_progress_flag() -> None:
  """The flag of programs with a progress display (progress.py)."""
  from transformer.progress import MODES
  flags.DEFINE_enum("progress", "auto", list(MODES), "Progress display: 'auto' = a bar on a "
                    "terminal, plain periodic log lines otherwise; 'bar', 'lines' or 'off'.")


def deprecated(old: str, new: str) -> None:
  """The line a renamed flag or program prints when its old name is used; the old name still works."""
  print(f"warning: {old} is deprecated and will be removed; use {new}", file=sys.stderr)


def initialize_distributed() -> None:
  """Joins the job the distributed flags describe (call first in main, before any device use)."""
  from transformer import distributed
  f = flags.FLAGS
  distributed.initialize(f.distributed, f.coordinator_address, f.num_processes, f.process_id)


def run_program(program: str, main: Callable[[list[str]], None],
                takes_arguments: bool = False, compilation_cache: bool = True) -> None:
  """absl's app.run with one-line errors (module docstring), and our log set-up once absl has
  made its own. Positional arguments are a usage error unless the program `takes_arguments`.

  First of all, before JAX starts its backend, malloc is set to reuse XLA's per-call CPU
  temporaries (host_memory.py). Programs that run what they compile keep the executables in JAX's
  persistent compilation cache (`--compilation_cache`), so a second run loads instead of compiling.
  """
  from transformer.host_memory import reuse_freed_memory
  reuse_freed_memory()
  use_present_accelerators_only()  # transformer-compile too: its GPU compiler needs exactly this
  if compilation_cache:
    flags.DEFINE_string("compilation_cache", default_cache_dir(), "Directory of JAX's persistent "
                        "compilation cache (compiled programs reused by later runs; "
                        "$JAX_COMPILATION_CACHE_DIR if set); '' turns it off.")

  def main_with_logging(argv: list[str]) -> None:
    setup_logging()
    stops.install(program)
    if compilation_cache:
      use_compilation_cache(flags.FLAGS.compilation_cache)
    try:
      if "cpu_devices" in flags.FLAGS:  # the programs that translate (define_search_flags)
        from transformer.partitioning import use_cpu_devices
        use_cpu_devices(flags.FLAGS.cpu_devices)
      if len(argv) > 1 and not takes_arguments:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
      main(argv)
    except (UserError, app.UsageError) as e:
      fail(program, e)
    except OSError as e:  # a full disk or a path not ours anywhere (metrics, event files, reports)
      if e.errno in DISK_FULL:
        fail(program, f"could not write {e.filename or 'a file'}: {disk_problem(e)}")
      if e.errno not in NOT_WRITABLE or not e.filename:  # (each program checks its outputs first;
        raise                                           # this is the net under those checks)
      fail(program, f"cannot use {e.filename} ({e.strerror}): give a path this job may write "
                    "(and read), or change its permissions")
    except KeyboardInterrupt:  # a Ctrl-C outside training (a second one: stops.interrupt_now)
      stopped = ("interrupted", 130)  # the shell's status for SIGINT
    except stops.Stopped as e:
      stopped = (f"stopped by {e.signal_name} before it finished; what it had finished is kept "
                 "and nothing half-written is left: run the same command again to go on",
                 stops.EXIT_STOPPED)
    else:
      return
    # The `with` blocks cleaned up on the way here. Out of the handler the exception's frames are
    # freed (multiprocessing's queues release their semaphores); exiting at once then skips the
    # interpreter's joins of threads (a loader's, an executor's), which a stop must not wait on.
    print(f"{program}: {stopped[0]}", file=sys.stderr)
    stops.exit_now(stopped[1])

  show_flags_in_help(main.__module__)
  app.run(main_with_logging, flags_parser=flags_parser(program))


def use_present_accelerators_only() -> None:
  """On a machine with neither a GPU nor a TPU, JAX is told to use its CPU backend only, so that
  plugins installed for transformer-compile (CUDA, libtpu) do not try to start, fail and print
  their tracebacks and warnings ahead of the program's words; the CUDA plugin still registers
  its compiler, which is what transformer-compile uses for GPU clusters. A machine with an
  accelerator, or a JAX_PLATFORMS the user set, is left as it is: its errors are real."""
  from transformer.hardware import accelerator_devices, silenced_stderr
  if any(accelerator_devices().values()):
    return
  import jax
  if "JAX_PLATFORMS" not in os.environ:
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
  if os.environ["JAX_PLATFORMS"] == "cpu":
    # Registering the plugins loads the CUDA plugin's library, which logs that no GPU is there.
    # Registration only (no backend starts), so distributed start-up and device counts still apply.
    from jax._src import xla_bridge
    if hasattr(xla_bridge, "_discover_and_register_pjrt_plugins"):
      with silenced_stderr():
        xla_bridge._discover_and_register_pjrt_plugins()


def default_cache_dir() -> str:
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  return str(user_cache_dir("jax"))


def use_compilation_cache(directory: str) -> None:
  """JAX's persistent compilation cache in `directory` ('' = off). Every program compiled for over
  a second is kept: transformer-eval's decode compiles as long as it runs on a CPU. (JAX keeps
  XLA's GPU autotuning results there too: `jax_persistent_cache_enable_xla_caches`.) A directory
  this job cannot write (read-only, another user's, a full disk) is said once, and the program
  runs without the cache rather than warn at every compilation."""
  import jax
  if directory:
    try:
      writable_directory(directory, "--compilation_cache")
    except UserError as e:
      logging.getLogger("transformer").warning("%s; running without the compilation cache", e)
      directory = ""
  if not directory:
    jax.config.update("jax_enable_compilation_cache", False)
    return
  jax.config.update("jax_compilation_cache_dir", directory)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def usage(module_doc: str) -> str:
  """What --help opens with: the program module's docstring up to its examples (what the program
  does for a user, then example commands); the rest of the docstring is for readers of the code."""
  return "\n\n".join(module_doc.strip("\n").split("\n\n")[:2]) + "\n"


def show_flags_in_help(module: str) -> None:
  """--help lists the flags and docstring of the main script only; a console script
  (transformer-eval) is not the module that defines them, so it gets the program's `usage`, and
  the program's flags and the shared ones (defined here) become its key flags."""
  main_module = sys.modules["__main__"]
  main_module.__doc__ = usage(sys.modules[module].__doc__ or "")
  by_module = flags.FLAGS.flags_by_module_dict()
  for name in (module, __name__):
    for flag in by_module.get(name, []):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def setup_logging() -> None:
  """Our INFO lines, timestamped on stderr; JAX's only from WARNING up.

  Orbax logs through absl, and reports a failed background read or write as pages of ERROR lines
  and asyncio tracebacks before raising it to us; the programs turn the raised error into one line
  (checkpoints.py), so those echoes are kept off the terminal.
  """
  logging.getLogger("jax").setLevel(logging.WARNING)
  for library in ("absl", "asyncio"):
    logging.getLogger(library).setLevel(logging.CRITICAL)
  quiet_background_failures()
  logger = logging.getLogger("transformer")
  if not logger.handlers:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False


def quiet_background_failures() -> None:
  """Keeps the leftovers of a failed Orbax read or write off the terminal.

  When a read of a damaged checkpoint fails, TensorStore callbacks still pending on Orbax's closed
  event loop raise "Event loop is closed" (and the abandoned reads their own errors) as
  thousands of lines of unraisable-exception tracebacks; after a failed write, its abandoned
  coroutines warn at exit. The failure itself reaches the caller as an exception, which the
  programs report in one line; these echoes are dropped. (Our code has no coroutines of its own.)
  """
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                          category=RuntimeWarning)
  previous = sys.unraisablehook

  def hook(unraisable):
    text = f"{unraisable.exc_value} {unraisable.object!r}"
    if "Event loop is closed" in text or "_read_array_index_and_device_put" in text:
      return
    previous(unraisable)

  if getattr(previous, "__name__", "") != "orbax_echo_filter":
    hook.__name__ = "orbax_echo_filter"
    sys.unraisablehook = hook
