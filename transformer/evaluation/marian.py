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
1e-6, and cannot be set: the stream is carried 4 times larger from each stack's first LayerNorm on
(the power of two nearest sqrt(10), `stream_scale`), which makes all the others compute ours with
epsilon 6.25e-7 (`marian_tensors` says why and what is left). What still differs is the search:
its length penalty's formula and its absolute length limit (`max_length`), where ours is the source
length + `decode.max_extra_len`.

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

from transformer.data import marian_vocab
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.model import positions
from transformer.model.config import ModelConfig, layer_params
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID

INSTALL = "pip install -e '.[huggingface]'"
MARIAN_LAYER_NORM_EPSILON = 1e-5  # torch's nn.LayerNorm default, which Marian's layers keep


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
    elsewhere = (", or use --format=ctranslate2, which holds it"
                 if positions.in_ctranslate2(config.positional) else "")
    raise ConfigError(f"Marian cannot hold {config.positional!r} positions: it adds one position "
                      f"table to each stack's embeddings, and {config.positional!r} acts inside "
                      f"attention; export a run with {tables} positions{elsewhere}")
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


def stream_scale(config: ModelConfig) -> float:
  """How many times ours the residual stream is carried in the export (`marian_tensors`): the
  power of two nearest sqrt(Marian's epsilon / the model's), 4 for the paper's 1e-6 (1 for a model
  at Marian's). A power of two scales every tensor exactly, so an import gives the run back bit
  for bit; Marian's LayerNorms then compute epsilon 1e-5 / 16 = 6.25e-7 in our units, not 1e-6
  (measured with sqrt(10) and unscaled in experiments/results/marian_epsilon/)."""
  return 2.0 ** round(math.log2(math.sqrt(MARIAN_LAYER_NORM_EPSILON / config.layer_norm_epsilon)))


class _Stream:
  """Ours to Marian's and back for tensors that touch the residual stream: its coordinates in
  Marian's order (`marian_order`), and `scale` times ours where the tensor reads or writes it
  (`marian_tensors` says where and why). Each kind is a pair (to Marian's, back to ours); going
  back computes in float64 with the float32 scale, so a round trip gives ours bit for bit."""

  def __init__(self, d_model: int):
    self.order = marian_order(d_model)
    self.back = np.argsort(self.order)

  def to_marian(self, kind: str, ours: np.ndarray, scale: float) -> np.ndarray:
    if kind == "reads":  # a kernel [in, ...] reading the stream, as torch's Linear stores it
      return np.ascontiguousarray(ours.reshape(ours.shape[0], -1)[self.order].T) / scale
    if kind == "writes":  # a kernel [..., out] whose output joins the stream
      return np.ascontiguousarray(ours.reshape(-1, ours.shape[-1])[:, self.order].T) * scale
    if kind == "vector":  # rows on the stream: embeddings, LayerNorms, biases joining it
      return ours[..., self.order] * scale
    return ours.reshape(-1)  # 'plain': a bias off the stream

  def to_ours(self, kind: str, theirs: np.ndarray, scale: float, shape: tuple[int, ...]
              ) -> np.ndarray:
    scale, theirs = np.float64(np.float32(scale)), np.asarray(theirs, np.float64)
    if kind == "reads":
      out = (theirs.T * scale)[self.back]
    elif kind == "writes":
      out = (theirs.T / scale)[:, self.back]
    elif kind == "vector":
      out = (theirs / scale)[..., self.back]
    else:
      out = theirs
    return out.reshape(shape).astype(np.float32)


def _attention(marian: str, ours: str, query_scale: float, memory_scale: float):
  """Head projections (kernels [D, H, K]) read the stream (queries at `query_scale`, keys and
  values at `memory_scale`); the output ([H, K, D]) writes it at `query_scale`."""
  for projection, name, scale in (("q_proj", "query", query_scale), ("k_proj", "key", memory_scale),
                                  ("v_proj", "value", memory_scale)):
    yield f"{marian}.{projection}.weight", (ours, name, "kernel"), "reads", scale
    yield f"{marian}.{projection}.bias", (ours, name, "bias"), "plain", 1.0
  yield f"{marian}.out_proj.weight", (ours, "out", "kernel"), "writes", query_scale
  yield f"{marian}.out_proj.bias", (ours, "out", "bias"), "vector", query_scale


def _norm(marian: str, ours: str, scale: float):
  """A LayerNorm whose output is `scale` times ours."""
  yield f"{marian}.weight", (ours, "scale"), "vector", scale
  yield f"{marian}.bias", (ours, "bias"), "vector", scale


def _layout(config: ModelConfig, scale: float):
  """(Marian's name, our path in the parameters, kind for _Stream, scale) for every tensor but the
  position tables and final_logits_bias; the layers' paths are unrolled ('layer_i')."""
  yield "model.shared.weight", ("embed", "embedding"), "vector", 1.0
  for stack, count in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
    for i in range(count):
      before = 1.0 if i == 0 else scale  # the stream's scale entering the layer
      last = stack == "decoder" and i == count - 1
      entries = [*_attention("self_attn", "self_attention", before, before),
                 *_norm("self_attn_layer_norm", "self_attention_norm", scale),
                 ("fc1.weight", ("ffn", "wi", "kernel"), "reads", scale),
                 ("fc1.bias", ("ffn", "wi", "bias"), "plain", 1.0),
                 ("fc2.weight", ("ffn", "wo", "kernel"), "writes", scale),
                 ("fc2.bias", ("ffn", "wo", "bias"), "vector", scale),
                 *_norm("final_layer_norm", "ffn_norm", 1.0 if last else scale)]
      if stack == "decoder":  # the encoder's output, its memory, leaves at `scale` too
        entries += [*_attention("encoder_attn", "cross_attention", scale, scale),
                    *_norm("encoder_attn_layer_norm", "cross_attention_norm", scale)]
      for name, path, kind, at in entries:
        yield f"model.{stack}.layers.{i}.{name}", (stack, f"layer_{i}", *path), kind, at


def _leaf(params: Any, path: tuple[str, ...]) -> np.ndarray:
  stack, rest = path[0], path[1:]
  if rest and rest[0].startswith("layer_"):
    params, rest = layer_params(params[stack], int(rest[0][len("layer_"):])), rest[1:]
  else:
    params = params[stack]
  for key in rest:
    params = params[key]
  return params


def marian_tensors(config: ModelConfig, params: Any, rows: int, scale: float | None = None
                   ) -> dict[str, np.ndarray]:
  """Every tensor of MarianMTModel's state, by its name there, float32 (tied ones once: the shared
  embedding; `lm_head` and both `embed_tokens` are tied to it when Transformers loads it), the
  residual stream in Marian's order (`marian_order`).

  Marian's LayerNorms divide by sqrt(variance + 1e-5), ours by sqrt(variance + epsilon) (the
  paper's models: 1e-6), and its config cannot change that. A LayerNorm is blind to its input's
  scale but for the epsilon: LN_eps(c x) = LN_{eps / c^2}(x). So from the first LayerNorm of each
  stack on, the tensors carry the stream `scale` (default `stream_scale`: 4) times larger
  (LayerNorm gains and biases times c, projections reading it divided by c, those writing it times
  c, the decoder's last LayerNorm times 1 for the logits), and those LayerNorms compute ours
  with epsilon 6.25e-7 (sqrt(10) would make it 1e-6 exactly, but dividing by it rounds: no import
  could give the run back). Before it, the embeddings and position tables stay ours: Transformers never saves the
  tables (a re-saved model recomputes Marian's own at its next load), so they must be exactly what
  it computes. Only each stack's first LayerNorm then differs from ours, by the epsilon, on a
  stream whose variance is about 1 (the scaled embeddings plus the sinusoids): measured on trained
  runs in experiments/results/marian_epsilon/. `scale=1` leaves every LayerNorm at Marian's
  epsilon (what that measurement compares). `marian_params` reads them back."""
  check_marian(config)
  scale = stream_scale(config) if scale is None else scale
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  stream = _Stream(config.d_model)
  tensors = {name: stream.to_marian(kind, _leaf(params, path), at)
             for name, path, kind, at in _layout(config, scale)}
  encoder_table, decoder_table = positions.get(config.positional).added_tables(config, params, rows)
  for stack, table in (("encoder", encoder_table), ("decoder", decoder_table)):
    tensors[f"model.{stack}.embed_positions.weight"] = stream.to_marian("vector", table, 1.0)
  tensors["final_logits_bias"] = (params["decoder"]["output_bias"][None] if config.output_bias
                                  else np.zeros((1, config.vocab_size), np.float32))
  return {name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()}


def marian_params(config: ModelConfig, tensors: dict[str, np.ndarray], scale: float,
                  shapes: Any) -> dict[str, Any]:
  """Our parameters (unrolled layers; `shapes`: their tree, e.g. from jax.eval_shape) from a
  MarianMTModel's `tensors` carried at `scale` (`marian_tensors`' inverse; the position tables
  are not parameters)."""
  stream = _Stream(config.d_model)
  out: dict[str, Any] = {}
  for name, path, kind, at in _layout(config, scale):
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = stream.to_ours(kind, tensors[name], at, _leaf(shapes, path).shape)
  if config.output_bias:
    out["decoder"]["output_bias"] = np.asarray(tensors["final_logits_bias"], np.float32).reshape(-1)
  return out


def resave_warning(config: ModelConfig) -> str | None:
  """What a user must know before sharing an export whose position table Transformers cannot
  recompute (learned tables, none): None for the sinusoidal kind, whose table it does."""
  if config.positional == "sinusoidal":
    return None
  return (f"this {config.positional!r}-position model is exact as written, but Transformers' "
          "save_pretrained (and push_to_hub, a Trainer's checkpoints) never saves Marian's position "
          "tables: a re-saved copy loads Marian's own sinusoids instead and is another model. "
          "Share the exported folder as it is written, or export a run with sinusoidal positions")


# Keys the export adds to Marian's config.json (Transformers keeps unknown keys through re-saves):
# how many times ours its residual stream is (`marian_tensors`) and our LayerNorm epsilon, so that
# transformer-import gives back the run's parameters bit for bit.
STREAM_SCALE_KEY, EPSILON_KEY = "transformer_stream_scale", "transformer_layer_norm_epsilon"


def marian_settings(config: ModelConfig, rows: int) -> dict[str, Any]:
  """MarianConfig's values for the model (config.json): sizes, special ids, training's dropout."""
  return dict(
      architectures=["MarianMTModel"], vocab_size=config.vocab_size,
      decoder_vocab_size=config.vocab_size, max_position_embeddings=rows,
      d_model=config.d_model, encoder_layers=config.num_layers,
      decoder_layers=config.num_decoder_layers, encoder_attention_heads=config.num_heads,
      decoder_attention_heads=config.num_heads, encoder_ffn_dim=config.d_ff,
      decoder_ffn_dim=config.d_ff, activation_function=config.activation, scale_embedding=True,
      dropout=config.dropout, attention_dropout=config.attention_dropout,
      activation_dropout=config.activation_dropout,
      pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=config.start_id,
      decoder_start_token_id=config.start_id, forced_eos_token_id=EOS_ID,
      share_encoder_decoder_embeddings=True, tie_word_embeddings=True, is_encoder_decoder=True,
      **{STREAM_SCALE_KEY: stream_scale(config), EPSILON_KEY: config.layer_norm_epsilon})


def generation_settings(cfg: ml_collections.ConfigDict, config: ModelConfig, rows: int
                        ) -> dict[str, Any]:
  """GenerationConfig's values: the run's beam and length-penalty exponent, padding and the start
  token never written (as our searches forbid them), EOS forced at the last of `rows` output
  positions (as ours forces it at the limit), and the same stopping rule as ours ('never': a
  sentence is decided once no live hypothesis can beat the finished ones at the limit). Its penalty
  is length^alpha: a run with decode.length_penalty='fairseq' searches as ours does; of GNMT's
  ((5 + length) / 6)^alpha the exponent carries over, the formula cannot."""
  settings = dict(num_beams=cfg.decode.beam_size, length_penalty=float(cfg.decode.alpha),
                  early_stopping="never" if cfg.decode.beam_size > 1 else False,
                  max_length=rows + 1,  # the decoder start token counts, so `rows` output tokens
                  decoder_start_token_id=config.start_id, bos_token_id=config.start_id,
                  eos_token_id=EOS_ID, pad_token_id=PAD_ID, forced_eos_token_id=EOS_ID,
                  suppress_tokens=list(config.never_written))
  if cfg.decode.min_len:
    settings["min_new_tokens"] = cfg.decode.min_len
  return settings


def write_marian(directory: Path, cfg: ml_collections.ConfigDict, config: ModelConfig,
                 params: Any, vocab_file: Path, rows: int) -> None:
  """Writes the model, its configs and its tokenizer into `directory` (which exists). The
  tokenizer's two SentencePiece models are the run's one (both sides) or an imported run's two;
  vocab.json numbers the pieces by our ids."""
  from safetensors.numpy import save_file
  transformers = transformers_library()
  vocab = vocab_lib.load_vocab(vocab_file)
  save_file(marian_tensors(config, params, rows), str(directory / "model.safetensors"),
            metadata={"format": "pt"})
  transformers.MarianConfig(**marian_settings(config, rows)).save_pretrained(directory)
  transformers.GenerationConfig(**generation_settings(cfg, config, rows)).save_pretrained(directory)
  with tempfile.TemporaryDirectory() as scratch:
    models = []
    for name in ("source", "target"):
      models.append(Path(scratch) / f"{name}.spm")
      models[-1].write_bytes(marian_vocab.side(vocab, name).serialized_model_proto())
    pieces = Path(scratch) / "vocab.json"
    pieces.write_text(json.dumps({vocab.id_to_piece(i): i for i in range(vocab.get_piece_size())},
                                 ensure_ascii=False, indent=0))
    special = {"pad_token": vocab.id_to_piece(PAD_ID), "eos_token": vocab.id_to_piece(EOS_ID),
               "unk_token": vocab.id_to_piece(UNK_ID)}
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(models[0]), target_spm=str(models[1]), vocab=str(pieces),
        source_lang=cfg.data.src_lang, target_lang=cfg.data.tgt_lang,
        model_max_length=min(cfg.data.max_len, rows), **special)
    tokenizer.save_pretrained(directory)
