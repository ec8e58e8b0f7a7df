"""Write a trained run in the format of an inference engine, so the engine serves it unchanged.

    transformer-export --workdir=runs/m30k --format=ctranslate2 --output=runs/m30k/ctranslate2
    transformer-export --workdir=runs/m30k --format=ctranslate2 --output=ct2_int8 --quantization=int8
    transformer-export --workdir=runs/m30k --format=huggingface --output=runs/m30k_hf

`--format=ctranslate2` writes a CTranslate2 model directory (OpenNMT's C++ engine, what people
deploy Transformers with on CPUs and GPUs; `pip install -e '.[ctranslate2]'`) through its Python spec
API: the same layers (post- or pre-LayerNorm, ReLU feed-forward, biases, epsilon 1e-6), the shared
(or separate) embeddings scaled by sqrt(d_model), the positional encoding as its kind writes it
(positions/<kind>.py `export`: a table of `--max_positions` rows for sinusoidal or learned ones,
relative key/value embeddings, T5 biases, rotary; ALiBi is refused), the SentencePiece pieces as
both vocabularies, and vocab.model beside them for tokenizing. Sources get EOS appended by the
engine, as ours do.

`--format=huggingface` writes a Hugging Face Transformers Marian model (marian.py; `pip install -e
'.[huggingface]'`): weights, model and generation configs and tokenizer in one directory.

Either way the moving average is exported where the run keeps one (as transformer-eval scores it),
the raw parameters with --noema; what the format cannot hold is refused in one line before anything
is written, and the directory appears whole or not at all. docs/evaluating.md shows serving both.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from absl import app, flags

from transformer.cli import run_program
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.evaluation import marian
from transformer.files import writable_directory
from transformer.model import positions
from transformer.model.transformer import ModelConfig, layer_params
from transformer.tokens import EOS_ID, UNK_ID
from transformer.training import checkpoints
from transformer.training.workdir import load_run

log = logging.getLogger("transformer")
# model.activation -> CTranslate2's Activation (its GELU is the exact one, with erf)
CTRANSLATE2_ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}

FLAGS = flags.FLAGS
FORMATS = ("ctranslate2", "huggingface")
QUANTIZATIONS = ("none", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16")


def _ctranslate2():
  try:
    import ctranslate2  # noqa: F401  (an optional extra)
    from ctranslate2.specs import transformer_spec
  except ImportError:
    raise ConfigError("--format=ctranslate2 needs the ctranslate2 package: pip install -e "
                      "'.[ctranslate2]'") from None
  return transformer_spec


def _linear(spec, dense: dict[str, np.ndarray]) -> None:
  """A Dense layer (kernel [in, out]) as CTranslate2 stores it: weight [out, in], bias [out]."""
  spec.weight = np.ascontiguousarray(dense["kernel"].T)
  spec.bias = dense["bias"]


def _projection(spec, *denses: dict[str, np.ndarray]) -> None:
  """Head projections (kernel [D, H, K]) fused along their outputs: weight [sum H*K, D]."""
  spec.weight = np.concatenate([d["kernel"].reshape(d["kernel"].shape[0], -1).T for d in denses])
  spec.bias = np.concatenate([d["bias"].reshape(-1) for d in denses])


def _output(spec, dense: dict[str, np.ndarray]) -> None:
  """The attention output (kernel [H, K, D]) as weight [D, H*K]."""
  kernel = dense["kernel"]
  spec.weight = np.ascontiguousarray(kernel.reshape(-1, kernel.shape[-1]).T)
  spec.bias = dense["bias"]


def _norm(spec, norm: dict[str, np.ndarray]) -> None:
  spec.gamma, spec.beta = norm["scale"], norm["bias"]


def _attention(spec, params: dict[str, Any], norm: dict[str, np.ndarray], self_attention: bool
               ) -> None:
  _norm(spec.layer_norm, norm)
  if self_attention:  # CTranslate2: [q; k; v] then out
    _projection(spec.linear[0], params["query"], params["key"], params["value"])
    _output(spec.linear[1], params["out"])
  else:  # q, then [k; v] of the encoder output, then out
    _projection(spec.linear[0], params["query"])
    _projection(spec.linear[1], params["key"], params["value"])
    _output(spec.linear[2], params["out"])


def _feed_forward(spec, params: dict[str, Any], norm: dict[str, np.ndarray]) -> None:
  _norm(spec.layer_norm, norm)
  _linear(spec.linear_0, params["wi"])
  _linear(spec.linear_1, params["wo"])


def check_rows(config: ModelConfig, rows: int) -> None:
  """A stored position table of `rows` rows must be one, and fit in the kind's own (a learned
  table's)."""
  if rows <= 0:
    raise ConfigError(f"--max_positions must be a positive number of rows (the longest input and "
                      f"output the engine takes, end token included), got {rows}")
  longest = positions.get(config.positional).longest(config)
  if longest is not None and rows > longest:
    raise ConfigError(f"--max_positions={rows} is past the {config.positional} position table "
                      f"({longest} rows, config.model.max_len)")


def check_ctranslate2(config: ModelConfig) -> None:
  """What CTranslate2 cannot hold, refused before its package is asked for or anything is read."""
  if config.key_dim != config.value_dim:
    raise ConfigError(f"CTranslate2 needs d_k = d_v; this model has {config.key_dim} and "
                      f"{config.value_dim}")
  if not positions.in_ctranslate2(config.positional):
    raise ConfigError(positions.ctranslate2_refusal(config.positional))


def ctranslate2_spec(config: ModelConfig, params: Any, pieces: list[str], max_positions: int,
                     quantization: str = "none"):
  """The CTranslate2 TransformerSpec of a model with `params` and vocabulary `pieces`, checked and
  with its weights stored as `quantization` says: ready to `save`."""
  check_ctranslate2(config)
  spec_lib = _ctranslate2()
  check_rows(config, max_positions)
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  pre_norm = config.norm == "pre"
  head_dim = config.key_dim if config.key_dim * config.num_heads != config.d_model else None
  kind = positions.get(config.positional)
  encoder_options, decoder_options = kind.export_options(config)
  activation = getattr(spec_lib.common_spec.Activation, CTRANSLATE2_ACTIVATIONS[config.activation])
  encoder = spec_lib.TransformerEncoderSpec(config.num_layers, config.num_heads, pre_norm=pre_norm,
                                            head_dim=head_dim, activation=activation,
                                            **encoder_options)
  decoder = spec_lib.TransformerDecoderSpec(config.num_decoder_layers, config.num_heads,
                                            pre_norm=pre_norm, head_dim=head_dim,
                                            activation=activation, **decoder_options)
  if config.share_embeddings:
    source_embed = target_embed = output_embed = params["embed"]["embedding"]
  else:
    source_embed = params["source_embed"]["embedding"]
    target_embed = params["target_embed"]["embedding"]
    output_embed = params["decoder"]["output_embedding"]
  for stack_spec, name, embedding in ((encoder, "encoder", source_embed),
                                      (decoder, "decoder", target_embed)):
    stack = params[name]
    embeddings = stack_spec.embeddings[0] if name == "encoder" else stack_spec.embeddings
    embeddings.weight = embedding
    if pre_norm:
      _norm(stack_spec.layer_norm, stack["final_norm"])
    for i, layer_spec in enumerate(stack_spec.layer):
      layer = layer_params(stack, i)
      _attention(layer_spec.self_attention, layer["self_attention"], layer["self_attention_norm"],
                 self_attention=True)
      if name == "decoder":
        _attention(layer_spec.attention, layer["cross_attention"], layer["cross_attention_norm"],
                   self_attention=False)
      _feed_forward(layer_spec.ffn, layer["ffn"], layer["ffn_norm"])
  decoder.projection.weight = output_embed
  if config.output_bias:
    decoder.projection.bias = params["decoder"]["output_bias"]
  kind.export(config, params, encoder, decoder, max_positions)
  spec = spec_lib.TransformerSpec(encoder, decoder)
  spec.config.layer_norm_epsilon = config.layer_norm_epsilon
  spec.config.add_source_eos = True
  spec.config.decoder_start_token = pieces[config.start_id]
  spec.config.bos_token, spec.config.eos_token = pieces[config.start_id], pieces[EOS_ID]
  spec.config.unk_token = pieces[UNK_ID]
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  spec.validate()
  spec.optimize(quantization=None if quantization == "none" else quantization)
  return spec


def _tokenizer_names(workdir: str | Path) -> tuple[str, ...]:
  """The SentencePiece models a CTranslate2 export holds: the run's one, or an import's two."""
  marian_run = vocab_lib.run_vocab_path(workdir).name == vocab_lib.MARIAN_VOCAB_FILE
  return ("source.spm", "target.spm") if marian_run else (vocab_lib.VOCAB_FILE,)


def _tokenizer_files(vocab: Any, path: Path, out: Path) -> None:
  """Copies the run's SentencePiece model(s) beside a CTranslate2 model (`_tokenizer_names`)."""
  if path.name == vocab_lib.VOCAB_FILE:
    shutil.copyfile(path, out / vocab_lib.VOCAB_FILE)
    return
  for name, side in (("source.spm", vocab.source), ("target.spm", vocab.target)):
    (out / name).write_bytes(side.serialized_model_proto())


def default_max_positions(cfg) -> int:
  """Rows of the position table: the longest output our own search writes (source limit + the
  output allowance), or the learned table."""
  longest = positions.get(cfg.model.positional).longest(ModelConfig.from_config(cfg.model, cfg.data.vocab_size))
  return longest if longest is not None else cfg.data.max_len + cfg.decode.max_extra_len


def check_new(output: Path, flag: str = "--output") -> None:
  """`output` (given by `flag`) must be new or empty, and its parent writable."""
  if output.exists() and (not output.is_dir() or any(output.iterdir())):
    raise ConfigError(f"{flag}={output} exists and is not empty; choose a new directory")
  writable_directory(output.parent, flag, create=False)  # where it is staged


@contextlib.contextmanager
def staged(output: str | Path, flag: str = "--output") -> Iterator[Path]:
  """A scratch directory beside `output` to write into; it becomes `output` when the block ends
  without an error and is removed when it raises. `output` must be new or empty."""
  output = Path(output)
  check_new(output, flag)
  staging = output.with_name(output.name + ".partial")
  shutil.rmtree(staging, ignore_errors=True)
  staging.mkdir(parents=True)
  try:
    yield staging
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  if output.exists():
    output.rmdir()  # empty, checked above
  staging.replace(output)


def warn_of_text_form(cfg) -> None:
  """An exported engine reads what the run read: say so where that is not raw text."""
  if cfg.data.get("pretokenize", "none") != "none":
    log.warning("this run reads and writes Multi30k's lowercased, tokenized text "
                "(data.pretokenize=%r): the exported model does too; give it "
                "transformer.data.pretokenize.multi30k_tokenize(sentence, lang) and detokenize its "
                "output (pretokenize.detokenize), as transformer-translate does",
                cfg.data.pretokenize)


def export_ctranslate2(workdir: str | Path, output: str | Path, step: int | None = None,
                       average_last: int = 1, ema: bool = True, quantization: str = "none",
                       max_positions: int | None = None) -> Path:
  """Writes the run's checkpoint (or average) as a CTranslate2 model directory `output`."""
  check_new(Path(output))
  cfg = checkpoints.load_run_config(Path(workdir))
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  check_ctranslate2(config)
  rows = default_max_positions(cfg) if max_positions is None else max_positions
  check_rows(config, rows)
  _ctranslate2()
  warn_of_text_form(cfg)
  with staged(output) as staging:
    run = load_run(workdir, step, average_last)
    pieces = [run.vocab.id_to_piece(i) for i in range(run.vocab.get_piece_size())]
    spec = ctranslate2_spec(run.model.config, run.params(ema), pieces, rows, quantization)
    spec.save(str(staging))
    _tokenizer_files(run.vocab, vocab_lib.run_vocab_path(workdir), staging)
  return Path(output)


def export_huggingface(workdir: str | Path, output: str | Path, step: int | None = None,
                       average_last: int = 1, ema: bool = True,
                       max_positions: int | None = None) -> Path:
  """Writes the run's checkpoint (or average) as a Hugging Face Marian model directory `output`."""
  check_new(Path(output))
  cfg = checkpoints.load_run_config(Path(workdir))
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  marian.check_marian(config)  # before the checkpoint is read or anything written
  marian.transformers_library()
  rows = default_max_positions(cfg) if max_positions is None else max_positions
  check_rows(config, rows)
  if warning := marian.resave_warning(config):
    log.warning("%s", warning)
  warn_of_text_form(cfg)
  with staged(output) as staging:
    run = load_run(workdir, step, average_last)
    marian.write_marian(staging, run.config, run.model.config, run.params(ema),
                        vocab_lib.run_vocab_path(workdir), rows)
  return Path(output)


def main(argv: list[str]) -> None:
  if FLAGS.workdir is None or FLAGS.output is None:
    raise app.UsageError("pass --workdir=DIR (a training workdir) and --output=NEW_DIR")
  common = dict(step=FLAGS.step, average_last=FLAGS.average_last, ema=FLAGS.ema,
                max_positions=FLAGS.max_positions)
  if FLAGS.format == "huggingface":
    if FLAGS.quantization != "none":
      raise app.UsageError("--quantization applies to --format=ctranslate2 only; Transformers "
                           "quantizes at load time (its own options)")
    out = export_huggingface(FLAGS.workdir, FLAGS.output, **common)
    print(f"wrote a Hugging Face Marian model to {out}; load it with MarianMTModel.from_pretrained"
          f"('{out}') and MarianTokenizer.from_pretrained('{out}') and translate with its "
          f"generate() (docs/evaluating.md)")
    return
  out = export_ctranslate2(FLAGS.workdir, FLAGS.output, quantization=FLAGS.quantization, **common)
  tokenizers = " and ".join(str(out / name) for name in _tokenizer_names(FLAGS.workdir))
  print(f"wrote a CTranslate2 model to {out}; serve it with ctranslate2.Translator('{out}') and "
        f"tokenize with {tokenizers} (docs/evaluating.md)")


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_string("workdir", None, "Training workdir to export.")
  flags.DEFINE_enum("format", "ctranslate2", list(FORMATS), "What to write: a CTranslate2 "
                    "model directory, or a Hugging Face Transformers Marian model (huggingface).")
  flags.DEFINE_string("output", None, "New directory to write the model to.")
  flags.DEFINE_integer("step", None, "The checkpoint at this step (default: the latest).")
  flags.DEFINE_integer("average_last", 1, "Export the mean of the last N checkpoints.")
  flags.DEFINE_bool("ema", True, "Export the moving average of the parameters where the run keeps "
                    "one (what transformer-eval scores first); --noema: the raw parameters.")
  flags.DEFINE_enum("quantization", "none", list(QUANTIZATIONS), "--format=ctranslate2: weights "
                    "as CTranslate2 stores them (its compute_type at load time can differ).")
  flags.DEFINE_integer("max_positions", None, "Rows of the stored position table: the longest "
                       "output the engine can write, end token included (default: "
                       "config.data.max_len + config.decode.max_extra_len; the table's size for "
                       "learned positions).")
  run_program("transformer-export", main, compilation_cache=False)


if __name__ == "__main__":
  run()
