"""transformer-benchmark --input_pipeline: the config's training loader on this host, from the
config's own token cache (vocabulary and cache built first if missing) or from one named with
--token_cache, which must fit the config. The measurement itself is data/input_benchmark.py's."""

from __future__ import annotations

import sys
from typing import Any

import jax
import ml_collections

from transformer.cli import config_path
from transformer.config import validate
from transformer.data import sources
from transformer.data import vocab as vocab_lib


def check_cache_fits(cache, data: ml_collections.ConfigDict, seed: int) -> None:
  """Raises DataError where a token cache named on the command line is not the config's: another
  vocabulary size or max_len, or (when the config's vocabulary is built) another fingerprint. A
  synthetic cache (random ids) has no corpus or vocabulary to compare beyond those."""
  from transformer.data import pipeline
  from transformer.data import token_cache as cache_lib
  meta = cache.meta
  built_for = (int(meta.get("vocab_size", -1)), int(meta.get("filters", {}).get("max_len", -1)))
  if built_for != (data.vocab_size, data.max_len):
    raise sources.DataError(
        f"the token cache {cache.directory} was built for a vocabulary of {built_for[0]} pieces "
        f"and max_len {built_for[1]}, the config has {data.vocab_size} and {data.max_len}: pass "
        "the config it was built for, or build the config's own (without --token_cache)")
  if meta.get("corpus") == "synthetic":
    return
  pairs = cache_lib.recorded_pairs(data, data.train_split)
  vocab_path = None if pairs is None else vocab_lib.cached_vocab_path(data, seed, pairs)
  if vocab_path is None or not vocab_path.is_file():
    return  # the config's vocabulary is not built here: nothing more to compare with
  expect = cache_lib.expected_fingerprint(data, data.train_split, vocab_path.read_bytes(),
                                          pipeline.split_filters(data, data.train_split))
  if cache.fingerprint != expect:
    raise sources.DataError(
        f"the token cache {cache.directory} was built from other data, another vocabulary or "
        f"other filters than the config's training split (fingerprint {cache.fingerprint}, "
        f"expected {expect}); pass the config it was built for, or leave out --token_cache")


def benchmark_input(cfg: ml_collections.ConfigDict, batches: int, workers: list[int],
                    stub_step_ms: list[float], stub_steps: int, token_cache: str | None = None,
                    busy: int = 0) -> dict[str, Any]:
  """What the config's training loader delivers on this host (input_benchmark.py): from the
  config's token cache (vocabulary and cache built first if missing), or from `token_cache`."""
  from transformer.data import input_benchmark, pipeline
  from transformer.data import token_cache as cache_lib
  from transformer.data.loader import BatchSpec
  validate(cfg)
  subword = None
  if token_cache:
    cache = cache_lib.TokenCache(token_cache, rebuild=(
        f"`{cache_lib.rebuild_command(config_path(sys.argv))}` (the config's training cache) or "
        f"`python -m transformer.data.standin --synthetic_ids --out={token_cache} --pairs=N` "
        "(a synthetic one)"))
    check_cache_fits(cache, cfg.data, cfg.seed)
  else:
    text = pipeline.SplitText(cfg.data)
    text.check()
    vocab_path = pipeline.prepared_vocabulary(cfg.data, cfg.seed, text)
    cache = pipeline.split_cache(cfg.data, cfg.data.train_split, vocab_path, text=text)
    if cfg.data.subword_dropout:
      subword = {"data": cfg.data.to_dict(), "split": cfg.data.train_split,
                 "vocab": str(vocab_path), "alpha": cfg.data.subword_dropout}
  spec = BatchSpec.for_training(cfg, jax.device_count())
  return input_benchmark.run(cache, spec, cfg.seed, batches, workers, stub_step_ms, stub_steps,
                             subword, busy)
