"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and progress lines to the log.

Only process 0 writes, so a multi-host job keeps one record. Every record has `event` ('train',
'eval', 'bleu', ...), `step` and a wall-clock `time`; readers (plots, experiment tables) filter on these.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jax

METRICS_FILE = "metrics.jsonl"


class MetricWriter:
  def __init__(self, workdir: str | os.PathLike):
    self.path = Path(workdir) / METRICS_FILE
    self.enabled = jax.process_index() == 0

  def write(self, event: str, step: int, **values: Any) -> None:
    if not self.enabled:
      return
    record = {"event": event, "step": int(step), "time": round(time.time(), 3)}
    record.update({k: _plain(v) for k, v in values.items()})
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")


def read_metrics(workdir: str | os.PathLike, event: str | None = None) -> list[dict[str, Any]]:
  path = Path(workdir) / METRICS_FILE
  if not path.is_file():
    return []
  records = []
  for line in path.read_text().splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue  # the half-written last line of a run that was killed
  return [r for r in records if event is None or r["event"] == event]


def _plain(value: Any) -> Any:
  """A JSON-friendly Python number from a numpy/JAX scalar."""
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float):
    return round(value, 6)
  return value


def format_duration(seconds: float) -> str:
  seconds = int(seconds)
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"

