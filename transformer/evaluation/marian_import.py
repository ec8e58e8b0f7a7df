"""A Hugging Face Marian model (an OPUS-MT model, or one of ours exported) as a run folder that every
program here takes as a trained run.

    transformer-import --format=huggingface --model=Helsinki-NLP/opus-mt-en-de --workdir=runs/opus
    transformer-eval --workdir=runs/opus --split=test

`--model` is a folder as `MarianMTModel.save_pretrained` and `MarianTokenizer.save_pretrained`
write it, or a hub name where Transformers can fetch it (Transformers reads either: its loader
knows the hub, safetensors and PyTorch files). The run folder holds config.json (`--config`'s data,
training and decoding sections; the model section from Marian's config), the vocabulary as
vocab.marian (marian_vocab.py) and one checkpoint at step 0. Marian's ids are renumbered into ours
(padding 0, EOS 1, unknown 3; a start token of its own at 2 where it has one, else Marian's
decoding starts from padding: model.decoder_start='pad' and id 2 is an ordinary piece), the
residual stream goes back into our coordinate order, and Marian's LayerNorm epsilon (1e-5) is the
model's (model.layer_norm_epsilon), so the imported model computes Marian's function. A model this
project exported carries its stream scale and epsilon in config.json and comes back bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from transformer.cli import run_program
from transformer.config import validate
from transformer.data.marian_vocab import MARIAN_VOCAB_FILE, write_marian_vocab
from transformer.errors import ConfigError
from transformer.evaluation import marian
from transformer.evaluation.export import check_new, staged
from transformer.model import positions
from transformer.model.config import ModelConfig
from transformer.model.transformer import Transformer, initial_params
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer.training import checkpoints
from transformer.training.step import create_train_state, make_optimizer

log = logging.getLogger("transformer")
FLAGS = flags.FLAGS
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "multi30k.py"


TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
HUB_TIMEOUT_SECONDS = 5.0


def read_marian(model: str) -> tuple[Any, dict[str, np.ndarray], Any, dict[str, bytes]]:
  """(MarianConfig, the state's tensors as float32 numpy, the tokenizer, its files' bytes)."""
  transformers = marian.transformers_library()
  try:
    import torch  # noqa: F401  (MarianMTModel's weights are torch tensors)
  except ImportError:
    raise ConfigError(f"--format=huggingface reads the model with torch: {marian.INSTALL}"
                      ) from None
  local = Path(model)
  offline = {}
  if not local.is_dir():
    offline = hub_access(model)

  def loaded(load: Any) -> Any:
    try:
      return load(model, **offline)
    except Exception as e:  # noqa: BLE001  torch, safetensors and the hub raise many kinds
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ConfigError(f"--model={model}: Transformers cannot load a Marian model and tokenizer "
                        f"there ({first[:300]})") from None
  if local.is_dir() and not (local / "config.json").is_file():
    raise ConfigError(f"--model={model} holds no config.json: it is not a Marian model's folder "
                      "(one MarianMTModel.save_pretrained wrote), nor a hub name")
  config = loaded(transformers.MarianConfig.from_pretrained)
  check_config(config)  # what the config alone refuses, before the weights are read
  if local.is_dir():  # a hub name is Transformers' to resolve; a folder we can check first
    missing = [name for name in TOKENIZER_FILES if not (local / name).is_file()]
    if missing:
      raise ConfigError(f"--model={model} has no {', '.join(missing)}: a Marian model's folder "
                        "holds MarianTokenizer's files too (save the tokenizer with "
                        "tokenizer.save_pretrained into the same folder)")
  engine = loaded(transformers.MarianMTModel.from_pretrained)
  tokenizer = loaded(transformers.MarianTokenizer.from_pretrained)
  tensors = {name: value.detach().float().numpy() for name, value in engine.state_dict().items()}
  with tempfile.TemporaryDirectory() as scratch:
    tokenizer.save_pretrained(scratch)
    files = {name: (Path(scratch) / name).read_bytes() for name in TOKENIZER_FILES}
  return config, tensors, tokenizer, files


def hub_access(name: str) -> dict[str, Any]:
  """For a `--model` that is no folder here: {} where the hub can be asked for it, or
  {'local_files_only': True} where Transformers' cache holds it and the hub is out of reach; else
  a ConfigError saying both (at once, not after a minute of retries)."""
  import huggingface_hub
  try:
    huggingface_hub.hf_hub_download(name, "config.json", local_files_only=True)
    cached = True
  except Exception:  # noqa: BLE001  not cached, or not a valid repository name
    cached = False
  reason = None
  if huggingface_hub.constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in (
      "1", "ON", "YES", "TRUE"):
    reason = "HF_HUB_OFFLINE is set"
  else:
    host = urllib.parse.urlparse(huggingface_hub.constants.ENDPOINT).hostname or "huggingface.co"
    try:
      socket.create_connection((host, 443), timeout=HUB_TIMEOUT_SECONDS).close()
    except OSError as e:
      reason = f"{host} cannot be reached: {e.strerror or e}"
  if reason is None:
    return {}
  if cached:
    return {"local_files_only": True}
  raise ConfigError(f"--model={name}: no such folder here, and no hub model of that name can be "
                    f"fetched ({reason}; none is in Transformers' cache either). Check the folder's "
                    "path, or download the model where there is a network")


def check_config(theirs: Any) -> None:
  """Refuses in one line a Marian config whose model ours cannot compute."""
  def need(ok: bool, what: str) -> None:
    if not ok:
      raise ConfigError(f"cannot import this Marian model: {what}")
  need(theirs.scale_embedding, "its embeddings are not scaled by sqrt(d_model) "
       "(scale_embedding=False); ours always are, as the paper's")
  need(theirs.share_encoder_decoder_embeddings and theirs.decoder_vocab_size in (None, theirs.vocab_size),
       "its source and target embeddings are separate matrices; ours share one")
  need(getattr(theirs, "tie_word_embeddings", True),
       "its output layer is a matrix of its own (tie_word_embeddings=False, lm_head.weight); "
       "ours is the embedding matrix")
  need(theirs.encoder_attention_heads == theirs.decoder_attention_heads
       and theirs.encoder_ffn_dim == theirs.decoder_ffn_dim,
       "its encoder and decoder differ in heads or feed-forward width; ours share them")
  need(theirs.activation_function in ACTIVATIONS, f"its activation {theirs.activation_function!r} "
       f"is not one of {', '.join(ACTIVATIONS)}")
  need(theirs.d_model % theirs.encoder_attention_heads == 0, "d_model is not a multiple of heads")


def model_section(theirs: Any, output_bias: bool, start: str) -> dict[str, Any]:
  """Our model keys for Marian's config (check_config has refused what ours cannot compute)."""
  check_config(theirs)
  epsilon = getattr(theirs, marian.EPSILON_KEY, marian.MARIAN_LAYER_NORM_EPSILON)
  return dict(num_layers=theirs.encoder_layers, decoder_layers=theirs.decoder_layers,
              d_model=theirs.d_model, d_ff=theirs.encoder_ffn_dim,
              num_heads=theirs.encoder_attention_heads, d_k=0, d_v=0, norm="post",
              share_embeddings=True, activation=ACTIVATIONS[theirs.activation_function],
              dropout=theirs.dropout, attention_dropout=theirs.attention_dropout,
              activation_dropout=theirs.activation_dropout,
              output_bias=output_bias, decoder_start=start, layer_norm_epsilon=epsilon)


def renumbering(theirs: Any, tokenizer: Any) -> tuple[np.ndarray, str]:
  """(for each of our ids, Marian's id there; our model.decoder_start). Padding, EOS and unknown
  go to our fixed ids; a start token of Marian's own to BOS; the rest keep their order."""
  size, start = theirs.vocab_size, theirs.decoder_start_token_id
  pad, eos, unk = theirs.pad_token_id, theirs.eos_token_id, tokenizer.unk_token_id
  if len({pad, eos, unk}) < 3 or start == eos or start == unk:
    raise ConfigError(f"cannot import this Marian model: its padding ({pad}), EOS ({eos}), "
                      f"unknown ({unk}) and start ({start}) ids are not distinct as ours are")
  fixed = {PAD_ID: pad, EOS_ID: eos, UNK_ID: unk}
  kind = "pad" if start == pad else "bos"
  if kind == "bos":
    fixed[BOS_ID] = start
  rest = iter(i for i in range(size) if i not in fixed.values())
  return np.array([fixed[i] if i in fixed else next(rest) for i in range(size)]), kind


def check_positions(tensors: dict[str, np.ndarray], config: ModelConfig) -> None:
  """The stored tables must be Marian's sinusoids (what Transformers computes at every load), in
  our coordinate order the paper's interleaved ones: our 'sinusoidal' kind."""
  rows = tensors["model.encoder.embed_positions.weight"].shape[0]
  ours = positions.get("sinusoidal").added_tables(config, {}, rows)[0]
  want = ours[:, marian.marian_order(config.d_model)]
  for stack in ("encoder", "decoder"):
    table = tensors[f"model.{stack}.embed_positions.weight"]
    if np.abs(table - want).max() > 1e-4:
      raise ConfigError(f"cannot import this Marian model: its {stack} position table is not "
                        "Marian's sinusoids (an export of a run with learned or no positions, "
                        "which only sinusoidal positions survive); import supports sinusoidal")


def import_marian(model: str, workdir: str | Path, cfg: ml_collections.ConfigDict) -> Path:
  """Writes the run folder `workdir` (new or empty) from the Marian model `model`."""
  workdir = Path(workdir)
  check_new(workdir, "--workdir")  # before the model is read
  theirs, tensors, tokenizer, files = read_marian(model)
  order, start = renumbering(theirs, tokenizer)
  bias = tensors["final_logits_bias"].reshape(-1)[order]
  cfg = ml_collections.ConfigDict(cfg.to_dict())
  for key, value in model_section(theirs, bool(np.any(bias)), start).items():
    cfg.model[key] = value
  cfg.model.positional = "sinusoidal"
  cfg.data.vocab_size = theirs.vocab_size
  for side in ("src_lang", "tgt_lang"):
    language = getattr(tokenizer, "source_lang" if side == "src_lang" else "target_lang", None)
    cfg.data[side] = language or cfg.data[side]
  validate(cfg)
  config = ModelConfig.from_config(cfg.model, theirs.vocab_size)
  check_positions(tensors, config)
  tensors["model.shared.weight"] = tensors["model.shared.weight"][order]
  tensors["final_logits_bias"] = bias
  scale = getattr(theirs, marian.STREAM_SCALE_KEY, 1.0)
  network = Transformer(config)
  shapes = jax.eval_shape(lambda: initial_params(network, jax.random.key(0)))
  params = marian.marian_params(config, tensors, scale, shapes)
  ids = json.loads(files["vocab.json"])
  pieces_by_id = {i: piece for piece, i in ids.items()}
  pieces = [pieces_by_id.get(int(i), f"<unused{int(i)}>") for i in order]
  with staged(workdir, "--workdir") as staging:
    checkpoints.write_run_config(staging, cfg)
    write_marian_vocab(staging / MARIAN_VOCAB_FILE, pieces, files["source.spm"],
                       files["target.spm"], bos=start == "bos")
    state = create_train_state(network, make_optimizer(cfg), jax.random.key(0),
                               ema=cfg.train.ema_decay > 0)
    state = state.replace(params=jax.tree.map(np.asarray, params))
    if cfg.train.ema_decay > 0:
      state = state.replace(ema_params=state.params)
    with contextlib.closing(checkpoints.manager(staging, keep=1)) as target:
      checkpoints.save(target, 0, state, {"epoch": 0, "batch": 0})
      checkpoints.finish_saves(target)
  return Path(workdir)


def main(argv: list[str]) -> None:
  if FLAGS.model is None or FLAGS.workdir is None:
    raise app.UsageError("pass --format=huggingface --model=DIR_OR_HUB_NAME --workdir=NEW_DIR")
  if FLAGS.config is None:
    raise app.UsageError(f"pass --config=A_CONFIG_FILE (its data, training and decoding settings; "
                         f"e.g. configs/multi30k.py of the repository): the default, {DEFAULT_CONFIG}, "
                         "is not there (an installed package has no configs/ folder)")
  out = import_marian(FLAGS.model, FLAGS.workdir, FLAGS.config)
  print(f"imported {FLAGS.model} into {out}; evaluate it with: transformer-eval --workdir={out}; "
        f"fine-tune it with: transformer-train --workdir=NEW_RUN --config.train.init_from={out}")


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_enum("format", "huggingface", ["huggingface"], "What --model is: a Hugging Face "
                    "Transformers Marian model (MarianMTModel and MarianTokenizer).")
  flags.DEFINE_string("model", None, "A folder MarianMTModel.save_pretrained and MarianTokenizer."
                      "save_pretrained wrote, or a hub name (e.g. Helsinki-NLP/opus-mt-en-de).")
  flags.DEFINE_string("workdir", None, "New run folder to write.")
  default = str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else None  # a repository checkout's
  config_flags.DEFINE_config_file("config", default, "The run's data, training and decoding "
                                  "settings (its model section comes from the import).")
  run_program("transformer-import", main, compilation_cache=False)


if __name__ == "__main__":
  run()
