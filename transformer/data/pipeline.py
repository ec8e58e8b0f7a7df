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


def split_cache(data: ml_collections.ConfigDict, split: str, vocab_path: Path,
                build_missing: bool = True) -> cache_lib.TokenCache:
  """The token cache of `split` for the run's vocabulary: training pairs filtered by length and
  ratio, validation pairs only by length (every validation pair that fits is scored)."""
  is_train = split == data.train_split
  filters = cache_lib.Filters(data.max_len, data.max_length_ratio if is_train else 0)
  cache = cache_lib.open_or_build(data, split, vocab_path, filters,
                                  lambda: sources.open_split(data, split), build_missing)
  if is_train and any(cache.meta["dropped"].values()):
    log.info("%s: %s", cache.meta["corpus"],
             filters.describe(len(cache), cache.meta["dropped"]))
  return cache


def training_inputs(cfg: ml_collections.ConfigDict, workdir: Path, num_devices: int
                    ) -> tuple[spm.SentencePieceProcessor, Loader, list[dict[str, np.ndarray]]]:
  """Opens the data, builds or reuses the vocabulary and token caches; returns (vocab, training
  loader, validation batches). Validation batches are made once and kept in memory."""
  data = cfg.data
  vocab = leader_first("vocabulary", lambda: vocab_lib.vocab_for_run(
      workdir, data, sources.open_split(data, data.train_split), cfg.seed))
  vocab_path = Path(workdir) / vocab_lib.VOCAB_FILE
  train_cache = leader_first("training token cache",
                             lambda: split_cache(data, data.train_split, vocab_path))
  eval_cache = leader_first("validation token cache",
                            lambda: split_cache(data, data.eval_split, vocab_path))
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
