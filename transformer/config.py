"""Default hyper-parameters and one-time validation of a run's config.

Config files in `configs/` start from `base_config()` (the paper's base model and recipe) and override
what they change, so every key a researcher can type exists in one place, with the paper's value.
`validate()` runs once at start-up and turns a bad value into a one-line error naming the key.
"""

from __future__ import annotations

import ml_collections

from transformer.data import pretokenize, sources
from transformer.data.batching import BATCHING_MODES
from transformer.decoding.translator import OPTIONS as SEARCH_OPTIONS
from transformer.errors import ConfigError
from transformer.model import positions
from transformer.model.config import ACTIVATIONS, DECODER_STARTS

NORM_KINDS = ("post", "pre")
DTYPES = ("float32", "bfloat16", "float16")
MATMUL_DTYPES = ("float32", "bfloat16")  # model.matmul_dtype: bfloat16 products, float32 sums
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg", "unsafe_rbg_threefry")
VOCAB_MODEL_TYPES = ("bpe", "unigram")
# SentencePiece's normalisation rules; "_cf" ones also fold case (the multimodal-MT literature's
# lowercased training text).
VOCAB_NORMALIZATIONS = ("identity", "nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf")
ATTENTION_KERNELS = ("auto", "xla", "cudnn", "reference")
REMAT_MODES = ("none", "full", "dots")
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout", "word_dropout")  # model keys
NONFINITE_POLICIES = ("stop", "skip")


def base_config() -> ml_collections.ConfigDict:
  """The paper's base Transformer (Vaswani et al., 2017, Table 3 'base') and training recipe."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = _model_keys()
  c.mesh = _mesh_keys()
  c.data = _data_keys()
  c.train = _train_keys()
  c.decode = _decode_keys()
  return c


def _model_keys() -> ml_collections.ConfigDict:
  """The architecture (model.ModelConfig reads every key)."""
  model = ml_collections.ConfigDict()
  model.num_layers = 6              # N, for the encoder and the decoder alike ...
  model.decoder_layers = 0          # ... unless this is set: the decoder's own depth (0 = N).
  model.d_model = 512
  model.d_ff = 2048
  model.num_heads = 8
  model.d_k = 0                     # per-head query/key width; 0 = d_model / num_heads (64 in base).
  model.d_v = 0                     # per-head value width; 0 = d_model / num_heads.
  model.dropout = 0.1               # residual and embedding dropout (P_drop).
  model.attention_dropout = 0.0     # the paper uses none.
  model.activation_dropout = 0.0    # on the feed-forward's hidden units (fairseq's
                                    # --activation-dropout, tensor2tensor's relu_dropout); none in
                                    # the paper.
  model.word_dropout = 0.0          # each source token's and decoder input's whole embedding
                                    # dropped with this probability (Marian's --dropout-src/-trg);
                                    # none in the paper.
  model.positional = "sinusoidal"   # or another of model/positions/ (one file per kind; 'learned'
                                    # is Table 3 row E); docs/experiments.md compares them all.
  model.norm = "post"               # 'post' = LayerNorm(x + Sublayer(x)) as in the paper; or 'pre'.
  model.activation = "relu"         # the feed-forward nonlinearity: the paper's; 'swish' (SiLU, as
                                    # OPUS-MT's Marian models) or 'gelu' (exact, with erf).
  model.output_bias = False         # a learned bias per word added to the logits (Marian's
                                    # final_logits_bias); the paper has none.
  model.decoder_start = "bos"       # the decoder's first input: 'bos' (ours) or 'pad' (Marian's).
  model.layer_norm_epsilon = 1e-6   # tensor2tensor's and the Flax example's; Marian's is 1e-5.
  model.qkv_init_gain = 1.0         # the Glorot-uniform gain of the query, key and value projections'
                                    # initial weights; fairseq (0.9 on) draws them at 1/sqrt(2).
  model.share_embeddings = True     # source, target and pre-softmax matrices are one.
  model.max_len = 256               # table size of learned positions; longest sequence trained.
  model.dtype = "float32"           # activation dtype; parameters, logits and loss stay float32.
  model.matmul_dtype = "float32"    # 'bfloat16': the products' inputs rounded to bf16, sums float32.
  model.attention = "auto"          # 'auto': cuDNN flash attention on GPUs, XLA elsewhere; or 'xla',
                                    # 'cudnn', 'reference' (ours; always used for attention dropout).
  model.remat = "none"              # 'full' / 'dots': recompute each layer in the backward pass.
  model.scan_layers = False         # one nn.scan over the layers: compiles one layer, not N.
  for key in positions.all_keys():  # each kind's own (relative_clip, t5_buckets, rotary_base, ...):
    model[key.name] = key.default   # declared, documented and checked in its file
  return model


def _mesh_keys() -> ml_collections.ConfigDict:
  """Devices per mesh axis; their product = all devices (partitioning.py)."""
  mesh = ml_collections.ConfigDict()
  mesh.data = -1                    # data parallel (-1 = the devices the other axes leave).
  mesh.fsdp = 1                     # also data parallel, with parameters and Adam state sharded.
  mesh.tensor = 1                   # heads, d_ff and the vocabulary split over devices.
  return mesh


def _data_keys() -> ml_collections.ConfigDict:
  """Where pairs come from, the vocabulary, filtering and batching (transformer/data/)."""
  data = ml_collections.ConfigDict()
  data.source = "multi30k"          # 'multi30k' (bundled) | 'files' | 'tfds'.
  data.src_lang = "en"
  data.tgt_lang = "de"
  for key in sources.all_keys():    # each kind's own (train_src, tfds_name, ...), declared and
    data[key.name] = key.default    # documented in data/sources.py
  data.train_split = "train"
  data.eval_split = "validation"
  data.vocab_size = 37000           # shared SentencePiece vocabulary.
  data.vocab_model_type = "bpe"
  data.vocab_normalization = "identity"  # text as given; 'nmt_nfkc_cf': NFKC and lowercased.
  data.pretokenize = "none"         # 'multi30k': train on the release's lowercased, normalised,
                                    # Moses-tokenized text (its *.lc.norm.tok.* files), as the
                                    # multimodal-MT literature does (data/pretokenize.py).
  data.subword_dropout = 0.0        # BPE-dropout while training: each merge skipped with this
                                    # probability (Provilkov et al., 2020); evaluation never samples.
  data.vocab_sample_sentences = 1_000_000  # training pairs sampled uniformly to train it.
  data.vocab_cache_dir = ""         # '' = $XDG_CACHE_HOME/transformer/vocab (~/.cache/...).
  data.vocab_file = ""              # a SentencePiece model (or a run folder: its vocab.model) used
                                    # instead of learning one; runs sharing it can be ensembled.
  data.max_len = 256                # longer training pairs (in subword tokens) are dropped,
  data.max_length_ratio = 9.0       # and pairs with one side 9x longer (Moses' clean-corpus; 0 = off).
  data.batching = "bucket"          # 'bucket': pairs of similar length per batch (the paper's);
                                    # 'pack': several pairs per row of pack_length tokens.
  data.pack_length = 256
  data.tokens_per_batch = 25000     # per side per step, padding included; the paper's ~25k.
  data.token_cache_dir = ""         # '' = $XDG_CACHE_HOME/transformer/tokens: ids, tokenized once.
  data.loader_workers = 0           # Grain worker processes making batches (0: threads of the
                                    # training process; BPE-dropout runs want several).
  return data


def _train_keys() -> ml_collections.ConfigDict:
  """The optimizer, the loss and the loop's cadence (step.py, train.py)."""
  train = ml_collections.ConfigDict()
  train.steps = 100_000
  train.init_from = ""              # a run folder (trained, or transformer-import's): start from its
                                    # parameters, architecture and vocabulary (training/init_from.py).
  train.warmup_steps = 4000
  train.learning_rate = 1.0         # multiplier of d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
  train.cooldown_steps = 0          # > 0: the rate falls linearly towards 0 over the last this many of
                                    # train.steps (not in the paper; 0 keeps its schedule).
  train.adam_b1 = 0.9
  train.adam_b2 = 0.98
  train.adam_eps = 1e-9
  train.label_smoothing = 0.1
  train.rdrop_alpha = 0.0           # > 0: R-Drop (Liang et al., 2021): each batch runs twice under
                                    # two dropout masks and the loss adds alpha x their symmetric KL
                                    # divergence (the paper's weighting); twice the compute a step.
  train.ema_decay = 0.0             # > 0: also keep a moving average of the parameters (evaluated
                                    # by default); the paper averaged checkpoints instead.
  train.grad_accum_steps = 1        # split each batch into this many micro-batches (same update).
  train.loss_chunks = 0             # > 0: the loss projects onto the vocabulary this many chunks of
                                    # target positions at a time, never holding the logits [B, T, V]
                                    # (the same loss and gradients); 0: the whole logits at once.
  train.compile_ahead = True        # compile the train and validation steps for every batch shape
                                    # before the first step, all at once (training/compiled.py);
                                    # False: each shape when the loop first meets it (the same result).
  train.device_prefetch = 2         # batches placed on the devices ahead of their step, from a
                                    # background thread (training/feed.py); 0: each when its step comes.
  train.dropout_rng = "threefry2x32"  # JAX's default; 'unsafe_rbg_threefry': dropout ~4x cheaper on CPU.
  train.patience = 0                # > 0: stop once this many validations in a row have not
                                    # bettered the best validation loss (fairseq's --patience;
                                    # training/early_stop.py); 0: train to train.steps.
  train.log_every = 100
  train.eval_every = 1000
  train.checkpoint_every = 1000
  train.checkpoint_minutes = 0.0    # also save every this many minutes (checked at progress lines); 0 = off
  train.keep_checkpoints = 5
  train.on_nonfinite = "stop"       # a NaN/inf loss or gradient: 'stop' (save the last good state
                                    # and the batch) or 'skip' (drop that update, count it, go on).
  return train


def _decode_keys() -> ml_collections.ConfigDict:
  """The search of transformer-eval and transformer-translate: the options searches declare with
  `in_config` (decoding/options.py, decoding/beam.py), each with its declared default and help."""
  decode = ml_collections.ConfigDict()
  for name, (option, _) in SEARCH_OPTIONS.items():
    if option.in_config:
      decode[name] = option.default
  return decode


PAPER_SIZES = {  # Table 3 of the paper; steps as trained there (100k base, 300k big).
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout=0.1, steps=100_000),
    "big": dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout=0.3, steps=300_000),
}


def wmt_config(size: str, tfds_name: str, src_lang: str, tgt_lang: str, vocab_size: int,
               config_file: str) -> ml_collections.ConfigDict:
  """The paper's base or big model and recipe on a TFDS WMT dataset (the configs/wmt*.py files)."""
  if size not in PAPER_SIZES:
    raise ValueError(f"unknown size {size!r} for {config_file}; use :base or :big")
  c = base_config()
  for key, value in PAPER_SIZES[size].items():
    if key == "steps":
      c.train.steps = value
    else:
      c.model[key] = value
  c.model.dtype = "bfloat16"
  c.data.source = "tfds"
  c.data.tfds_name = tfds_name
  c.data.src_lang, c.data.tgt_lang = src_lang, tgt_lang
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.data.vocab_size = vocab_size
  c.data.tokens_per_batch = 25000
  c.decode.tokens_per_batch = 4096    # accelerators want more sentences per decoding step than CPUs
  c.train.checkpoint_every = 10_000   # a floor; the paper's cadence is by time:
  c.train.checkpoint_minutes = 10.0
  c.train.keep_checkpoints = 20 if size == "big" else 5  # the paper averages the last 5 / 20.
  return c


def _positive(cfg: ml_collections.ConfigDict, key: str, allow_zero: bool = False) -> None:
  section, name = key.split(".")
  value = cfg[section][name]
  if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (value == 0 and not allow_zero):
    need = "a non-negative integer" if allow_zero else "a positive integer"
    raise ConfigError(f"config.{key} must be {need}, got {value!r}")


def _choice(cfg: ml_collections.ConfigDict, key: str, choices: tuple[str, ...]) -> None:
  section, name = key.split(".")
  value = cfg[section][name]
  if value not in choices:
    raise ConfigError(f"config.{key} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def _probability(cfg: ml_collections.ConfigDict, key: str) -> None:
  section, name = key.split(".")
  value = cfg[section][name]
  if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
    raise ConfigError(f"config.{key} must be a number in [0, 1), got {value!r}")


def validate(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks every value once, raising `ConfigError` with the key's name; returns `cfg`."""
  _check_values(cfg)
  _check_combinations(cfg)
  return cfg


def _check_values(cfg: ml_collections.ConfigDict) -> None:
  """Each key on its own: its type, range or one of its choices."""
  for key in ("model.num_layers", "model.d_model", "model.d_ff", "model.num_heads", "model.max_len",
              "data.vocab_size", "data.max_len", "data.tokens_per_batch", "data.vocab_sample_sentences",
              "data.pack_length", "train.grad_accum_steps", "train.steps",
              "train.warmup_steps", "train.log_every", "train.eval_every",
              "train.checkpoint_every", "train.keep_checkpoints", "decode.beam_size",
              "decode.tokens_per_batch"):
    _positive(cfg, key)
  for key in ("decode.max_extra_len", "decode.min_len", "model.decoder_layers", "model.d_k",
              "model.d_v", "train.cooldown_steps", "data.loader_workers", "train.loss_chunks",
              "train.patience"):
    _positive(cfg, key, allow_zero=True)
  _choice(cfg, "model.norm", NORM_KINDS)
  _choice(cfg, "model.activation", ACTIVATIONS)
  _choice(cfg, "model.decoder_start", tuple(DECODER_STARTS))
  epsilon = cfg.model.layer_norm_epsilon
  if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < 1:
    raise ConfigError(f"config.model.layer_norm_epsilon must be a number between 0 and 1 "
                      f"(the paper's models use 1e-6, Marian's 1e-5), got {epsilon!r}")
  gain = cfg.model.qkv_init_gain
  if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not gain > 0:
    raise ConfigError(f"config.model.qkv_init_gain must be a positive number (1 = Glorot-uniform, "
                      f"fairseq's is 0.7071), got {gain!r}")
  if not isinstance(cfg.model.output_bias, bool):
    raise ConfigError(f"config.model.output_bias must be True or False, got "
                      f"{cfg.model.output_bias!r}")
  _choice(cfg, "model.dtype", DTYPES)
  _choice(cfg, "model.matmul_dtype", MATMUL_DTYPES)
  positions.check_config(cfg)  # an unknown kind, its keys, another kind's keys, its length limit
  sources.source_of(cfg.data).check(cfg.data)  # an unknown source is an error here
  _choice(cfg, "train.dropout_rng", RNG_IMPLS)
  _choice(cfg, "data.vocab_model_type", VOCAB_MODEL_TYPES)
  _choice(cfg, "data.vocab_normalization", VOCAB_NORMALIZATIONS)
  _choice(cfg, "data.pretokenize", pretokenize.PRETOKENIZERS)
  _choice(cfg, "data.batching", BATCHING_MODES)
  _choice(cfg, "model.attention", ATTENTION_KERNELS)
  _choice(cfg, "model.remat", REMAT_MODES)
  _choice(cfg, "train.on_nonfinite", NONFINITE_POLICIES)
  alpha = cfg.train.rdrop_alpha
  if alpha < 0:
    raise ConfigError(f"config.train.rdrop_alpha must be a number >= 0 (0 = off; the R-Drop paper "
                      f"uses 5 on IWSLT), got {alpha!r}")
  if not isinstance(cfg.model.scan_layers, bool):
    raise ConfigError(f"config.model.scan_layers must be True or False, got {cfg.model.scan_layers!r}")
  for axis in ("data", "fsdp", "tensor"):
    size = cfg.mesh[axis]
    if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
      raise ConfigError(f"config.mesh.{axis} must be a positive number of devices or -1 (the rest), "
                        f"got {size!r}")
  ratio = cfg.data.max_length_ratio
  if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or (ratio != 0 and ratio < 1):
    raise ConfigError(f"config.data.max_length_ratio must be >= 1 (or 0 to keep every ratio), "
                      f"got {ratio!r}")
  for key in (*(f"model.{k}" for k in DROPOUTS), "train.label_smoothing", "data.subword_dropout"):
    _probability(cfg, key)
  minutes = cfg.train.checkpoint_minutes
  if not isinstance(minutes, (int, float)) or isinstance(minutes, bool) or minutes < 0:
    raise ConfigError(f"config.train.checkpoint_minutes must be a number >= 0 (0 = off), got "
                      f"{minutes!r}")
  for key in ("train.learning_rate", "train.adam_eps"):
    section, name = key.split(".")
    if not isinstance(cfg[section][name], (int, float)) or cfg[section][name] <= 0:
      raise ConfigError(f"config.{key} must be a positive number, got {cfg[section][name]!r}")
  for key in ("train.adam_b1", "train.adam_b2", "train.ema_decay"):
    _probability(cfg, key)
  for name, (option, _) in SEARCH_OPTIONS.items():
    if option.in_config and option.choices:
      _choice(cfg, f"decode.{name}", option.choices)
    elif option.in_config and not option.valid(cfg.decode[name]):
      raise ConfigError(f"config.decode.{name} must be {option.need}, got {cfg.decode[name]!r}")
  if cfg.decode.mbr and cfg.decode.beam_size < 2:
    raise ConfigError(f"config.decode.mbr reranks a beam's hypotheses: set config.decode.beam_size "
                      f">= 2 (e.g. 8), got {cfg.decode.beam_size}")
  if cfg.data.vocab_size < 8:
    raise ConfigError(f"config.data.vocab_size must be at least 8, got {cfg.data.vocab_size}")


def _check_combinations(cfg: ml_collections.ConfigDict) -> None:
  """Keys that must agree with each other."""
  if (not cfg.model.d_k or not cfg.model.d_v) and cfg.model.d_model % cfg.model.num_heads:
    raise ConfigError(f"config.model.d_model ({cfg.model.d_model}) must be divisible by "
                      f"config.model.num_heads ({cfg.model.num_heads}): d_k = d_model / num_heads "
                      "(or set config.model.d_k and config.model.d_v)")
  if cfg.train.cooldown_steps > cfg.train.steps:
    raise ConfigError(f"config.train.cooldown_steps ({cfg.train.cooldown_steps}) must be at most "
                      f"config.train.steps ({cfg.train.steps}): the cool-down is the end of the run")
  if cfg.data.vocab_file and cfg.train.init_from:
    raise ConfigError("config.data.vocab_file and config.train.init_from both bring a vocabulary "
                      "(init_from its run's): drop config.data.vocab_file")
  if cfg.data.subword_dropout and cfg.data.vocab_model_type != "bpe":
    raise ConfigError(f"config.data.subword_dropout needs a BPE vocabulary (it is BPE-dropout); "
                      f"config.data.vocab_model_type is {cfg.data.vocab_model_type!r}")
  if cfg.train.rdrop_alpha and not any(cfg.model[k] for k in DROPOUTS):
    raise ConfigError("config.train.rdrop_alpha compares two dropout masks, but the model has no "
                      "dropout: set config.model.dropout (e.g. 0.3) or config.train.rdrop_alpha=0")
  if cfg.train.rdrop_alpha and cfg.train.loss_chunks:
    raise ConfigError("config.train.rdrop_alpha compares the two passes' whole distributions over "
                      "the vocabulary, which config.train.loss_chunks never holds: set one of them "
                      "to 0")
  if [cfg.mesh[a] for a in ("data", "fsdp", "tensor")].count(-1) > 1:
    raise ConfigError("only one of config.mesh.data / fsdp / tensor may be -1 (the devices left)")
  if cfg.data.max_len > 65535:
    raise ConfigError(f"config.data.max_len must be at most 65535 (the token cache stores lengths "
                      f"in 16 bits), got {cfg.data.max_len}")
  if cfg.data.batching == "pack" and cfg.data.pack_length < cfg.data.max_len:
    raise ConfigError(f"config.data.pack_length ({cfg.data.pack_length}) must be >= "
                      f"config.data.max_len ({cfg.data.max_len}) so that every kept pair fits a row")
  longest = max(cfg.data.max_len, cfg.data.pack_length if cfg.data.batching == "pack" else 0)
  if cfg.data.tokens_per_batch < longest:
    raise ConfigError(f"config.data.tokens_per_batch ({cfg.data.tokens_per_batch}) must hold at "
                      f"least one row of {longest} tokens")
