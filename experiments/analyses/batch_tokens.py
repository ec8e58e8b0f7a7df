"""How many real tokens an update carries: our length-bucketed batches against fairseq's `--max-tokens`.

    python -m experiments.analyses.batch_tokens --config=configs/multi30k_tiny.py \
        --token_cache=~/.cache/transformer/tokens/<the training cache the trainer's log names> \
        --max_tokens=4096 --gpus=2 [--record=experiments/results/batch_tokens]

The same sentences and subword lengths (the config's token cache) batched two ways. Ours
(`loader.Planner`): rows padded to length buckets, ~`data.tokens_per_batch` positions a side a
batch, one batch an update. fairseq's (`batch_by_size`, as the fork that the literature's
Transformer-Tiny trained with has it): pairs sorted by source then target length, a sentence counted
at its longer side (end token included), a batch closed when one more sentence at the batch's
longest would pass `--max-tokens`, its size cut to a multiple of 8 where it is larger, one batch
on each GPU an update. Prints, for each: batches and updates an epoch, real target tokens an
update, the share of positions that are real, and the epochs 8,000 updates make.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from transformer.cli import run_program
from transformer.data.cache_format import TokenCache
from transformer.data.loader import BatchSpec, Planner
from transformer.sweeps import records

FLAGS = flags.FLAGS


def fairseq_batches(lengths: np.ndarray, max_tokens: int, multiple: int) -> list[np.ndarray]:
  """fairseq's batch_by_size over pairs sorted by (source, target) length: each batch's indices."""
  order = np.lexsort((lengths[:, 1], lengths[:, 0]))  # by source, then target
  cost = np.maximum(lengths[:, 0], lengths[:, 1])
  batches, batch, longest = [], [], 0
  for i in order:
    longest_with = max(longest, int(cost[i]))
    if batch and (len(batch) + 1) * longest_with > max_tokens:
      keep = max(multiple * (len(batch) // multiple), len(batch) % multiple)
      batches.append(np.array(batch[:keep]))
      batch = batch[keep:]
      longest = int(cost[batch].max()) if batch else 0
      longest_with = max(longest, int(cost[i]))
    batch.append(i)
    longest = longest_with
  if batch:
    batches.append(np.array(batch))
  return batches


def compare(lengths: np.ndarray, spec: BatchSpec, max_tokens: int, gpus: int, multiple: int,
            updates: int) -> list[dict[str, float]]:
  """The two batchings' figures (see the module docstring)."""
  target = float(lengths[:, 1].sum())
  planner = Planner(lengths, spec, seed=0, shuffle=False)
  ours_share = planner.real_share(lengths)[1]
  theirs = fairseq_batches(lengths, max_tokens, multiple)
  positions = sum(len(b) * int(lengths[b, 1].max()) for b in theirs)  # target side, padded
  rows = []
  for name, batches, per_update, share in (
      ("ours (length buckets)", planner.num_batches, 1, ours_share),
      (f"fairseq (--max-tokens {max_tokens} x {gpus} GPUs)", len(theirs), gpus, target / positions)):
    updates_an_epoch = batches / per_update
    rows.append({"batching": name, "batches an epoch": batches,
                 "updates an epoch": updates_an_epoch,
                 "real target tokens an update": target / updates_an_epoch,
                 "real share of target positions": share,
                 f"epochs in {updates:,} updates": updates / updates_an_epoch})
  return rows


def markdown(rows: list[dict[str, float]]) -> str:
  keys = list(rows[0])
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  for row in rows:
    cells = [row[k] if isinstance(row[k], str) else f"{row[k]:,.3f}" if row[k] < 1 else
             f"{row[k]:,.1f}" for k in keys]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  started = time.time()
  if FLAGS.config is None or FLAGS.token_cache is None:
    raise app.UsageError("pass --config=CONFIG and --token_cache=DIR (the training split's cache)")
  cfg = FLAGS.config
  cache = TokenCache(Path(FLAGS.token_cache).expanduser())
  rows = compare(np.asarray(cache.lengths, np.int64), BatchSpec.for_training(cfg, 1),
                 FLAGS.max_tokens, FLAGS.gpus, FLAGS.multiple, FLAGS.updates)
  table = markdown(rows)
  print(table)
  if FLAGS.record:
    records.record_table(table, FLAGS.record, "Real tokens an update: length buckets against "
                         "fairseq's --max-tokens", time.time() - started,
                         "experiments.analyses.batch_tokens")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  config_flags.DEFINE_config_file("config", None, "The run's config (its batching keys).")
  flags.DEFINE_string("token_cache", None, "The training split's token cache directory.")
  flags.DEFINE_integer("max_tokens", 4096, "fairseq's --max-tokens (per GPU).", lower_bound=1)
  flags.DEFINE_integer("gpus", 2, "GPUs an update in fairseq (one batch each).", lower_bound=1)
  flags.DEFINE_integer("multiple", 8, "fairseq's --required-batch-size-multiple.", lower_bound=1)
  flags.DEFINE_integer("updates", 8000, "Updates of the run, for the epochs they make.", lower_bound=1)
  records.define_record_flag()
  run_program("batch_tokens", main)


if __name__ == "__main__":
  run()
