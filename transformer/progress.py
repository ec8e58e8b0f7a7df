"""Live progress of long loops (training steps, sentences translated): step / total, tokens/s, loss,
elapsed and ETA.

On a terminal it is a tqdm bar that redraws in place, with the program's log lines printed above it;
in a log file (stderr not a terminal: a batch job, `2> train.log`, the experiment runner) it is a
plain line every `line_seconds`, because a redrawn bar would fill the file with carriage returns.
`--progress=bar|lines|off` overrides the choice (`configure`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import IO, Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from transformer.metrics import format_duration

MODES = ("auto", "bar", "lines", "off")
_default_mode = "auto"
log = logging.getLogger("transformer")


def configure(mode: str) -> None:
  """Sets the mode of every later `Progress(mode=None)`: a program's --progress flag."""
  global _default_mode
  if mode not in MODES:
    raise ValueError(f"progress mode must be one of {', '.join(MODES)}; got {mode!r}")
  _default_mode = mode


def resolve_mode(mode: str | None, stream: IO[str]) -> str:
  """'bar' on a terminal and 'lines' elsewhere, unless the mode is given."""
  mode = mode or _default_mode
  if mode != "auto":
    return mode
  return "bar" if getattr(stream, "isatty", lambda: False)() else "lines"


def _terminal_width(stream: IO[str]) -> int:
  try:
    return os.get_terminal_size(stream.fileno()).columns
  except (AttributeError, OSError, ValueError):  # not a file, or not a terminal
    return 0


class Progress:
  """`update(n, tokens=..., loss=...)` after each unit of work; use as a context manager.

  `line_seconds=None` makes the lines mode silent, for loops that log their own periodic lines
  (training logs one every train.log_every steps).
  """

  def __init__(self, description: str, total: int, unit: str, initial: int = 0,
               mode: str | None = None, line_seconds: float | None = 30.0,
               stream: IO[str] | None = None):
    self.description, self.total, self.unit, self.initial = description, total, unit, initial
    self.stream = stream or sys.stderr
    self.mode = resolve_mode(mode, self.stream)
    self.line_seconds = line_seconds
    self.count, self.tokens, self.fields = initial, 0.0, {}
    self.start = self.last_line = time.time()
    self.count_at_last_line = initial
    self._bar, self._redirect = None, None
    if self.mode == "bar":
      # Some ptys (CI runners, `script`) report a 0 x 0 terminal, where tqdm would draw nothing.
      sized = _terminal_width(self.stream) > 0
      self._bar = tqdm(total=total, initial=initial, unit=unit, desc=description, file=self.stream,
                       dynamic_ncols=sized, ncols=None if sized else 100,
                       nrows=None if sized else 20, smoothing=0.1, bar_format=(
                           "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
                           "[elapsed {elapsed}, ETA {remaining}{postfix}]"))
      self._redirect = logging_redirect_tqdm(loggers=[log])
      self._redirect.__enter__()  # log lines go above the bar instead of through it

  def update(self, n: int = 1, tokens: float = 0.0, **fields: Any) -> None:
    """`n` more units done, `tokens` processed in them; `fields` (e.g. loss) shown from now on."""
    self.count += n
    self.tokens += tokens
    self.fields.update(fields)
    if self._bar is not None:
      self._bar.set_postfix_str(self._postfix(), refresh=False)
      self._bar.update(n)
    elif (self.mode == "lines" and self.line_seconds is not None
          and time.time() - self.last_line >= self.line_seconds):
      self._line()

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._redirect.__exit__(None, None, None)
      self._bar = None
    elif (self.mode == "lines" and self.line_seconds is not None
          and self.count > self.count_at_last_line):
      self._line()  # the final count, unless the last line already showed it

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _postfix(self) -> str:
    """tok/s at the bar's recent rate (tqdm smooths it, so compilation fades out), then fields."""
    parts = []
    rate, done = self._bar.format_dict["rate"], self.count - self.initial
    if self.tokens and rate and done:
      parts.append(f"{self.tokens / done * rate:,.0f} tok/s")
    parts += [f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.fields.items()]
    return ", ".join(parts)  # tqdm puts ', ' before it

  def _line(self) -> None:
    elapsed = time.time() - self.start
    done = self.count - self.initial
    eta = format_duration(elapsed / done * (self.total - self.count)) if done else "?"
    parts = [f"{self.description}: {self.count}/{self.total} {self.unit}",
             f"{done / max(elapsed, 1e-9):.1f} {self.unit}/s"]
    if self.tokens:
      parts.append(f"{self.tokens / max(elapsed, 1e-9):,.0f} tok/s")
    parts += [f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.fields.items()]
    parts += [f"elapsed {format_duration(elapsed)}", f"ETA {eta}"]
    log.info(" | ".join(parts))
    self.last_line, self.count_at_last_line = time.time(), self.count
