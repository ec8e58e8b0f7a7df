"""Attention maps and positional encodings of a trained model, drawn as PNG heatmaps.

    transformer-attention-maps --workdir=runs/m30k --source="A man is riding a bicycle."
    transformer-attention-maps --workdir=runs/m30k --source="A dog runs." --target="Ein Hund rennt."

Runs the checkpoint teacher-forced on one sentence pair (without --target, the target is the model's
own translation, by the config's beam search) with Flax's 'intermediates' collection mutable, so
every attention layer records its weights (model.MultiHeadAttention). Writes to --output_dir
(default WORKDIR/attention): one grid per kind of attention (rows = layers, columns = heads) —
encoder self-attention, decoder self-attention (causal) and encoder-decoder (cross) attention —
every head on its own in heads/, the positional encodings (the sinusoidal table, or the learned tables
and their cosine-similarity matrices), and attention.npz with the numbers. Axes are labelled with the
SentencePiece pieces ('▁' starts a word): source pieces and </s>; on the decoder side the decoder's
inputs, <s> and the target pieces (row t is the position that predicts target piece t + 1).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from transformer.data import marian_vocab, pretokenize  # noqa: E402
from transformer.errors import ConfigError  # noqa: E402
from transformer.files import writable_directory  # noqa: E402
from transformer.model import positions as positional  # noqa: E402
from transformer.model.transformer import (  # noqa: E402
  EOS_ID,
  ModelConfig,
  Transformer,
  shift_right,
)

FLAGS = flags.FLAGS
log = logging.getLogger("transformer")

# kind -> (stack, attention module, title, query axis, key axis)
KINDS = {
    "encoder_self_attention": ("encoder", "self_attention", "Encoder self-attention",
                               "source (query)", "source (key)"),
    "decoder_self_attention": ("decoder", "self_attention", "Decoder self-attention (causal)",
                               "decoder input (query)", "decoder input (key)"),
    "cross_attention": ("decoder", "cross_attention", "Encoder-decoder attention",
                        "decoder input (query)", "source (key)"),
}


@dataclasses.dataclass
class AttentionMaps:
  """Attention weights of one sentence pair: weights[kind] is [layers, heads, queries, keys]."""
  source_tokens: list[str]
  decoder_tokens: list[str]
  weights: dict[str, np.ndarray]

  def axes_tokens(self, kind: str) -> tuple[list[str], list[str]]:
    """(query tokens, key tokens) of a kind of attention."""
    queries = self.source_tokens if kind == "encoder_self_attention" else self.decoder_tokens
    keys = self.decoder_tokens if kind == "decoder_self_attention" else self.source_tokens
    return queries, keys


def attention_maps(model: Transformer, params: Any, source_ids: list[int], target_ids: list[int],
                   pieces: list[str]) -> AttentionMaps:
  """Teacher-forced attention weights for one pair of id sequences (each ending in EOS).

  `pieces` maps ids to the strings the axes show.
  """
  src = jnp.asarray([source_ids], jnp.int32)
  tgt = jnp.asarray([target_ids], jnp.int32)
  apply = jax.jit(lambda p, s, t: model.apply({"params": p}, s, shift_right(t),
                                              mutable=["intermediates"])[1]["intermediates"])
  recorded = jax.device_get(apply(params, src, tgt))
  weights = {kind: _per_layer(recorded[stack], module, model.config)
             for kind, (stack, module, *_) in KINDS.items()}
  decoder_inputs = np.asarray(shift_right(tgt))[0].tolist()
  decoder_inputs[0] = model.config.start_id  # what the decoder reads there (Marian's: padding)
  return AttentionMaps([pieces[i] for i in source_ids], [pieces[i] for i in decoder_inputs], weights)


def _per_layer(stack: dict, module: str, config: ModelConfig) -> np.ndarray:
  """[layers, heads, queries, keys] of one sentence from a stack's recorded intermediates: one entry
  per layer ('layer_0', ...), or one stacked entry ('layers') with scan_layers."""
  if config.scan_layers:
    return np.asarray(stack["layers"][module]["attention_weights"][0])[:, 0]
  depth = sum(name.startswith("layer_") for name in stack)  # the encoder's and decoder's may differ
  return np.stack([np.asarray(stack[f"layer_{i}"][module]["attention_weights"][0])[0]
                   for i in range(depth)])


# ---------------------------------------------------------------------------------------- figures

def _panel(ax: plt.Axes, weights: np.ndarray, queries: list[str], keys: list[str], fontsize: float):
  image = ax.imshow(weights, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
  ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=fontsize)
  ax.set_yticks(range(len(queries)), queries, fontsize=fontsize)
  return image


def attention_grid(maps: AttentionMaps, kind: str) -> plt.Figure:
  """Every layer (rows) and head (columns) of one kind; tokens on the outer panels' axes."""
  title, query_label, key_label = KINDS[kind][2:]
  weights = maps.weights[kind]
  layers, heads = weights.shape[:2]
  queries, keys = maps.axes_tokens(kind)
  side = max(2.6, 0.17 * max(len(queries), len(keys)) + 1.2)
  fig, axes = plt.subplots(layers, heads, figsize=(side * heads + 1.5, side * layers + 0.8),
                           squeeze=False, layout="constrained")
  for layer in range(layers):
    for head in range(heads):
      ax = axes[layer, head]
      image = _panel(ax, weights[layer, head], queries, keys, fontsize=6)
      ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
      ax.set_xlabel(key_label, fontsize=8)
      ax.set_ylabel(query_label, fontsize=8)
      ax.label_outer()
  fig.colorbar(image, ax=axes, shrink=0.5, label="attention weight")
  fig.suptitle(title)
  return fig


def head_figure(maps: AttentionMaps, kind: str, layer: int, head: int) -> plt.Figure:
  """One head, large, with every token labelled."""
  title, query_label, key_label = KINDS[kind][2:]
  queries, keys = maps.axes_tokens(kind)
  side = max(4.0, 0.28 * max(len(queries), len(keys)) + 1.5)
  fig, ax = plt.subplots(figsize=(side + 1.2, side), layout="constrained")
  image = _panel(ax, maps.weights[kind][layer, head], queries, keys, fontsize=8)
  ax.set_xlabel(key_label)
  ax.set_ylabel(query_label)
  ax.set_title(f"{title}, layer {layer + 1}, head {head + 1}", fontsize=10)
  fig.colorbar(image, ax=ax, shrink=0.7, label="attention weight")
  return fig


def positional_tables(params: Any, config: ModelConfig, positions: int
                      ) -> dict[str, positional.Drawing]:
  """{name: what to draw}: what the kind declares (positions/base.py `drawings`): an added table
  (position x dimension), a per-head bias by offset, rotation angles, learned relative embeddings."""
  return positional.get(config.positional).drawings(config, params, positions)


def positional_figure(tables: dict[str, positional.Drawing]) -> plt.Figure:
  """Per drawing: the array itself, and where it is a table of positions, the cosine similarity of
  every pair of positions, where neighbours should look alike and far positions less so."""
  if not tables:  # a kind without position information ('none')
    fig, ax = plt.subplots(figsize=(6, 2), layout="constrained")
    ax.text(0.5, 0.5, "no position information", ha="center", va="center")
    ax.axis("off")
    return fig
  fig, axes = plt.subplots(len(tables), 2, figsize=(12, 5 * len(tables)), squeeze=False,
                           layout="constrained")
  for row, (name, drawing) in enumerate(tables.items()):
    table = drawing.values
    limit = float(np.nanmax(np.abs(table))) or 1.0
    image = axes[row, 0].imshow(table, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto",
                                interpolation="nearest")
    axes[row, 0].set(xlabel=drawing.columns, ylabel=drawing.rows, title=name)
    fig.colorbar(image, ax=axes[row, 0], shrink=0.8)
    if not drawing.similarity:
      axes[row, 1].axis("off")
      continue
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-9)
    image = axes[row, 1].imshow(unit @ unit.T, cmap="RdBu_r", vmin=-1.0, vmax=1.0,
                                interpolation="nearest")
    axes[row, 1].set(xlabel="position", ylabel="position",
                     title=f"{name}: cosine similarity between positions")
    fig.colorbar(image, ax=axes[row, 1], shrink=0.8)
  return fig


def write_figures(maps: AttentionMaps, tables: dict[str, positional.Drawing], output_dir: Path
                  ) -> list[Path]:
  """All the PNGs and attention.npz; returns the paths written."""
  heads_dir = output_dir / "heads"
  heads_dir.mkdir(parents=True, exist_ok=True)
  written = []

  def save(fig: plt.Figure, path: Path) -> None:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

  for kind, weights in maps.weights.items():
    save(attention_grid(maps, kind), output_dir / f"{kind}.png")
    for layer in range(weights.shape[0]):
      for head in range(weights.shape[1]):
        save(head_figure(maps, kind, layer, head),
             heads_dir / f"{kind}_layer{layer + 1}_head{head + 1}.png")
  save(positional_figure(tables), output_dir / "positional_encoding.png")
  np.savez(output_dir / "attention.npz", source_tokens=maps.source_tokens,
           decoder_tokens=maps.decoder_tokens, **maps.weights)
  written.append(output_dir / "attention.npz")
  return written


# ---------------------------------------------------------------------------------- command line

def token_ids(vocab, text: str, what: str, max_len: int) -> list[int]:
  """Ids of `text` (`what`: 'source' or 'target', the side's SentencePiece model) and EOS; an
  over-long text is an error."""
  ids = marian_vocab.side(vocab, what).encode(text) + [EOS_ID]
  if len(ids) > max_len:
    raise ConfigError(f"--{what} is {len(ids)} tokens long (with </s>); this model's runs take at "
                      f"most {max_len} (config.data.max_len): pass a shorter sentence")
  return ids


def visualize(workdir: str, source: str, target: str | None = None, step: int | None = None,
              output_dir: str | None = None) -> tuple[AttentionMaps, list[Path], int]:
  """Attention maps of `workdir`'s checkpoint for one sentence; returns them, the files and step."""
  from transformer.decoding import translator
  from transformer.training.workdir import load_run
  out = Path(output_dir) if output_dir else Path(workdir) / "attention"
  writable_directory(out, "--output_dir", create=False)  # before the model is loaded
  run = load_run(workdir, step)
  cfg, vocab, model, params, steps = run.config, run.vocab, run.model, run.params(), run.steps
  if not source.strip():
    raise ConfigError("--source is empty; pass a sentence, e.g. --source=\"A man is riding a "
                      "bicycle.\"")
  form = pretokenize.text_form(cfg.data)  # the text the run reads: sentences go in its form
  source_ids = token_ids(vocab, form.source([source])[0], "source", cfg.data.max_len)
  if target is None:
    target = translator.translate(model, params, vocab, [source],
                                  translator.SearchSettings.from_config(cfg),
                                  max_source_len=cfg.data.max_len, text_form=form).hypotheses[0]
    log.info("Translation by the checkpoint at step %d: %s", steps[-1], target)
    if not target.strip():
      raise ConfigError(f"the checkpoint at step {steps[-1]} translates the source to an empty "
                        "sentence; pass --target=\"...\" to draw the attention of a translation")
  elif not target.strip():
    raise ConfigError("--target is empty; pass the translation to draw, or leave --target out to "
                      "draw the model's own")
  target_ids = token_ids(vocab, form.target([target])[0], "target", cfg.data.max_len)
  pieces = [vocab.id_to_piece(i) for i in range(vocab.get_piece_size())]
  pieces[EOS_ID], pieces[model.config.start_id] = "</s>", "<s>"
  maps = attention_maps(model, params, source_ids, target_ids, pieces)
  tables = positional_tables(params, model.config, min(cfg.data.max_len, model.config.max_len))
  return maps, write_figures(maps, tables, out), steps[-1]


def main(argv: list[str]) -> None:
  if FLAGS.workdir is None or FLAGS.source is None:
    raise app.UsageError("pass --workdir=DIR (a training workdir) and --source=\"a sentence\"")
  maps, files, step = visualize(FLAGS.workdir, FLAGS.source, FLAGS.target, FLAGS.step,
                                FLAGS.output_dir)
  grids = [f for f in files if f.parent.name != "heads"]
  print(f"step {step}: {len(maps.source_tokens)} source x {len(maps.decoder_tokens)} target tokens; "
        f"wrote {len(files)} files to {grids[0].parent}:")
  for path in grids:
    print(f"  {path.name}")
  print(f"  heads/ ({len(files) - len(grids)} files: <kind>_layer<L>_head<H>.png)")


def run() -> None:
  """Console-script entry point."""
  from transformer.cli import run_program
  flags.DEFINE_string("workdir", None, "Training (or transformer-average) workdir.")
  flags.DEFINE_string("source", None, "The source sentence.")
  flags.DEFINE_string("target", None, "Its translation (default: the model's own, by beam search).")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_string("output_dir", None, "Where the figures go (default: WORKDIR/attention).")
  run_program("transformer-attention-maps", main)


def run_deprecated() -> None:
  """The program's old name, transformer-attention, still works for now."""
  from transformer.cli import deprecated
  deprecated("transformer-attention", "transformer-attention-maps")
  run()


if __name__ == "__main__":
  run()
