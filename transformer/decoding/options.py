"""Search options, each declared once: its default, its check, its help and its short name in report
tags. From these follow the programs' flags (`define_flags`), `translator.SearchSettings`' fields and
checks, the report tags and the run config's `decode` section (options with `in_config`).

A search declares its own options as `OPTIONS` on its class (sampling.py: temperature, top_k,
...); the options every search has are `COMMON` below. A new search with options is its own file
plus its line in the registry (decoding/__init__.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from absl import flags

from transformer.decoding import mbr
from transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Option:
  name: str  # the flag (--name), the settings' field and, with in_config, config.decode.<name>
  default: Any  # also fixes the flag's type: int, float or str
  help: str
  valid: Callable[[Any], bool] = lambda value: True
  need: str = ""  # what `valid` asks for, as the error says it: "--top_k must be {need}, got 3"
  tag: str | None = None  # its prefix in report tags (e.g. "k" -> "_k40"); None = the name
  in_config: bool = False  # the run config has decode.<name> (its default: this default)
  choices: tuple[str, ...] = ()  # the allowed values of a string option (the config's error lists them)
  about: str = ""  # what the flag's name does not say, for its error: "--alpha (the length-penalty exponent)"

  def check(self, value: Any) -> None:
    if not self.valid(value):
      shown = f"{value:g}" if isinstance(value, float) else repr(value)
      about = f" ({self.about})" if self.about else ""
      raise ConfigError(f"--{self.name}{about} must be {self.need}, got {shown}")

  def tagged(self, value: Any) -> str:
    prefix = self.name if self.tag is None else self.tag
    return f"{prefix}{value:g}" if isinstance(value, (int, float)) else f"{prefix}{value}"


# decode.matmul_dtype: bfloat16 = every weight matrix rounded to bf16 while searching,
# bfloat16_vocab = the projection onto the vocabulary only.
DECODE_MATMUL_DTYPES = ("float32", "bfloat16", "bfloat16_vocab")

COMMON = (
    Option("max_extra_len", 50, "Output length limit = input length + this.",
           lambda v: v >= 0, ">= 0", tag="extra", in_config=True),
    Option("min_len", 0, "At least this many tokens before end-of-sentence (0: the paper's search "
           "may output nothing; 1 forbids the empty translation, as fairseq does).",
           lambda v: v >= 0, ">= 0 (0 = an empty translation is allowed)", in_config=True),
    Option("nbest", 1, "Also write the N best hypotheses of every sentence, with their scores, as "
           "JSON lines (N <= beam size).", lambda v: v >= 1, ">= 1"),
    Option("tokens_per_batch", 1024, "Source tokens per decoding batch: how many sentences are "
           "decoded at a time (1024 suits a CPU; runs trained before it was the default store 4096).",
           lambda v: v >= 1, ">= 1", in_config=True),
    Option("matmul_dtype", "float32", "float32, bfloat16 or bfloat16_vocab: the search's weight "
           "matrices. bfloat16 is quantised decoding: faster on CPUs with AVX512-BF16 and on GPUs; "
           "sums and activations stay float32; bfloat16_vocab rounds the projection onto the "
           "vocabulary only (docs/evaluating.md gives the BLEU change of each).",
           lambda v: v in DECODE_MATMUL_DTYPES, f"one of {', '.join(DECODE_MATMUL_DTYPES)}",
           tag="", in_config=True, choices=DECODE_MATMUL_DTYPES),
    Option("mbr", "", "Minimum Bayes risk decoding: 'chrf' or 'bleu' chooses, among the beam's "
           "hypotheses, the one with the highest expected sentence chrF (BLEU) against the others, "
           "weighted by their scores; '' = the best-scored. A larger beam gives it more candidates.",
           lambda v: v == "" or v in mbr.UTILITIES, f"one of {', '.join(mbr.UTILITIES)} (or empty: off)",
           in_config=True, choices=("", *mbr.UTILITIES)),
    Option("mbr_temperature", 0.75, "With --mbr: the softmax temperature over the hypotheses' "
           "scores that weights them.", lambda v: v > 0, "> 0", tag="mbrt", in_config=True),
)


def all_options(searches: dict[str, type]) -> dict[str, tuple[Option, str | None]]:
  """{name: (option, the search that declares it or None for COMMON)}, in declaration order."""
  found: dict[str, tuple[Option, str | None]] = {o.name: (o, None) for o in COMMON}
  for name, search in searches.items():
    for option in search.OPTIONS:
      if option.name in found and found[option.name][0] != option:
        raise ValueError(f"search option --{option.name} is declared twice, differently")
      found.setdefault(option.name, (option, name))
  return found


def define_flags(searches: dict[str, type]) -> None:
  """One flag per option; a flag not given is None, so the run config's value applies."""
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string}
  for name, (option, search) in all_options(searches).items():
    where = (f" (--search={search} only)" if search not in (None, "beam") else "")
    default = f" (default: config.decode.{name})" if option.in_config else f" (default: {option.default!r})"
    define[type(option.default)](name, None, option.help + where + default)


def given(searches: dict[str, type], chosen: str | None) -> dict[str, Any]:
  """The option flags that were given ({name: value}), checked against the chosen search: an option
  of another search (beam search's apart: a beam of one is greedy search) is an error that says
  which search it belongs to."""
  f = flags.FLAGS
  declared = all_options(searches)
  values = {name: f[name].value for name in declared if name in f and f[name].value is not None}
  for owner in dict.fromkeys(o for _, o in declared.values() if o not in (None, "beam", chosen)):
    named = [f"--{n}" for n in values if declared[n][1] == owner]
    if named:
      verb, them = ("applies", "it") if len(named) == 1 else ("apply", "them")
      raise ConfigError(f"{', '.join(named)} {verb} only with --search={owner}; add it or drop {them}")
  return values
