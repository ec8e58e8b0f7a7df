"""Config keys that a pluggable part declares for itself (a positional encoding, a kind of corpus):
config.py adds every declared key with its default, validation checks it, and a resumed run keeps
the ones marked `fixed` (training/checkpoints.py), so a new part's keys live in its own file. Two
parts may declare the same key (the same `Key`, imported from the other's file) to share a setting;
`Key.variant` makes one of their own from another's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Key:
  """`config.<section>.<name>`: its default, what it is for, what a valid value is (`need`, for the
  error), and whether a resumed run must keep its value (`fixed`: it shapes the data or model)."""
  name: str
  default: Any
  help: str
  need: str = ""
  valid: Callable[[Any], bool] = lambda value: True
  fixed: bool = False

  def check(self, section: str, value: Any) -> None:
    if not self.valid(value):
      raise ConfigError(f"config.{section}.{self.name} must be {self.need}, got {value!r}")

  def variant(self, name: str, default: Any = None, help: str | None = None) -> Key:
    """A key of its own, `name`, checked as this one is: for a part that needs a setting like
    another's but apart from it (another default, or values the two must not share)."""
    return dataclasses.replace(self, name=name, default=self.default if default is None else default,
                               help=self.help if help is None else help)


def integer_key(name: str, default: int, help: str, least: int = 1) -> Key:
  return Key(name, default, help, f"an integer >= {least}",
             lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least)


def positive_number_key(name: str, default: float, help: str) -> Key:
  return Key(name, default, help, "a positive number",
             lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)
