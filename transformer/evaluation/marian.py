"""A trained run as a Hugging Face Transformers Marian model: what `MarianMTModel.from_pretrained`
and `MarianTokenizer.from_pretrained` (and Transformers 4's `pipeline("translation")`) open with no
other file.

    transformer-export --workdir=runs/m30k --format=huggingface --output=runs/m30k_hf

Marian (the architecture of the OPUS-MT models) is the paper's: post-LayerNorm stacks, ReLU
feed-forward layers with biases, one matrix for the source and target embeddings (scaled by
sqrt(d_model)) and the pre-softmax projection, and a position table added to each stack's embeddings.
So a run goes over tensor by tensor (`marian_tensors`), with its additive positions as the stored
tables. Transformers loads a stored `embed_positions.weight` but never saves one: a model it saves
again (`save_pretrained`, `push_to_hub`) computes Marian's own sinusoids at its next load, the
paper's in [sin | cos] halves rather than interleaved. So the residual stream's coordinates are
permuted into that order (`marian_order`): a sinusoidal run's stored table then is Marian's own and
the export survives any re-save; learned tables and none are exported with a warning that a
re-saved copy loses them (`resave_warning`). What Marian cannot hold is
refused before anything is read or written (`check_marian`). Its LayerNorms' epsilon is 1e-5, ours
1e-6, and cannot be set: the stream is carried sqrt(10) times larger from each stack's first
LayerNorm on, which makes all the others compute ours exactly (`marian_tensors` says why and what
is left). What still differs is the search: its length penalty's formula and its absolute length
limit (`max_length`), where ours is the source length + `decode.max_extra_len`.

Written with the libraries' own writers where they exist: the weights with safetensors, the model and
generation configs with Transformers' `MarianConfig` and `GenerationConfig` (which check the values),
the tokenizer with `MarianTokenizer` from the run's SentencePiece model (as both source.spm and
target.spm) and its pieces as vocab.json, ids unchanged.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import sentencepiece as spm

from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.model import positions
from transformer.model.config import ModelConfig, layer_params
from transformer.model.transformer import LAYER_NORM_EPSILON
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

INSTALL = "pip install -e '.[huggingface]'"
MARIAN_LAYER_NORM_EPSILON = 1e-5  # torch's nn.LayerNorm default, which Marian's layers keep
SCALE = math.sqrt(MARIAN_LAYER_NORM_EPSILON / LAYER_NORM_EPSILON)  # of the residual stream


def transformers_library():
  """The transformers package, or the line that says how to install it."""
  try:
    import transformers
  except ImportError:
    raise ConfigError(f"--format=huggingface needs the transformers package: {INSTALL}") from None
  return transformers


def check_marian(config: ModelConfig) -> None:
  """Raises a one-line ConfigError where Marian's architecture cannot hold the model."""
  if not positions.adds_tables(config.positional):
    tables = " or ".join(k for k in positions.kinds() if positions.adds_tables(k))
    raise ConfigError(f"Marian cannot hold {config.positional!r} positions: it adds one position "
                      f"table to each stack's embeddings, and {config.positional!r} acts inside "
                      f"attention; export a run with {tables} positions, or use "
                      "--format=ctranslate2 where it holds the kind")
  if config.norm != "post":
    raise ConfigError(f"Marian's layers are post-LayerNorm; this model is {config.norm}-LayerNorm "
                      "(config.model.norm): use --format=ctranslate2, which holds both")
  if not config.share_embeddings:
    raise ConfigError("Marian shares one matrix between the source and target embeddings and the "
                      "output projection; this model has separate ones (config.model."
                      "share_embeddings=False): use --format=ctranslate2, which holds both")
  per_head = config.d_model / config.num_heads
  if config.key_dim != per_head or config.value_dim != per_head:
    raise ConfigError(f"Marian's heads are d_model / heads = {per_head:g} wide; this model's d_k "
                      f"and d_v are {config.key_dim} and {config.value_dim} (config.model.d_k, "
                      "d_v): use --format=ctranslate2")


def marian_order(d_model: int) -> np.ndarray:
  """The residual stream's coordinates in Marian's order: ours at 0, 2, 4, ... then 1, 3, 5, ...
  The paper's sinusoids interleave sin and cos (sin at even coordinates); Marian's, which
  Transformers computes itself where no table is stored, put the same sines in the first half and
  the cosines in the second. LayerNorm ignores the order of its coordinates, so a model whose every
  tensor is permuted alike computes the same function with Marian's own table."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


class _Stream:
  """Ours to Marian's for tensors that touch the residual stream: its coordinates in Marian's
  order (`marian_order`); `scale`: how many times ours the stream they read or write is there
  (`marian_tensors` says where and why)."""

  def __init__(self, d_model: int):
    self.order = marian_order(d_model)

  def reads(self, kernel: np.ndarray, bias: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    """A projection of the stream (kernel [in, out]) as torch's Linear stores it (weight [out, in])."""
    return {"weight": np.ascontiguousarray(kernel[self.order].T) / scale, "bias": bias.reshape(-1)}

  def writes(self, kernel: np.ndarray, bias: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    """A projection whose output joins the stream."""
    return {"weight": np.ascontiguousarray(kernel[:, self.order].T) * scale,
            "bias": bias.reshape(-1)[self.order] * scale}

  def vectors(self, table: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Rows on the stream (embeddings, position tables, LayerNorm gains and biases)."""
    return table[..., self.order] * scale

  def norm(self, norm: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """A LayerNorm whose output is `scale` times ours."""
    return {"weight": self.vectors(norm["scale"], scale), "bias": self.vectors(norm["bias"], scale)}

  def attention(self, attention: dict[str, Any], query_scale: float, memory_scale: float
                ) -> dict[str, dict[str, np.ndarray]]:
    """Head projections (kernels [D, H, K]) read the stream (queries at `query_scale`, keys and
    values at `memory_scale`); the output ([H, K, D]) writes it at `query_scale`."""
    heads = lambda d, scale: self.reads(d["kernel"].reshape(d["kernel"].shape[0], -1), d["bias"],
                                        scale)
    out = attention["out"]
    return {"q_proj": heads(attention["query"], query_scale),
            "k_proj": heads(attention["key"], memory_scale),
            "v_proj": heads(attention["value"], memory_scale),
            "out_proj": self.writes(out["kernel"].reshape(-1, out["kernel"].shape[-1]),
                                    out["bias"], query_scale)}


def _flatten(tree: dict[str, Any], prefix: str) -> dict[str, np.ndarray]:
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{name}."))
    else:
      out[prefix + name] = value
  return out


def marian_tensors(config: ModelConfig, params: Any, rows: int, scale: float = SCALE
                   ) -> dict[str, np.ndarray]:
  """Every tensor of MarianMTModel's state, by its name there, float32 (tied ones once: the shared
  embedding; `lm_head` and both `embed_tokens` are tied to it when Transformers loads it), the
  residual stream in Marian's order (`marian_order`).

  Marian's LayerNorms divide by sqrt(variance + 1e-5), ours by sqrt(variance + 1e-6), and its
  config cannot change that. A LayerNorm is blind to its input's scale but for the epsilon:
  LN_eps(c x) = LN_{eps / c^2}(x). So from the first LayerNorm of each stack on, the tensors carry
  the stream `scale` = sqrt(10) times larger (LayerNorm gains and biases times c, projections
  reading it divided by c, those writing it times c, the decoder's last LayerNorm times 1 for the
  logits), and those LayerNorms compute ours exactly. Before it, the embeddings and position
  tables stay ours: Transformers never saves the tables (a re-saved model recomputes Marian's own
  at its next load), so they must be exactly what it computes. Only each stack's first LayerNorm
  then differs from ours, by the epsilon, on a stream whose variance is about 1 (the scaled
  embeddings plus the sinusoids): measured on trained runs in experiments/results/marian_epsilon/.
  `scale=1` leaves every LayerNorm at Marian's epsilon (what that measurement compares)."""
  check_marian(config)
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  encoder_table, decoder_table = positions.get(config.positional).added_tables(config, params, rows)
  stream = _Stream(config.d_model)
  tree: dict[str, Any] = {"model": {
      "shared": {"weight": stream.vectors(params["embed"]["embedding"])},
      "encoder": {"embed_positions": {"weight": stream.vectors(encoder_table)}, "layers": {}},
      "decoder": {"embed_positions": {"weight": stream.vectors(decoder_table)}, "layers": {}}}}
  for stack, count in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
    for i in range(count):
      ours = layer_params(params[stack], i)
      ffn = ours["ffn"]
      before = 1.0 if i == 0 else scale  # the stream's scale entering the layer
      last = stack == "decoder" and i == count - 1
      layer = {"self_attn": stream.attention(ours["self_attention"], before, before),
               "self_attn_layer_norm": stream.norm(ours["self_attention_norm"], scale),
               "fc1": stream.reads(ffn["wi"]["kernel"], ffn["wi"]["bias"], scale),
               "fc2": stream.writes(ffn["wo"]["kernel"], ffn["wo"]["bias"], scale),
               "final_layer_norm": stream.norm(ours["ffn_norm"], 1.0 if last else scale)}
      if stack == "decoder":  # the encoder's output, its memory, leaves at `scale` too
        layer["encoder_attn"] = stream.attention(ours["cross_attention"], scale, scale)
        layer["encoder_attn_layer_norm"] = stream.norm(ours["cross_attention_norm"], scale)
      tree["model"][stack]["layers"][str(i)] = layer
  tensors = _flatten(tree, "")
  tensors["final_logits_bias"] = np.zeros((1, config.vocab_size), np.float32)  # ours has none
  return {name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()}


def resave_warning(config: ModelConfig) -> str | None:
  """What a user must know before sharing an export whose position table Transformers cannot
  recompute (learned tables, none): None for the sinusoidal kind, whose table it does."""
  if config.positional == "sinusoidal":
    return None
  return (f"this {config.positional!r}-position model is exact as written, but Transformers' "
          "save_pretrained (and push_to_hub, a Trainer's checkpoints) never saves Marian's position "
          "tables: a re-saved copy loads Marian's own sinusoids instead and is another model. "
          "Share the exported folder as it is written, or export a run with sinusoidal positions")


def marian_settings(config: ModelConfig, rows: int) -> dict[str, Any]:
  """MarianConfig's values for the model (config.json): sizes, special ids, training's dropout."""
  return dict(
      architectures=["MarianMTModel"], vocab_size=config.vocab_size,
      decoder_vocab_size=config.vocab_size, max_position_embeddings=rows,
      d_model=config.d_model, encoder_layers=config.num_layers,
      decoder_layers=config.num_decoder_layers, encoder_attention_heads=config.num_heads,
      decoder_attention_heads=config.num_heads, encoder_ffn_dim=config.d_ff,
      decoder_ffn_dim=config.d_ff, activation_function=config.activation, scale_embedding=True,
      dropout=config.dropout, attention_dropout=config.attention_dropout, activation_dropout=0.0,
      pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
      decoder_start_token_id=BOS_ID, forced_eos_token_id=EOS_ID,
      share_encoder_decoder_embeddings=True, tie_word_embeddings=True, is_encoder_decoder=True)


def generation_settings(cfg: ml_collections.ConfigDict, rows: int) -> dict[str, Any]:
  """GenerationConfig's values: the run's beam and length-penalty exponent, PAD and BOS never
  written (as our searches forbid them), EOS forced at the last of `rows` output positions (as
  ours forces it at the limit), and the same stopping rule as ours ('never': a sentence is decided
  once no live hypothesis can beat the finished ones at the limit). Its penalty is length^alpha,
  not GNMT's ((5 + length) / 6)^alpha: the exponent carries over, the formula cannot."""
  settings = dict(num_beams=cfg.decode.beam_size, length_penalty=float(cfg.decode.alpha),
                  early_stopping="never" if cfg.decode.beam_size > 1 else False,
                  max_length=rows + 1,  # the decoder start token counts, so `rows` output tokens
                  decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                  pad_token_id=PAD_ID, forced_eos_token_id=EOS_ID, suppress_tokens=[PAD_ID, BOS_ID])
  if cfg.decode.min_len:
    settings["min_new_tokens"] = cfg.decode.min_len
  return settings


def special_pieces(vocab: spm.SentencePieceProcessor) -> dict[str, str]:
  """The tokenizer's special tokens: the run's own pieces at our fixed ids."""
  return {"pad_token": vocab.id_to_piece(PAD_ID), "eos_token": vocab.id_to_piece(EOS_ID),
          "unk_token": vocab.id_to_piece(UNK_ID)}


def write_marian(directory: Path, cfg: ml_collections.ConfigDict, config: ModelConfig,
                 params: Any, vocab_file: Path, rows: int) -> None:
  """Writes the model, its configs and its tokenizer into `directory` (which exists)."""
  from safetensors.numpy import save_file
  transformers = transformers_library()
  vocab = vocab_lib.load_vocab(vocab_file)
  save_file(marian_tensors(config, params, rows), str(directory / "model.safetensors"),
            metadata={"format": "pt"})
  transformers.MarianConfig(**marian_settings(config, rows)).save_pretrained(directory)
  transformers.GenerationConfig(**generation_settings(cfg, rows)).save_pretrained(directory)
  with tempfile.TemporaryDirectory() as scratch:
    pieces = Path(scratch) / "vocab.json"
    pieces.write_text(json.dumps({vocab.id_to_piece(i): i for i in range(vocab.get_piece_size())},
                                 ensure_ascii=False, indent=0))
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(vocab_file), target_spm=str(vocab_file), vocab=str(pieces),
        source_lang=cfg.data.src_lang, target_lang=cfg.data.tgt_lang,
        model_max_length=min(cfg.data.max_len, rows), **special_pieces(vocab))
    tokenizer.save_pretrained(directory)
