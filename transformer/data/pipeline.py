"""A run's inputs, from config to loaders: vocabulary, token caches (built once), batch loaders.

    text --(vocab.py)--> vocabulary --(token_cache.py, all cores)--> ids on disk
         --(loader.py: plan over lengths, gather, Grain)--> batches

Process 0 trains or copies the vocabulary and builds a missing or stale token cache first; the other
processes then find them (on a shared disk) or build their own identical copy (on a host's disk).
Training reads only ids.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import jax
import ml_collections
import numpy as np
import sentencepiece as spm

from transformer.data import sources
from transformer.data import token_cache as cache_lib
from transformer.data import vocab as vocab_lib
from transformer.data.loader import BatchSpec, Loader, PipelineState, Sharding
from transformer.distributed import leader_first

log = logging.getLogger("transformer")

__all__ = ["BatchSpec", "Loader", "PipelineState", "split_cache", "training_inputs"]


class SplitText:
  """The splits' text, each opened when first needed and at most once. A start whose vocabulary and
  caches are built needs none of it: `check` looks at the files' metadata, the split's size comes
  from its record (token_cache.recorded_pairs). Before any long work (training the vocabulary,
  building a cache) `for_building` opens the validation split too, so files that do not pair up
  are found in seconds, not after an hour of tokenizing."""

  def __init__(self, data: ml_collections.ConfigDict):
    self.data, self.opened = data, {}

  def check(self) -> None:
    for split in (self.data.train_split, self.data.eval_split):
      sources.source_of(self.data).check_files(self.data, split)

  def __call__(self, split: str):
    if split not in self.opened:
      self.opened[split] = sources.open_split(self.data, split)
      cache_lib.record_pairs(self.data, split, len(self.opened[split]))
    return self.opened[split]

  def for_building(self, split: str):
    """A function that opens `split` for long work on it: the validation split first."""
    return lambda: (self(self.data.eval_split), self(split))[1]


def split_filters(data: ml_collections.ConfigDict, split: str) -> cache_lib.Filters:
  """Training pairs are filtered by length and ratio, validation pairs only by length (every
  validation pair that fits is scored)."""
  ratio = data.max_length_ratio if split == data.train_split else 0
  return cache_lib.Filters(data.max_len, ratio)


def split_cache(data: ml_collections.ConfigDict, split: str, vocab_path: Path,
                build_missing: bool = True, text: SplitText | None = None) -> cache_lib.TokenCache:
  """The token cache of `split` for the run's vocabulary, with `split_filters`; the text is opened
  only if the cache must be built."""
  filters = split_filters(data, split)
  text = text or SplitText(data)
  cache = cache_lib.open_or_build(data, split, vocab_path, filters, text.for_building(split),
                                  build_missing)
  if split == data.train_split and any(cache.meta["dropped"].values()):
    log.info("%s: %s", cache.meta["corpus"],
             filters.describe(len(cache), cache.meta["dropped"]))
  return cache


def prepared_vocabulary(data: ml_collections.ConfigDict, seed: int, text: SplitText,
                        workdir: Path | None = None) -> Path:
  """The vocabulary's path: the run's (WORKDIR/vocab.model, copied from the cache if new), or with no
  workdir the cache's; trained only where none exists, reading the text only then."""
  opener = text.for_building(data.train_split)
  pairs = cache_lib.recorded_pairs(data, data.train_split)
  if workdir is None:
    return vocab_lib.cached_vocab(data, opener, seed, pairs)
  vocab_lib.vocab_for_run(workdir, data, opener, seed, pairs)
  return vocab_lib.run_vocab_path(workdir)


def training_inputs(cfg: ml_collections.ConfigDict, workdir: Path, num_devices: int
                    ) -> tuple[spm.SentencePieceProcessor, Loader, list[dict[str, np.ndarray]]]:
  """Opens the data, builds or reuses the vocabulary and token caches; returns (vocab, training
  loader, validation batches). Validation batches are made once and kept in memory."""
  data = cfg.data
  text = SplitText(data)
  text.check()  # every split's files are there and readable, before anything is built
  vocab_path = leader_first("vocabulary",
                            lambda: prepared_vocabulary(data, cfg.seed, text, Path(workdir)))
  vocab = vocab_lib.load_run_vocab(workdir, data)
  train_cache = leader_first("training token cache",
                             lambda: split_cache(data, data.train_split, vocab_path, text=text))
  eval_cache = leader_first("validation token cache",
                            lambda: split_cache(data, data.eval_split, vocab_path, text=text))
  spec = BatchSpec.for_training(cfg, num_devices)
  sharding = Sharding(jax.process_index(), jax.process_count())
  subword = None
  if data.subword_dropout:
    subword = {"data": data.to_dict(), "split": data.train_split, "vocab": str(vocab_path),
               "alpha": data.subword_dropout}
  train = Loader(train_cache, spec, seed=cfg.seed, sharding=sharding,
                 workers=data.loader_workers, subword=subword)
  eval_spec = dataclasses.replace(spec, mode="bucket", row_multiple=num_devices)
  eval_loader = Loader(eval_cache, eval_spec, shuffle=False, repeat=False, sharding=sharding,
                       threads=0)
  eval_batches = [batch for batch, _ in eval_loader.batches()]
  log.info("Data: %s training pairs (%s), %s validation pairs in %d batches; vocabulary %d; %s "
           "of ~%d tokens per side%s%s", f"{len(train_cache):,}", train.name,
           f"{len(eval_cache):,}", len(eval_batches), vocab.get_piece_size(), train.describe(),
           data.tokens_per_batch,
           f" in {cfg.train.grad_accum_steps} micro-batches" if cfg.train.grad_accum_steps > 1 else "",
           f"; BPE-dropout {data.subword_dropout:g}" if data.subword_dropout else "")
  return vocab, train, eval_batches
