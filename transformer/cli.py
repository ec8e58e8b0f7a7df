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
from collections.abc import Callable

from absl import app, flags

from transformer.errors import EXIT_USER_ERROR, UserError
from transformer.files import user_cache_dir


def flags_parser(program: str) -> Callable[[list[str]], list[str]]:
  """An `app.run(flags_parser=...)` that turns every flag or config mistake into one line."""
  def parse(argv: list[str]) -> list[str]:
    try:
      remaining = flags.FLAGS(argv)
      if "config" in flags.FLAGS and flags.FLAGS.config is not None:
        flags.FLAGS.config.get("seed")  # ml_collections reports a missing file only on first use
      return remaining
    except flags.Error as e:
      lines = str(e).strip().splitlines()
      if len(lines) > 1:  # a traceback from inside get_config(): keep the flag and the last line
        head = lines[0].split(": Error whilst")[0]
        lines = [f"{head}: {re.sub(r'^[A-Za-z.]*Error: ', '', lines[-1])}"]
      fail(program, lines[0])
    except SyntaxError as e:  # the config file is not valid Python
      fail(program, f"cannot load --config={config_path(argv)}: {e.msg} at line "
               f"{e.lineno} of {e.filename}")
    except (AttributeError, KeyError) as e:  # ml_collections: an override of a key that does not exist
      if "get_config" in str(e):
        fail(program, f"cannot load --config={config_path(argv)}: it defines no "
                 "get_config() function (see configs/multi30k.py)")
      key = str(e).strip("\"'")
      bad = [a.split("=")[0] for a in argv
             if a.startswith("--config.") and re.search(rf"[.]{re.escape(key)}\b", a.split("=")[0])]
      where = f" ({bad[0]})" if bad else ""
      fail(program, f"unknown config key {key!r}{where}; every key is listed in "
               "transformer/config.py")
    except SystemExit as e:  # absl's --help exits 1 after printing the usage; asking is no error
      if e.code == 1 and any(a.split("=")[0] in HELP_FLAGS for a in argv[1:]):
        sys.exit(0)
      raise
    except BrokenPipeError:  # `--help | head`: the reader has gone; leave quietly
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      sys.exit(1)
    except OSError as e:  # ml_collections could not load the config file
      reason = str(e).strip().splitlines()[-1].strip()
      reason = reason.split("because of an earlier failure to load: ")[-1]
      fail(program, f"cannot load --config={config_path(argv)}: {reason}")
    except ValueError as e:  # raised by a get_config(), e.g. an unknown ':size'
      fail(program, e)
  return parse


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def fail(program: str, message: object) -> None:
  """Ends the program for a user's mistake: one line on stderr, exit status 2."""
  print(f"{program}: error: {message}", file=sys.stderr)
  sys.exit(EXIT_USER_ERROR)


def config_path(argv: list[str]) -> str:
  return next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "?")


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


def define_search_flags(deprecated_sample_flag: bool = False) -> None:
  """The decoding flags of the programs that translate (translator.SearchSettings); unset flags
  take the run config's decode.* values. `deprecated_sample_flag`: also the old --sample
  (transformer-translate had it before --search)."""
  from transformer.decoding import SEARCHES
  flags.DEFINE_enum("search", None, list(SEARCHES), "The search (default: beam; beam search with "
                    "--beam_size=1 is greedy search).")
  flags.DEFINE_integer("beam_size", None, "Beam size (default: config.decode.beam_size; 1 = greedy).")
  flags.DEFINE_float("alpha", None, "Length-penalty alpha (default: config.decode.alpha).")
  flags.DEFINE_integer("max_extra_len", None, "Output length limit = input length + this.")
  flags.DEFINE_integer("min_len", None, "At least this many tokens before end-of-sentence (default: "
                       "config.decode.min_len, 0: the paper's search may output nothing; 1 forbids "
                       "the empty translation, as fairseq does).")
  flags.DEFINE_integer("nbest", None, "Also write the N best hypotheses of every sentence, with "
                       "their scores, as JSON lines (N <= beam size).")
  flags.DEFINE_list("ensemble", [], "More workdirs decoded together with --workdir (same "
                    "vocabulary): their log-probabilities are averaged at every step.")
  flags.DEFINE_integer("tokens_per_batch", None, "Source tokens per decoding batch: how many "
                       "sentences are decoded at a time (default: config.decode.tokens_per_batch; "
                       "1024 suits a CPU, runs trained before it was the default store 4096).")
  flags.DEFINE_string("matmul_dtype", None, "float32, bfloat16 or bfloat16_vocab: the search's "
                      "weight matrices (default: config.decode.matmul_dtype, float32). bfloat16 is "
                      "quantised decoding: faster on CPUs with AVX512-BF16 and on GPUs; sums and "
                      "activations stay float32; bfloat16_vocab rounds the projection onto the "
                      "vocabulary only (docs/evaluating.md gives the BLEU change of each).")
  flags.DEFINE_string("mbr", None, "Minimum Bayes risk decoding: 'chrf' or 'bleu' chooses, among "
                      "the beam's hypotheses, the one with the highest expected sentence chrF "
                      "(BLEU) against the others, weighted by their scores; '' = the best-scored "
                      "(default: config.decode.mbr). A larger beam gives it more candidates (8).")
  flags.DEFINE_float("mbr_temperature", None, "With --mbr: the softmax temperature over the "
                     "hypotheses' scores that weights them (default: config.decode.mbr_temperature).")
  flags.DEFINE_integer("cpu_devices", 0, "On a CPU: decode with this many JAX devices, each "
                       "translating its own share of the sentences (0 = one per core; 1 = one "
                       "device). XLA runs the decoder's small matrix products on one core per "
                       "device, so one device per core keeps every core busy. Ignored on GPUs/TPUs.")
  flags.DEFINE_float("temperature", None, "With --search=sample: divide log-probabilities by this.")
  flags.DEFINE_integer("top_k", None, "With --search=sample: only from the K most probable tokens.")
  flags.DEFINE_float("top_p", None, "With --search=sample: only from the most probable tokens "
                     "whose probabilities sum to P (nucleus sampling).")
  flags.DEFINE_integer("seed", None, "With --search=sample: the random seed (default 0); a "
                       "sentence's sample does not depend on its batch.")
  if deprecated_sample_flag:
    flags.DEFINE_bool("sample", False, "Deprecated: use --search=sample.")


def deprecated(old: str, new: str) -> None:
  """The line a renamed flag or program prints when its old name is used; the old name still works."""
  print(f"warning: {old} is deprecated and will be removed; use {new}", file=sys.stderr)


def search_overrides() -> dict:
  """The search flags that were given, as SearchSettings fields (None where not given)."""
  f = flags.FLAGS
  names = ["search", "beam_size", "alpha", "max_extra_len", "min_len", "nbest", "temperature",
           "top_k", "top_p", "seed", "tokens_per_batch", "matmul_dtype", "mbr", "mbr_temperature"]
  overrides = {name: f[name].value for name in names if name in f}
  if "sample" in f and f.sample:
    deprecated("--sample", "--search=sample")
    overrides["search"] = "sample"
  given = [f"--{n}" for n in ("temperature", "top_k", "top_p", "seed") if overrides.get(n) is not None]
  if given and overrides["search"] != "sample":
    from transformer.config import ConfigError
    verb = "applies" if len(given) == 1 else "apply"
    raise ConfigError(f"{', '.join(given)} {verb} only with --search=sample; add it or drop "
                      f"{'it' if len(given) == 1 else 'them'}")
  return overrides


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
  if compilation_cache:
    flags.DEFINE_string("compilation_cache", default_cache_dir(), "Directory of JAX's persistent "
                        "compilation cache (compiled programs reused by later runs; "
                        "$JAX_COMPILATION_CACHE_DIR if set); '' turns it off.")

  def main_with_logging(argv: list[str]) -> None:
    setup_logging()
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
    except KeyboardInterrupt:  # (training stops cleanly at the first Ctrl-C; this is the second)
      print(f"{program}: interrupted", file=sys.stderr)
      sys.exit(130)  # the shell's status for SIGINT
  show_flags_in_help(main.__module__)
  app.run(main_with_logging, flags_parser=flags_parser(program))


def default_cache_dir() -> str:
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  return str(user_cache_dir("jax"))


def use_compilation_cache(directory: str) -> None:
  """JAX's persistent compilation cache in `directory` ('' = off). Every program compiled for over
  a second is kept: transformer-eval's decode compiles as long as it runs on a CPU."""
  import jax
  if not directory:
    jax.config.update("jax_enable_compilation_cache", False)
    return
  jax.config.update("jax_compilation_cache_dir", directory)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def show_flags_in_help(module: str) -> None:
  """--help lists the flags and docstring of the main script only; a console script
  (transformer-eval) is not the module that defines them, so it gets the program module's docstring,
  and the program's flags and the shared ones (defined here) become its key flags."""
  main_module = sys.modules["__main__"]
  if not main_module.__doc__:
    main_module.__doc__ = sys.modules[module].__doc__
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
  from transformer.checkpoints import quiet_background_failures
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
