"""A new run that starts from another run's parameters (`train.init_from=RUN`): fine-tuning an
imported Marian model or a trained run on other data, with its own schedule and a fresh optimizer.

    transformer-train --config=configs/multi30k.py --workdir=runs/opus_m30k \
      --config.train.init_from=runs/opus --config.train.steps=500

The model's architecture and the vocabulary are RUN's: `with_architecture` copies RUN's model keys
into the config (all but those that only change how training computes: dropout, dtypes, kernels,
recomputation) and its vocabulary size, and says which it changed; `copy_vocabulary` puts RUN's
vocabulary file into the new workdir before the data pipeline looks for one; `initial_params`
gives RUN's parameters (its moving average where it keeps one) for step 0.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.model.config import ModelConfig
from transformer.training import checkpoints

log = logging.getLogger("transformer")

# Model keys a fine-tuning run may set itself: how it trains, not what the parameters compute.
TRAINING_ONLY = ("dropout", "attention_dropout", "activation_dropout", "word_dropout", "dtype",
                 "matmul_dtype", "attention", "remat")
# Keys whose 0 means "derived from the others", named by what they resolve to: a run written with
# decoder_layers=2 and one with 0 and num_layers=2 have the same decoder, and the log says nothing.
RESOLVED = {"decoder_layers": "num_decoder_layers", "d_k": "key_dim", "d_v": "value_dim"}


def _source(cfg: ml_collections.ConfigDict) -> Path:
  source = Path(cfg.train.init_from)
  if not (source / checkpoints.CONFIG_FILE).is_file():
    raise ConfigError(f"config.train.init_from={source} is not a run folder (no config.json): "
                      "give a trained run's --workdir or transformer-import's")
  return source


def with_architecture(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`cfg` with RUN's architecture and vocabulary size; unchanged without train.init_from."""
  if not cfg.train.init_from:
    return cfg
  source = _source(cfg)
  theirs = checkpoints.load_run_config(source)
  before = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  cfg = ml_collections.ConfigDict(cfg.to_dict())
  copied = [key for key in theirs.model
            if key not in TRAINING_ONLY and key in cfg.model and cfg.model[key] != theirs.model[key]]
  for key in copied:
    cfg.model[key] = theirs.model[key]
  after = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  changed = [f"model.{key}={theirs.model[key]!r}" for key in copied
             if key not in RESOLVED or getattr(before, RESOLVED[key]) != getattr(after, RESOLVED[key])]
  if cfg.data.vocab_size != theirs.data.vocab_size:
    changed.append(f"data.vocab_size={theirs.data.vocab_size}")
    cfg.data.vocab_size = theirs.data.vocab_size
  if changed:
    log.info("Starting from %s: its architecture and vocabulary (%s)", source, ", ".join(changed))
  return cfg


def copy_vocabulary(cfg: ml_collections.ConfigDict, workdir: Path) -> None:
  """RUN's vocabulary file into a new `workdir` (one that has its own is left alone: a resume)."""
  if not cfg.train.init_from or vocab_lib.run_vocab_path(workdir).is_file():
    return
  vocab = vocab_lib.run_vocab_path(_source(cfg))
  if not vocab.is_file():
    raise ConfigError(f"config.train.init_from={cfg.train.init_from} has no vocabulary ({vocab})")
  workdir.mkdir(parents=True, exist_ok=True)
  shutil.copyfile(vocab, workdir / vocab.name)


def start_state(cfg: ml_collections.ConfigDict, state: Any) -> Any:
  """The fresh train `state` with RUN's latest parameters (its moving average where it keeps one)
  in place of the initial ones, laid out as they were; unchanged without train.init_from."""
  if not cfg.train.init_from:
    return state
  from transformer.training.workdir import load_run
  params = load_run(_source(cfg)).params()
  if jax.tree.structure(params) != jax.tree.structure(state.params):
    raise ConfigError(f"config.train.init_from={cfg.train.init_from}: its parameters are laid out "
                      "otherwise (config.model.scan_layers differs?); use the run's own setting")
  placed = jax.tree.map(lambda new, old: jax.device_put(np.asarray(new, old.dtype), old.sharding),
                        params, state.params)
  log.info("Starting from the parameters of %s", cfg.train.init_from)
  if getattr(state, "ema_params", None) is not None:  # its own buffers: the step donates both
    state = state.replace(ema_params=jax.tree.map(jnp.copy, placed))
  return state.replace(params=placed)
