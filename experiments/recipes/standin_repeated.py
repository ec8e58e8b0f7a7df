"""A stand-in of En-Fr's size (40.8M pairs) made from the 4.5M-pair one, for start-up measurements.

    python -m experiments.recipes.standin_repeated --small=data/standin_ende --out=data/standin_40.8m

Tokenizing 40.8M pairs takes ~50 minutes on 2 cores, but what a start with a built cache costs
depends only on the cache's size: so the text here is the 4.5M-pair corpus written nine times and
then its first 300,000 pairs once more (40.8M lines a side, real files a start may stat and check),
and its training token cache is the 4.5M cache's ids in the same repetition, under the fingerprint
the repeated text gives. The ids are those a build would write: SentencePiece encodes each line on
its own, so a repeated line gets the same ids. The vocabulary is the 4.5M corpus's, entered in the
vocabulary cache under the repeated corpus's name (a sample of the repeated text is a sample of the
same sentences). Run with the XDG_CACHE_HOME the 4.5M stand-in was prepared with.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from configs.standin_ende import get_config
from transformer.data import pipeline
from transformer.data import token_cache as cache_lib
from transformer.data import vocab as vocab_lib

REPEATS, HEAD = 9, 300_000


def repeat_text(small: Path, out: Path, pairs: int) -> None:
  for lang in ("en", "de"):
    with open(small / f"train.{lang}", "rb") as f:
      head = b"".join(line for _, line in zip(range(HEAD), f))
    with open(out / f"train.{lang}", "wb") as f:
      for _ in range(REPEATS):
        with open(small / f"train.{lang}", "rb") as part:
          shutil.copyfileobj(part, f, 1 << 24)
      f.write(head)
    shutil.copy(small / f"valid.{lang}", out / f"valid.{lang}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--small", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  small, out = Path(args.small), Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  t = time.time()
  cfg_small, cfg = get_config(f"base,{small}"), get_config(f"base,{out}")
  data_small, data = cfg_small.data, cfg.data
  n_small = cache_lib.recorded_pairs(data_small, data_small.train_split)
  assert n_small, "prepare the small stand-in first (python -m transformer.training.prepare ...)"
  pairs = REPEATS * n_small + HEAD
  repeat_text(small, out, pairs)
  print(f"text: {pairs:,} pairs in {time.time() - t:.0f}s")
  cache_lib.record_pairs(data, data.train_split, pairs)
  vocab_small = vocab_lib.cached_vocab_path(data_small, cfg_small.seed, n_small)
  vocab = vocab_lib.cached_vocab_path(data, cfg.seed, pairs)
  shutil.copy(vocab_small, vocab)
  filters = pipeline.split_filters(data, data.train_split)
  source = cache_lib.open_or_build(data_small, data_small.train_split, vocab_small, filters, None,
                                   build_missing=False)
  head = int(np.searchsorted(source.index, HEAD))  # kept pairs among the first HEAD
  dropped_head = {r: 0 for r in cache_lib.DROP_REASONS}
  dropped_head["empty"] = HEAD - head  # (the head's drops, counted under one reason)
  with cache_lib.CacheWriter(cache_lib.cache_dir(data, data.train_split, vocab.read_bytes(), filters),
                             source.tokens[0].dtype) as writer:
    for k in range(REPEATS + 1):
      stop = len(source) if k < REPEATS else head
      ends = source.offsets[stop]
      writer.add([source.tokens[0][:ends[0]], source.tokens[1][:ends[1]]],
                 [source.lengths[:stop, 0], source.lengths[:stop, 1]],
                 source.index[:stop] + k * n_small,
                 source.meta["dropped"] if k < REPEATS else dropped_head)
    cache = writer.finish(fingerprint=cache_lib.expected_fingerprint(
                              data, data.train_split, vocab.read_bytes(), filters),
                          corpus=f"{data.train_src} -> {data.train_tgt}", read=pairs,
                          vocab_size=source.meta["vocab_size"], filters=source.meta["filters"],
                          seconds=0, workers=0, repeated_from=str(source.directory))
  pipeline.split_cache(data, data.eval_split, vocab)  # the validation cache: 3,000 pairs
  print(f"cache: {len(cache):,} pairs in {cache.directory}, {time.time() - t:.0f}s in all")


if __name__ == "__main__":
  main()
