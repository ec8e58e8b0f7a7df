"""A grid's runs in TensorBoard's HParams dashboard, to browse and sort a study without its table.

`tensorboard --logdir ROOT` then lists every run (ROOT/<variant>/seed<k>) as a session: its
hyper-parameters are its variant and the config keys the grid's variants change (with each run's
own value, the base's where its variant leaves the key alone); its metrics are the table's
final numbers (dev perplexity, BLEU of every test set, raw and moving average). The seeds of one
variant form one session group, which the dashboard can average. The experiment (which
hyper-parameters and metrics exist) is written once in ROOT itself.

Written with tensorboardX's copies of TensorBoard's protocol buffers (no TensorFlow), each into an
event file of its own (`*.hparams`) that the next collection replaces, so the training's event
files beside it are untouched and no session is listed twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer import metrics

metrics.import_tensorboardx()  # first: then tensorboardX's modules below leave torch alone
from tensorboardX import SummaryWriter  # noqa: E402
from tensorboardX.proto import api_pb2, plugin_hparams_pb2  # noqa: E402
from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata  # noqa: E402

SUFFIX = ".hparams"  # the event files this module writes (and replaces)
METRIC_GROUP = "final"  # metric tags: final/<row key>, apart from the training's train/ and eval/


def hyperparameters(grid: Any, run: Any) -> dict[str, Any]:
  """A run's variant and its values of every key the grid's variants change (the seed is not one:
  the seeds of a variant are the sessions of its group)."""
  keys = sorted({key for variant in grid.variants for key in variant.overrides})
  values: dict[str, Any] = {"variant": run.variant.name}
  for key in keys:
    node = run.config
    for part in key.split("."):
      node = node[part]
    values[key] = node
  return values


def metric_keys(rows: Sequence[dict[str, Any]], test_sets: Sequence[str]) -> list[str]:
  """The row keys shown as metrics: dev perplexity and each set's BLEU where some run has it."""
  keys = ["dev_ppl"] + [f"{name}_{kind}" for name in ["dev", *test_sets]
                        for kind in ("bleu", "ema_bleu")]
  return [k for k in keys if any(r.get(k) is not None for r in rows)]


def _summary(tag: str, data: plugin_hparams_pb2.HParamsPluginData) -> Summary:
  metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
      plugin_name="hparams", content=data.SerializeToString()))
  return Summary(value=[Summary.Value(tag=tag, metadata=metadata)])


def _value(field: Any, value: Any) -> None:
  if isinstance(value, bool):
    field.bool_value = value
  elif isinstance(value, (int, float)):
    field.number_value = float(value)
  else:
    field.string_value = str(value)


def _replace_events(folder: Path) -> SummaryWriter:
  """A writer of a fresh `*.hparams` event file in `folder`, the previous ones removed."""
  for old in folder.glob(f"events.out.tfevents.*{SUFFIX}"):
    old.unlink()
  return SummaryWriter(str(folder), filename_suffix=SUFFIX)


def write(rows: Sequence[dict[str, Any]], runs: Sequence[Any], grid: Any, root: Path,
          test_sets: Sequence[str]) -> list[Path]:
  """The experiment in `root` and a session per run that has results (results.collect's `rows`,
  in the order of `runs`); returns the event files written."""
  metrics = metric_keys(rows, test_sets)
  started = [(row, run) for row, run in zip(rows, runs) if run.workdir.is_dir()]
  if not started:
    return []
  experiment = api_pb2.Experiment(time_created_secs=time.time())
  values = [hyperparameters(grid, run) for _, run in started]
  for name, value in values[0].items():
    kind = ("DATA_TYPE_BOOL" if isinstance(value, bool) else
            "DATA_TYPE_FLOAT64" if isinstance(value, (int, float)) else "DATA_TYPE_STRING")
    info = experiment.hparam_infos.add(name=name, type=api_pb2.DataType.Value(kind))
    for seen in dict.fromkeys(v[name] for v in values):  # the dashboard's filter: every value
      _value(info.domain_discrete.values.add(), seen)
  for key in metrics:
    experiment.metric_infos.add(name=api_pb2.MetricName(tag=f"{METRIC_GROUP}/{key}"),
                                display_name=key)
  root.mkdir(parents=True, exist_ok=True)
  written = []
  with _replace_events(root) as writer:
    writer.file_writer.add_summary(_summary(
        "_hparams_/experiment", plugin_hparams_pb2.HParamsPluginData(experiment=experiment)))
  written += root.glob(f"*{SUFFIX}")
  for row, run in started:
    start = plugin_hparams_pb2.SessionStartInfo(group_name=run.variant.name)
    for name, value in hyperparameters(grid, run).items():
      _value(start.hparams[name], value)
    status = "STATUS_SUCCESS" if row["finished"] else "STATUS_RUNNING"
    end = plugin_hparams_pb2.SessionEndInfo(status=api_pb2.Status.Value(status))
    with _replace_events(run.workdir) as writer:
      writer.file_writer.add_summary(_summary(
          "_hparams_/session_start_info",
          plugin_hparams_pb2.HParamsPluginData(session_start_info=start)))
      writer.file_writer.add_summary(_summary(
          "_hparams_/session_end_info", plugin_hparams_pb2.HParamsPluginData(session_end_info=end)))
      for key in metrics:
        if row.get(key) is not None:
          writer.add_scalar(f"{METRIC_GROUP}/{key}", float(row[key]), row["steps_done"])
    written += run.workdir.glob(f"*{SUFFIX}")
  return written
