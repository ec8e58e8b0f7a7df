"""Experiment grids: named variants of a base config, each a handful of config overrides.

A grid is what `transformer-experiment <grid>` trains, evaluates and tabulates. The built-in ones are
the paper's Table 3 (`table3`) and the positional-encoding ablation (`positional`); a grid of your own is
a Python file with a `get_grid()` that returns a `Grid` (see experiments/recipes/example_grid.py):

    from transformer.sweeps.grids import Grid, Variant

    def get_grid():
      return Grid("warmup", [Variant("w400", {"train.warmup_steps": 400}),
                             Variant("w1600", {"train.warmup_steps": 1600})])

Overrides use the config's dotted keys (the same as `--config.model.num_heads=1` on the command line)
and are applied on top of the base config given to the runner, so one grid serves Multi30k and WMT.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Variant:
  """One row of a results table: a name, the config keys it changes, and the paper's row label."""
  name: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  row: str = ""  # e.g. '(A)'; variants of one row are grouped in the table


@dataclasses.dataclass(frozen=True)
class Grid:
  """Variants compared against the first one, and extra test sets every run is evaluated on.

  `test_sets` name builders in transformer/sweeps/test_sets.py (e.g. 'long': sentences longer than any in
  training); the dev split of the base config is always evaluated. `by_length`: also tabulate and
  draw the dev set's BLEU by source length (transformer/sweeps/by_length.py). `average_last`: score
  the mean of each run's last this many checkpoints (transformer-eval --average_last), which every
  variant must keep (train.keep_checkpoints). `select_on`: the set a grid that chooses a recipe
  chooses on ('dev', or one of `test_sets`, which are made from the validation split); the
  held-out test sets (`--test_dir`) are scored for the final candidates, never chosen on.
  `keep_models`: a dtype ('float16' or 'float32') to keep each evaluated run's parameters (the
  mean that was scored) in its workdir's model/ folder and in the record, so that runs trained on
  different machines can be ensembled or decoded again later; '' keeps results only.
  """
  name: str
  variants: Sequence[Variant]
  test_sets: Sequence[str] = ()
  by_length: bool = False
  average_last: int = 1
  select_on: str = ""
  keep_models: str = ""

  def __post_init__(self):
    names = [v.name for v in self.variants]
    if not names:
      raise ConfigError(f"grid {self.name!r} has no variants")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
      raise ConfigError(f"grid {self.name!r} names variants more than once: {', '.join(duplicates)}")
    bad = [n for n in names if not n or "/" in n or n.startswith(".")]
    if bad:
      raise ConfigError(f"grid {self.name!r}: variant names must be plain folder names, got {bad}")
    if self.select_on and self.select_on not in ("dev", *self.test_sets):
      raise ConfigError(f"grid {self.name!r} chooses on {self.select_on!r}, which is not its "
                        "validation set: a recipe is chosen on the validation set only "
                        f"(select_on='dev'{''.join(f', {t!r}' for t in self.test_sets)}); the "
                        "held-out test sets are scored once for each final candidate")
    if self.keep_models and self.keep_models not in ("float16", "float32"):
      raise ConfigError(f"grid {self.name!r}: keep_models is the dtype to keep the runs' "
                        f"parameters in, 'float16' or 'float32' ('' for none), got "
                        f"{self.keep_models!r}")
    if not isinstance(self.average_last, int) or self.average_last < 1:
      raise ConfigError(f"grid {self.name!r}: average_last must be a positive number of "
                        f"checkpoints, got {self.average_last!r}")


def table3() -> Grid:
  """The paper's Table 3 rows (A)-(E) and 'big', as changes to the base config.

  (A) and (C) keep d_k = d_v = d_model / h (the config's 0 = derived), as the paper did; (B) sets d_k
  alone. On a scaled-down base (configs/multi30k.py: d_model 256, h 4) the same changes apply to it.
  """
  variants = [Variant("base")]
  variants += [Variant(f"A-h{h}", {"model.num_heads": h}, "(A)") for h in (1, 4, 16, 32)]
  variants += [Variant(f"B-dk{k}", {"model.d_k": k}, "(B)") for k in (16, 32)]
  variants += [Variant(f"C-N{n}", {"model.num_layers": n}, "(C)") for n in (2, 4, 8)]
  variants += [Variant(f"C-d{d}", {"model.d_model": d}, "(C)") for d in (256, 1024)]
  variants += [Variant(f"C-ff{f}", {"model.d_ff": f}, "(C)") for f in (1024, 4096)]
  variants += [Variant(f"D-drop{p}", {"model.dropout": p}, "(D)") for p in (0.0, 0.2)]
  variants += [Variant(f"D-ls{e}", {"train.label_smoothing": e}, "(D)") for e in (0.0, 0.2)]
  variants += [Variant("E-learned", {"model.positional": "learned"}, "(E)")]
  variants += [Variant("big", {"model.d_model": 1024, "model.d_ff": 4096, "model.num_heads": 16,
                               "model.dropout": 0.3}, "big")]
  return Grid("table3", variants)


def positional() -> Grid:
  """Every registered positional encoding against the paper's sinusoids (learned: Table 3 row E),
  each at its own defaults, also scored on over-long sentences and by source length."""
  from transformer.model import positions  # noqa: PLC0415  (the model is slow to import)
  variants = [Variant(kind, {"model.positional": kind}, "(E)" if kind == "learned" else "")
              for kind in positions.kinds()]
  return Grid("positional", variants, test_sets=("long",), by_length=True)


BUILT_IN = {"table3": table3, "positional": positional}


def load_grid(name_or_path: str) -> Grid:
  """A built-in grid by name, or the `get_grid()` of a Python file."""
  if name_or_path in BUILT_IN:
    return BUILT_IN[name_or_path]()
  path = Path(name_or_path)
  if path.suffix != ".py":
    raise ConfigError(f"unknown grid {name_or_path!r}: use one of {', '.join(BUILT_IN)} or a .py file "
                     "with a get_grid() function")
  if not path.is_file():
    raise ConfigError(f"grid file {path} not found")
  spec = importlib.util.spec_from_file_location(f"grid_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except ImportError as e:  # a console script puts neither the file's folder nor the cwd on the path
    raise ConfigError(f"grid file {path} cannot import {e.name or 'a module'} ({e}): a grid file is "
                      "loaded by its path, so it imports installed packages only (transformer and "
                      "its dependencies), not the files beside it; write what it needs into it") from None
  if not hasattr(module, "get_grid"):
    raise ConfigError(f"{path} has no get_grid() function returning an transformer.sweeps.grids.Grid")
  grid = module.get_grid()
  if not isinstance(grid, Grid):
    raise ConfigError(f"{path}: get_grid() returned {type(grid).__name__}, not an transformer.sweeps.grids.Grid")
  return grid
