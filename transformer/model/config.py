"""The model's static description, read by the layers, the positional kinds, the export and the
counts: `ModelConfig`, and where a stack's layer parameters sit in the tree (`layer_params`). Its own
module so that the kinds (model/positions/) and the layers (transformer.py) both import it and
neither imports the other."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from transformer.tokens import BOS_ID, PAD_ID

# The feed-forward nonlinearities: the paper's ReLU; swish (SiLU, x * sigmoid(x): OPUS-MT's Marian
# models); GELU, exact (with erf, as Transformers' and CTranslate2's 'gelu').
ACTIVATIONS = ("relu", "swish", "gelu")
# The decoder's first input token: ours, BOS; or Marian's (OPUS-MT), the padding token.
DECODER_STARTS = {"bos": BOS_ID, "pad": PAD_ID}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Static model hyper-parameters (hashable, so jit can treat the model as a constant): a run
  config's `model` section (transformer/config.py documents each key and its default) and the
  vocabulary size. Build it with `from_config`."""
  vocab_size: int
  num_layers: int
  d_model: int
  d_ff: int
  num_heads: int
  d_k: int  # per-head query/key width; 0 = d_model / num_heads
  d_v: int  # per-head value width; 0 = d_model / num_heads
  dropout: float
  attention_dropout: float
  positional: str
  norm: str
  share_embeddings: bool
  max_len: int
  dtype: Any
  attention: str  # 'auto' | 'xla' | 'cudnn' | 'reference' (see attention_kernel)
  remat: str      # 'none' | 'full' | 'dots': what the backward pass recomputes per layer
  scan_layers: bool
  matmul_dtype: Any = None  # bf16: the products' inputs in it, sums not (training or decoding)
  vocab_matmul_dtype: Any = None  # the same for the projection onto the vocabulary alone (decoding)
  decoder_layers: int = 0   # 0 = num_layers, the paper's N for both stacks
  position_options: tuple[tuple[str, Any], ...] = ()  # the kinds' own keys (positions.option)
  activation: str = "relu"  # the feed-forward layers' nonlinearity, one of ACTIVATIONS
  output_bias: bool = False  # a learned per-word bias added to the logits
  decoder_start: str = "bos"  # the decoder's first input, a key of DECODER_STARTS
  layer_norm_epsilon: float = 1e-6  # added to the variance in every LayerNorm
  qkv_init_gain: float = 1.0  # the query, key and value projections' Glorot-uniform gain at init
  activation_dropout: float = 0.0  # dropout on the feed-forward layers' hidden units
  word_dropout: float = 0.0  # whole tokens' embeddings dropped, source and decoder inputs

  @property
  def num_decoder_layers(self) -> int:
    return self.decoder_layers or self.num_layers

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
    """Builds the model config from a run config's `model` section and the vocabulary size."""
    names = {f.name for f in dataclasses.fields(cls)}
    fields = names - {"vocab_size", "dtype", "matmul_dtype", "vocab_matmul_dtype", "position_options"}
    # The rest of the section is the positional kinds' own keys (config.py adds each kind's).
    options = tuple(sorted((key, model[key]) for key in model if key not in names))
    return cls(vocab_size=vocab_size, dtype=jnp.dtype(model.dtype),
               matmul_dtype=None if model.matmul_dtype == "float32" else jnp.dtype(model.matmul_dtype),
               position_options=options, **{name: model[name] for name in fields})

  @property
  def start_id(self) -> int:
    """The token the decoder reads at every target's position 0, whatever the input holds there."""
    return DECODER_STARTS[self.decoder_start]

  @property
  def never_written(self) -> tuple[int, ...]:
    """The ids no search writes: padding and the start token."""
    return tuple(sorted({PAD_ID, self.start_id}))

  @property
  def key_dim(self) -> int:
    return self.d_k or self.d_model // self.num_heads

  @property
  def value_dim(self) -> int:
    return self.d_v or self.d_model // self.num_heads


def layer_params(stack: dict[str, Any], i: int) -> dict[str, Any]:
  """Layer i's parameters of a stack's, unrolled ('layer_i') or scanned (stacked under 'layers')."""
  if "layers" in stack:
    return jax.tree.map(lambda x: x[i], stack["layers"])
  return stack[f"layer_{i}"]
