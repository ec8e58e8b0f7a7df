"""Pairs -> fixed-shape batches, as array work over length arrays: length buckets or packed rows.

Pure functions of their inputs; `loader.py` decides which pairs go through them and when.

* Buckets (the paper's): pairs whose longer side pads to the same length share a batch of about
  `tokens_per_batch` tokens per side (rows = tokens_per_batch // length). A handful of shapes, so the
  jit-compiled step compiles once per bucket.
* Packing: several pairs share a row of `pack_length` tokens. Each pair gets a segment id (1, 2, ...;
  0 is padding) and positions that restart at 0, so the model keeps attention inside a pair and
  shifts the decoder input per pair. One shape for every batch; almost no padding. Which lengths
  share a row is decided once per corpus from the histogram of pair lengths (`pack_templates`:
  best-fit decreasing over at most `pack_length` distinct lengths, not over the pairs one by one);
  each epoch then only deals its shuffled pairs into those slots.

`assemble` writes any set of rows into a batch with a few gathers and scatters: no Python loop over
sentences, so a 25k-token batch takes well under a millisecond of numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transformer.tokens import PAD_ID

BATCHING_MODES = ("bucket", "pack")  # config.data.batching


def bucket_boundaries(max_len: int) -> list[int]:
  """Padded lengths: steps of 4 up to 64, of 8 up to 128, of 16 up to 256, then of 32.

  Finer steps waste less compute on padding but compile more shapes: on Multi30k, steps of 4 keep
  87% of target positions real (steps of 8: 79%) with 13 shapes.
  """
  bounds, length = [], 4
  while length < max_len:
    bounds.append(length)
    length += 4 if length < 64 else 8 if length < 128 else 16 if length < 256 else 32
  return bounds + [max_len]


def rows_per_batch(tokens_per_batch: int, length: int, row_multiple: int) -> int:
  """Rows of `length` tokens in a batch of about `tokens_per_batch`, a multiple of `row_multiple`."""
  return max(row_multiple, tokens_per_batch // length // row_multiple * row_multiple)


def stable_partition(order: np.ndarray, keys: np.ndarray, num_keys: int, block: int = 1 << 20
                     ) -> np.ndarray:
  """`order` stably sorted by `keys[order]` (small non-negative integers below `num_keys`): what
  `order[np.argsort(keys[order], kind="stable")]` gives, a block of `block` entries at a time, so
  nothing of the corpus's length is made but the result (no int64 array of 40M indices: 326 MB).
  `order` must be a permutation of the indices of `keys`."""
  counts = np.bincount(keys, minlength=num_keys)
  cursor = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # where each key goes
  out = np.empty_like(order)
  for start in range(0, len(order), block):
    part = order[start:start + block]
    part_keys = keys[part]
    by_key = np.argsort(part_keys, kind="stable")
    sorted_keys = part_keys[by_key]
    part_counts = np.bincount(part_keys, minlength=num_keys)
    run_start = np.concatenate([[0], np.cumsum(part_counts)[:-1]])
    out[cursor[sorted_keys] + np.arange(len(part)) - run_start[sorted_keys]] = part[by_key]
    cursor += part_counts
  return out


def pack_templates(costs: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows for pairs of these costs (a pair's longer side, in tokens; each <= `length`), decided on
  the histogram of costs: best-fit decreasing, every pair of a cost placed in the rows with the
  least room that still takes it, as many per row as fit, new rows opened only when none does.

  Returns (slot_cost, row_start): the cost of every slot, rows one after another (each row's slots
  by decreasing cost), and where each row starts; len(slot_cost) == len(costs). Rows with the same
  room are interchangeable, so the state is a list of (template, count) groups per room: the loop
  runs over costs and rooms, never over pairs.
  """
  counts = np.bincount(np.asarray(costs, np.int64), minlength=length + 1)
  if len(counts) > length + 1 and counts[length + 1:].any():
    raise ValueError(f"a pair is longer than the pack length {length}")
  groups: list[list[list]] = [[] for _ in range(length + 1)]  # room -> [[template, count], ...]
  for cost in range(length, 0, -1):
    n = int(counts[cost])
    for room in range(cost, length + 1):  # best fit: the least room first
      while n and groups[room]:
        template, count = groups[room].pop()
        per_row = room // cost
        full = min(count, n // per_row)
        if full:
          groups[room - per_row * cost].append([template + (cost,) * per_row, full])
          n, count = n - full * per_row, count - full
        if count and n:  # fewer left than one more row takes: they share one row
          groups[room - n * cost].append([template + (cost,) * n, 1])
          n, count = 0, count - 1
        if count:
          groups[room].append([template, count])
          break
      if not n:
        break
    if n:
      per_row = length // cost
      full, rest = divmod(n, per_row)
      if full:
        groups[length - per_row * cost].append([(cost,) * per_row, full])
      if rest:
        groups[length - rest * cost].append([(cost,) * rest, 1])
  templates = [(template, count) for room in groups for template, count in room]
  slot_cost = np.concatenate([np.tile(np.asarray(t, np.int32), c) for t, c in templates]
                             ) if templates else np.zeros(0, np.int32)
  row_sizes = np.concatenate([np.full(c, len(t), np.int64) for t, c in templates]
                             ) if templates else np.zeros(0, np.int64)
  row_start = np.zeros(len(row_sizes) + 1, np.int64)
  np.cumsum(row_sizes, out=row_start[1:])
  return slot_cost, row_start


def pad_rows(rows: list[np.ndarray], length: int, num_rows: int) -> np.ndarray:
  """[num_rows, length] int32, right-padded with PAD_ID (missing rows are all padding): decoding's
  batches, a few hundred sentences at a time."""
  out = np.full((num_rows, length), PAD_ID, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def ragged_arange(lengths: np.ndarray) -> np.ndarray:
  """0..n-1 for each n in `lengths`, concatenated."""
  ends = np.cumsum(lengths)
  return np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths, lengths)


def assemble(sides: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], row_of: np.ndarray,
             num_rows: int, length: int, packed: bool) -> dict[str, np.ndarray]:
  """A batch of `num_rows` rows of `length` tokens from pairs given, per side, as (tokens, starts,
  lengths): pair j's ids are tokens[starts[j]:starts[j] + lengths[j]]. `row_of[j]` is pair j's row
  (non-decreasing: a row's pairs are consecutive, laid out in that order).

  Unpacked: {'src', 'tgt'}, one pair per row. Packed: also '<side>_segments' (1, 2, ... per pair in
  its row, 0 for padding) and '<side>_positions' (restarting at 0 for each pair).
  """
  row_of = np.asarray(row_of, np.int64)
  first = np.searchsorted(row_of, row_of, side="left")  # each pair's row's first pair
  batch = {}
  for name, (tokens, starts, lengths) in zip(("src", "tgt"), sides):
    lengths = np.asarray(lengths, np.int64)
    ends = np.cumsum(lengths)
    before = ends - lengths
    offset = before - before[first]  # where the pair starts inside its row
    within = ragged_arange(lengths)
    rows = np.repeat(row_of, lengths)
    cols = np.repeat(offset, lengths) + within
    out = np.full((num_rows, length), PAD_ID, np.int32)
    out[rows, cols] = tokens[np.repeat(np.asarray(starts, np.int64), lengths) + within]
    batch[name] = out
    if packed:
      segments = np.zeros((num_rows, length), np.int32)
      segments[rows, cols] = np.repeat(np.arange(len(row_of)) - first + 1, lengths)
      positions = np.zeros((num_rows, length), np.int32)
      positions[rows, cols] = within
      batch[f"{name}_segments"], batch[f"{name}_positions"] = segments, positions
  return batch


def pairs_batch(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], rows: Sequence[Sequence[int]],
                length: int, num_rows: int, packed: bool) -> dict[str, np.ndarray]:
  """`assemble` for pairs held as arrays: rows[r] lists the pairs (indices into src/tgt) of row r."""
  members = [i for row in rows for i in row]
  row_of = np.repeat(np.arange(len(rows)), [len(row) for row in rows])
  sides = []
  for seqs in (src, tgt):
    chosen = [np.asarray(seqs[i]) for i in members]
    lengths = np.array([len(s) for s in chosen], np.int64)
    tokens = np.concatenate(chosen) if chosen else np.zeros(0, np.int32)
    sides.append((tokens, np.cumsum(lengths) - lengths, lengths))
  return assemble(sides, row_of, num_rows, length, packed)
