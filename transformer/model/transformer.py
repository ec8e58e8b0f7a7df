"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in Flax linen.

Read top to bottom: config, positions, attention, feed-forward, encoder and decoder layers, the stacks,
and the encoder-decoder model. Shapes use B batch, S source length, T target length, D d_model,
H heads, K = d_k (queries and keys) and d_v (values) per head, D / H unless set, V vocabulary.

Faithful to the paper by default: post-LayerNorm residual blocks, sinusoidal positions, one matrix shared
by the source embedding, the target embedding and the pre-softmax projection, embeddings scaled by
sqrt(D), dropout on embeddings and on every sub-layer's output, ReLU feed-forward. Masks are applied
with `where`; attention logits, softmax and output logits are float32 whatever the activation dtype.
For decoding, the decoder advances G hypotheses of every sentence by one position per call, reading
and writing an autoregressive key/value cache (kv_cache.py) in the 'cache' collection.

Every parameter carries logical axis names ('vocab', 'embed', 'heads', 'kv', 'mlp', ...) and activations
are constrained to logical layouts ('batch', 'length', 'act_embed', ...); partitioning.py maps both to
mesh axes, so data, fsdp and tensor parallelism need no change here. Outside a mesh the names are inert.
Speed options, all off or automatic by default: attention through `jax.nn.dot_product_attention`
(cuDNN flash attention on GPUs), per-layer rematerialisation, and one `nn.scan` over the layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import partitioning
from transformer.model import kv_cache
from transformer.model import positions as positional
from transformer.model.attention import SEQUENCE, Keys, attention, attention_kernel
from transformer.model.config import ModelConfig, layer_params  # noqa: F401  (re-exported)
from transformer.model.low_precision import low_precision_dot_general
from transformer.model.vocab_projection import SEARCH_MATRIX, output_logits, search_logits
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401  (re-exported)

# --------------------------------------------------------------------------------------------- masks

def source_mask(src: jax.Array) -> jax.Array:
  """[B, 1, 1, S]: True at real (non-padding) source positions."""
  return (src != PAD_ID)[:, None, None, :]


def causal_mask(tgt: jax.Array) -> jax.Array:
  """[B, 1, T, T]: True where the key position is not after the query position."""
  return nn.make_causal_mask(tgt, dtype=jnp.bool_)


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """[B, 1, T, S]: True where query and key belong to the same packed pair (segment ids > 0)."""
  same = query_segments[:, None, :, None] == key_segments[:, None, None, :]
  return same & (key_segments != 0)[:, None, None, :]


def default_positions(tokens: jax.Array, positions: jax.Array | None) -> jax.Array:
  """Positions 0, 1, 2, ... along each row unless given (packed rows restart at every segment)."""
  return jnp.arange(tokens.shape[1])[None, :] if positions is None else positions


# ----------------------------------------------------------------------------------------- attention

def _init(init: Callable, *axes: str) -> Callable:
  """An initializer whose parameter carries logical axis names (partitioning.py maps them to the mesh)."""
  return nn.with_logical_partitioning(init, axes)


# Glorot-uniform on the flattened (fan_in, fan_out) kernel, as DenseGeneral initialises it.
_dense_init = nn.initializers.xavier_uniform()
_zeros = nn.initializers.zeros_init()


def _qkv_init(cfg: ModelConfig) -> Callable:
  """Glorot-uniform scaled by cfg.qkv_init_gain (its variance by the square): fairseq's projections."""
  gain = cfg.qkv_init_gain
  return _dense_init if gain == 1 else nn.initializers.variance_scaling(gain ** 2, "fan_avg", "uniform")


def constrain(x: jax.Array, *axes: str | None) -> jax.Array:
  """Pins an activation's layout by logical axis names (a no-op unless a mesh is set, and inside
  shard_map, where each device computes its own part: decoding's per-device loops)."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.are_all_axes_manual:
    return x
  return nn.with_logical_constraint(x, axes, rules=partitioning.RULES)


class MultiHeadAttention(nn.Module):
  """Multi-head attention: H heads of d_k-wide queries and keys and d_v-wide values (D / H by default).

  `cache` selects decoding behaviour (kv_cache.py): None (full sequences), 'self' (inputs are
  [B, G, D]: one new position `step` for each of G hypotheses per sentence, attending over the
  cache of `decode_len` positions), 'cross' (keys and values of the encoder output are projected on
  the first call and reused). Applied with the
  'intermediates' collection mutable, outside decoding, it also records its attention weights
  [B,H,T,S] there ('attention_weights', read by attention_maps.py); otherwise that costs nothing.
  With `relate` (self-attention) the positional encoding acts on it (positions/base.py: `attend`,
  given what its `prepare` computed for the stack).
  """
  config: ModelConfig
  relate: bool = False

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array, mask: jax.Array | None, *,
               deterministic: bool, cache: str | None = None, decode_len: int = 0,
               step: jax.Array | None = None, prepared: Any = None) -> jax.Array:
    cfg = self.config
    heads = cfg.num_heads
    project = lambda name, depth: nn.DenseGeneral(
        (heads, depth), dtype=cfg.dtype, name=name, dot_general=matmul(cfg),
        kernel_init=_init(_qkv_init(cfg), "embed", "heads", "kv"), bias_init=_init(_zeros, "heads", "kv"))
    query = project("query", cfg.key_dim)(inputs_q)
    key_proj, value_proj = project("key", cfg.key_dim), project("value", cfg.value_dim)
    if cache == "cross":
      out = kv_cache.cross_attention(self, query, key_proj, value_proj, inputs_kv, mask)
    else:
      key, value = key_proj(inputs_kv), value_proj(inputs_kv)
      terms = (positional.get(cfg.positional).attend(self, cfg, query, key, prepared)
               if self.relate else positional.Terms(query, key))
      if cache == "self":
        out = kv_cache.self_attention(self, terms.query, terms.key, value, mask, step, decode_len,
                                      terms)
      else:
        query, key, value = (constrain(x, "batch", "length", "act_heads", "kv")
                             for x in (terms.query, terms.key, value))
        out = self._full_sequence(query, key, value, mask, deterministic, terms)
    return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), dtype=cfg.dtype, name="out",
                           dot_general=matmul(cfg),
                           kernel_init=_init(_dense_init, "heads", "kv", "embed"),
                           bias_init=_init(_zeros, "embed"))(out)

  def _full_sequence(self, query: jax.Array, key: jax.Array, value: jax.Array,
                     mask: jax.Array | None, deterministic: bool, terms: positional.Terms
                     ) -> jax.Array:
    """Attention over whole sequences: ours (with attention dropout, or terms by distance), XLA's
    or cuDNN's kernel (which take the positions' bias)."""
    cfg = self.config
    with_dropout = not deterministic and cfg.attention_dropout > 0.0
    kernel = attention_kernel(cfg, with_dropout or terms.distances is not None)
    if kernel == "reference" or self.is_mutable_collection("intermediates"):
      dropout = lambda w: nn.Dropout(cfg.attention_dropout)(w, deterministic=not with_dropout)
      block = Keys(key, value, mask, bias=terms.bias, distances=terms.distances,
                   distance_scores=terms.distance_scores, value_embeddings=terms.value_embeddings)
      out, weights = attention(query, [block], SEQUENCE, dropout)
      if self.is_mutable_collection("intermediates"):
        self.sow("intermediates", "attention_weights", weights)
      if kernel == "reference":
        return out
    if mask is not None:  # cuDNN wants the query axis spelled out; XLA broadcasts either way
      mask = jnp.broadcast_to(mask, (*mask.shape[:2], query.shape[1], key.shape[1]))
    return jax.nn.dot_product_attention(query, key, value, bias=terms.bias, mask=mask,
                                        implementation=kernel)


# ------------------------------------------------------------------------------------------- layers


ACTIVATION_FUNCTIONS = {"relu": nn.relu, "swish": nn.silu,
                        "gelu": lambda x: nn.gelu(x, approximate=False)}


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, or swish or GELU for max(0, .) (`activation`), with
  `activation_dropout` on the hidden units while training (none in the paper)."""
  config: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    x = nn.Dense(cfg.d_ff, dtype=cfg.dtype, name="wi", kernel_init=_init(_dense_init, "embed", "mlp"),
                 bias_init=_init(_zeros, "mlp"), dot_general=matmul(cfg))(x)
    x = constrain(ACTIVATION_FUNCTIONS[cfg.activation](x), "batch", "length", "act_mlp")
    # Named, and built only when on: the other dropout layers keep their names, so their masks
    # are a run's without it (as drop_words).
    if cfg.activation_dropout and not self.deterministic:
      x = nn.Dropout(cfg.activation_dropout, name="activation_dropout")(x, deterministic=False)
    return nn.Dense(cfg.d_model, dtype=cfg.dtype, name="wo", kernel_init=_init(_dense_init, "mlp", "embed"),
                    bias_init=_init(_zeros, "embed"), dot_general=matmul(cfg))(x)


def matmul(config: ModelConfig) -> Callable:
  """The layers' matrix product: lax.dot_general, or with `matmul_dtype` (bf16) its operands in
  that dtype and its sums in the activation dtype, forward and backward (low_precision.py), so only the
  products' inputs are rounded (on CPUs with AMX or AVX512-BF16 several times the float32 speed)."""
  if config.matmul_dtype is None:
    return jax.lax.dot_general
  def dot_general(x, kernel, dimensions, precision=None, preferred_element_type=None):
    return low_precision_dot_general(x, kernel, dimensions, config.matmul_dtype)
  return dot_general


def residual(config: ModelConfig, x: jax.Array, sublayer: Callable[[jax.Array], jax.Array],
             norm: nn.LayerNorm, deterministic: bool) -> jax.Array:
  """Post-LN: LayerNorm(x + Dropout(f(x))), as in the paper; pre-LN: x + Dropout(f(LayerNorm(x)))."""
  drop = lambda y: nn.Dropout(config.dropout)(y, deterministic=deterministic)
  if config.norm == "pre":
    return x + drop(sublayer(norm(x)))
  return norm(x + drop(sublayer(x)))


def _layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=config.layer_norm_epsilon, dtype=config.dtype, name=name,
                      scale_init=_init(nn.initializers.ones_init(), "embed"),
                      bias_init=_init(_zeros, "embed"))


class EncoderLayer(nn.Module):
  config: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, prepared: Any = None) -> jax.Array:
    cfg, deterministic = self.config, self.deterministic
    attend = MultiHeadAttention(cfg, relate=True, name="self_attention")
    x = residual(cfg, x, lambda y: attend(y, y, mask, deterministic=deterministic, prepared=prepared),
                 _layer_norm(cfg, "self_attention_norm"), deterministic)
    x = residual(cfg, x, FeedForward(cfg, deterministic, name="ffn"), _layer_norm(cfg, "ffn_norm"),
                 deterministic)
    return constrain(x, "batch", "length", "act_embed")


class DecoderLayer(nn.Module):
  config: ModelConfig
  deterministic: bool = True
  decode: bool = False
  decode_len: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, encoded: jax.Array, self_mask: jax.Array | None,
               cross_mask: jax.Array, step: jax.Array | None = None, prepared: Any = None
               ) -> jax.Array:
    cfg, deterministic = self.config, self.deterministic
    self_attend = MultiHeadAttention(cfg, relate=True, name="self_attention")
    cross_attend = MultiHeadAttention(cfg, name="cross_attention")
    x = residual(cfg, x, lambda y: self_attend(y, y, self_mask, deterministic=deterministic,
                                               cache="self" if self.decode else None,
                                               decode_len=self.decode_len, step=step,
                                               prepared=prepared),
                 _layer_norm(cfg, "self_attention_norm"), deterministic)
    x = residual(cfg, x, lambda y: cross_attend(y, encoded, cross_mask, deterministic=deterministic,
                                                cache="cross" if self.decode else None),
                 _layer_norm(cfg, "cross_attention_norm"), deterministic)
    x = residual(cfg, x, FeedForward(cfg, deterministic, name="ffn"), _layer_norm(cfg, "ffn_norm"),
                 deterministic)
    return constrain(x, "batch", "length", "act_embed")


# ------------------------------------------------------------------------------------------- stacks

REMAT_POLICIES = {  # what a rematerialised layer keeps for the backward pass
    "full": None,  # nothing: the whole layer is recomputed
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # matmul outputs
}


def stack_layers(config: ModelConfig, num_layers: int, layer: type[nn.Module], x: jax.Array,
                 *args: Any, **layer_kwargs: Any) -> jax.Array:
  """Applies `num_layers` layers to `x` (each also given `args`), from inside a compact module.

  Unrolled by default (parameters 'layer_0', 'layer_1', ...); with `config.scan_layers` one
  `nn.scan` over parameters stacked on a leading 'layers' axis (and a stacked decoding cache), which
  compiles one layer instead of N. `config.remat` rematerialises each layer in the backward pass.
  """
  if config.remat != "none":
    layer = nn.remat(layer, policy=REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers)
  if not config.scan_layers:
    for i in range(num_layers):
      x = layer(config, **layer_kwargs, name=f"layer_{i}")(x, *args)
    return x
  scan = nn.scan(lambda module, carry, *rest: (module(carry, *rest), None),
                 variable_axes={"params": 0, kv_cache.SELF: 0, kv_cache.SOURCE: 0, "intermediates": 0},
                 split_rngs={"params": True, "dropout": True},
                 in_axes=nn.broadcast, length=num_layers,
                 metadata_params={nn.PARTITION_NAME: "layers"})
  x, _ = scan(layer(config, **layer_kwargs, name="layers"), x, *args)
  return x


def drop_words(config: ModelConfig, x: jax.Array, deterministic: bool) -> jax.Array:
  """Word dropout: each token's whole embedding [.., D] zeroed with probability
  `config.word_dropout` while training, the others scaled up (Marian's --dropout-src/--dropout-trg;
  Sennrich and Zhang, 2019, for small data). Named, and built only when on, so that the other
  dropout layers' names, and so their masks, are those of a run without it."""
  if not config.word_dropout or deterministic:
    return x
  return nn.Dropout(config.word_dropout, broadcast_dims=(x.ndim - 1,), name="word_dropout")(
      x, deterministic=False)


def embed_tokens(config: ModelConfig, embed: nn.Embed, tokens: jax.Array) -> jax.Array:
  """Token embeddings scaled by sqrt(D), as the paper does for the shared matrix. The rows are
  gathered from the float32 table and then cast (nn.Embed casts the table first: the same values),
  so that the gradient's scatter-add sums in float32: in bf16 a token seen a thousand times in a
  batch (EOS, 'a') got its row's gradient summed in bf16, ~5% off, and a GPU added bf16 rows."""
  rows = jnp.take(embed.embedding, tokens, axis=0).astype(config.dtype)
  return rows * jnp.asarray(math.sqrt(config.d_model), config.dtype)


class Encoder(nn.Module):
  config: ModelConfig
  embed: nn.Embed

  @nn.compact
  def __call__(self, src: jax.Array, deterministic: bool, segments: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
    cfg = self.config
    at = default_positions(src, positions)
    kind = positional.get(cfg.positional)(cfg, name="positions")
    x = kind.embed(drop_words(cfg, embed_tokens(cfg, self.embed, src), deterministic), at)
    x = constrain(nn.Dropout(cfg.dropout)(x, deterministic=deterministic), "batch", "length",
                  "act_embed")
    mask = source_mask(src) if segments is None else segment_mask(segments, segments)
    x = stack_layers(cfg, cfg.num_layers, EncoderLayer, x, mask, kind.prepare(at, at, causal=False),
                     deterministic=deterministic)
    if cfg.norm == "pre":
      x = _layer_norm(cfg, "final_norm")(x)
    return x


class Decoder(nn.Module):
  """Decoder stack and the pre-softmax projection (the shared embedding, or its own matrix)."""
  config: ModelConfig
  embed: nn.Embed

  @nn.compact
  def __call__(self, encoded: jax.Array, src: jax.Array, tgt_in: jax.Array, deterministic: bool,
               decode: bool = False, decode_len: int = 0, step: jax.Array | None = None,
               self_mask: jax.Array | None = None, src_segments: jax.Array | None = None,
               tgt_segments: jax.Array | None = None, tgt_positions: jax.Array | None = None,
               project: bool = True) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array | None]:
    """Logits [B, T, V]; with `project` False the decoder's output [B, T, D], the output matrix
    [V, D] as the projection would multiply them and the output bias [V] or None (training's
    chunked loss projects them itself)."""
    cfg = self.config
    if decode:  # tgt_in [B, G]: G hypotheses per sentence at position `step` (scalar or [B]).
      positions = jnp.broadcast_to(step, tgt_in.shape[:1])[:, None]
      key_positions = (jnp.arange(decode_len * tgt_in.shape[1]) // tgt_in.shape[1])[None]  # slots
      cross_mask = source_mask(src)
    elif tgt_segments is None:
      positions = key_positions = default_positions(tgt_in, None)
      self_mask = causal_mask(tgt_in) & (tgt_in != PAD_ID)[:, None, None, :]
      cross_mask = source_mask(src)
    else:  # packed rows: attend within the same segment only.
      positions = key_positions = tgt_positions
      self_mask = causal_mask(tgt_in) & segment_mask(tgt_segments, tgt_segments)
      cross_mask = segment_mask(tgt_segments, src_segments)
    if cfg.start_id != BOS_ID:  # inputs and searches put BOS at position 0; this model starts
      tgt_in = jnp.where(positions == 0, cfg.start_id, tgt_in)  # from another token (Marian's pad)
    kind = positional.get(cfg.positional)(cfg, name="positions")
    x = kind.embed(drop_words(cfg, embed_tokens(cfg, self.embed, tgt_in), deterministic),
                   positions)
    x = constrain(nn.Dropout(cfg.dropout)(x, deterministic=deterministic), "batch", "length",
                  "act_embed")
    x = stack_layers(cfg, cfg.num_decoder_layers, DecoderLayer, x, encoded, self_mask, cross_mask,
                     step, kind.prepare(positions, key_positions, causal=True),
                     deterministic=deterministic, decode=decode, decode_len=decode_len)
    if cfg.norm == "pre":
      x = _layer_norm(cfg, "final_norm")(x)
    if cfg.share_embeddings:
      matrix = self.embed.embedding  # [V, D]
    else:
      matrix = self.param("output_embedding",
                          _init(nn.initializers.normal(cfg.d_model ** -0.5), "vocab", "embed"),
                          (cfg.vocab_size, cfg.d_model))
    bias = (self.param("output_bias", _init(nn.initializers.zeros, "vocab"), (cfg.vocab_size,))
            if cfg.output_bias else None)
    product_dtype = cfg.vocab_matmul_dtype or cfg.matmul_dtype
    if not project:
      return (x.astype(cfg.dtype), matrix if product_dtype else jnp.asarray(matrix, cfg.dtype),
              bias)
    if decode and self.has_variable("params", SEARCH_MATRIX):  # translator.search_params
      logits = search_logits(x.astype(cfg.dtype), self.get_variable("params", SEARCH_MATRIX),
                             product_dtype)
    elif product_dtype is None:
      logits = output_logits(x.astype(cfg.dtype), jnp.asarray(matrix, cfg.dtype))
    else:  # the matrix as stored (float32, or bf16 for quantised decoding), rounded for the product
      logits = output_logits(x.astype(cfg.dtype), matrix, product_dtype)
    if bias is not None:
      logits = logits + bias
    return constrain(logits, "batch", "length", "act_vocab")


# -------------------------------------------------------------------------------------------- model

class Transformer(nn.Module):
  """Encoder-decoder Transformer. `__call__` gives float32 logits [B, T, V] for teacher forcing."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    embed = lambda name: nn.Embed(
        cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, name=name,
        embedding_init=_init(nn.initializers.normal(cfg.d_model ** -0.5), "vocab", "embed"))
    if cfg.share_embeddings:
      shared = embed("embed")
      self.encoder = Encoder(cfg, embed=shared)
      self.decoder = Decoder(cfg, embed=shared)
    else:
      self.encoder = Encoder(cfg, embed=embed("source_embed"))
      self.decoder = Decoder(cfg, embed=embed("target_embed"))

  def encode(self, src: jax.Array, deterministic: bool = True, src_segments: jax.Array | None = None,
             src_positions: jax.Array | None = None) -> jax.Array:
    return self.encoder(src, deterministic, src_segments, src_positions)

  def decode(self, encoded: jax.Array, src: jax.Array, tgt_in: jax.Array, deterministic: bool = True,
             decode: bool = False, decode_len: int = 0, step: jax.Array | None = None,
             self_mask: jax.Array | None = None, **packing: jax.Array | None) -> jax.Array:
    """Teacher-forced decoder logits, or with `decode` one step of G hypotheses per sentence:
    tgt_in [B, G] at position `step` (scalar or [B]) of a cache of `decode_len` positions, `self_mask`
    [B, 1, G, decode_len * G] (decode.history_mask) -> logits [B, G, V]."""
    return self.decoder(encoded, src, tgt_in, deterministic, decode, decode_len, step, self_mask,
                        **packing)

  def __call__(self, src: jax.Array, tgt_in: jax.Array, deterministic: bool = True, *,
               src_segments: jax.Array | None = None, src_positions: jax.Array | None = None,
               tgt_segments: jax.Array | None = None, tgt_positions: jax.Array | None = None,
               project: bool = True) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array | None]:
    """Teacher-forced logits. Packed rows (several pairs per row) pass segment ids (1, 2, ... per
    pair, 0 for padding) and per-pair positions for both sides; attention stays within a pair.
    With `project` False: the decoder's output, the output matrix and bias instead of logits."""
    encoded = self.encode(src, deterministic, src_segments, src_positions)
    return self.decode(encoded, src, tgt_in, deterministic, src_segments=src_segments,
                       tgt_segments=tgt_segments, tgt_positions=tgt_positions, project=project)


def initial_params(model: Transformer, rng: jax.Array, logical_axes: bool = False) -> Any:
  """Freshly initialised parameters. With `logical_axes` every leaf stays wrapped in its
  `nn.LogicallyPartitioned` box (names, no values needed under eval_shape) for partitioning.py."""
  dummy = jnp.ones((1, 8), jnp.int32)
  params = model.init(rng, dummy, dummy)["params"]
  return params if logical_axes else nn.meta.unbox(params)


def shift_right(tgt: jax.Array, segments: jax.Array | None = None) -> jax.Array:
  """Decoder input: BOS followed by the target without its last token (padding stays padding).

  With packed rows (`segments` given) the shift is per pair: every pair's first input is BOS, not the
  previous pair's EOS.
  """
  shifted = jnp.concatenate([jnp.full_like(tgt[:, :1], BOS_ID), tgt[:, :-1]], axis=1)
  if segments is not None:
    previous_segment = jnp.concatenate([jnp.zeros_like(segments[:, :1]), segments[:, :-1]], axis=1)
    shifted = jnp.where(segments != previous_segment, BOS_ID, shifted)
  return jnp.where(tgt == PAD_ID, PAD_ID, shifted)
