"""Configs load with the paper's values, and bad values are one-line errors naming the key."""

import importlib.util
import re
from pathlib import Path

import pytest

from transformer.config import ConfigError, validate
from transformer.model import positions

CONFIGS = Path(__file__).parent.parent / "configs"


def load(name, *args):
  spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


def test_wmt14_configs_have_the_papers_hyper_parameters():
  base, big = load("wmt14_ende", "base"), load("wmt14_ende", "big")
  for c in (base, big):
    validate(c)
    assert (c.train.adam_b1, c.train.adam_b2, c.train.adam_eps) == (0.9, 0.98, 1e-9)
    assert (c.train.warmup_steps, c.train.label_smoothing) == (4000, 0.1)
    assert (c.decode.beam_size, c.decode.alpha, c.decode.max_extra_len) == (4, 0.6, 50)
    assert c.model.norm == "post" and c.model.positional == "sinusoidal" and c.model.share_embeddings
    assert c.data.tokens_per_batch == 25000 and c.data.vocab_size == 37000
  assert (base.model.num_layers, base.model.d_model, base.model.d_ff, base.model.num_heads,
          base.model.dropout, base.train.steps) == (6, 512, 2048, 8, 0.1, 100_000)
  assert (big.model.d_model, big.model.d_ff, big.model.num_heads, big.model.dropout,
          big.train.steps) == (1024, 4096, 16, 0.3, 300_000)
  with pytest.raises(ValueError, match="use :base or :big"):
    load("wmt14_ende", "huge")


def test_default_config_is_valid():
  validate(load("multi30k"))


@pytest.mark.parametrize("key,value,message", [
    ("model.num_heads", 3, r"config.model.d_model \(256\) must be divisible by config.model.num_heads \(3\)"),
    ("model.positional", "fourier", "config.model.positional must be one of "
     + re.escape(", ".join(map(repr, positions.kinds()))) + "; got 'fourier'"),
    ("model.relative_clip", 0, r"config.model.relative_clip must be an integer >= 1, got 0"),
    ("model.rotary_base", 1000.0, r"config.model.rotary_base is a hyper-parameter of "
     r"positional='rotary', but this run's positional is 'sinusoidal'; drop the override or set "
     r"--config.model.positional=rotary"),
    ("model.norm", "sandwich", r"config.model.norm must be one of"),
    ("model.d_ff", -5, r"config.model.d_ff must be a positive integer, got -5"),
    ("model.num_layers", 0, r"config.model.num_layers must be a positive integer, got 0"),
    ("data.tokens_per_batch", -100, r"config.data.tokens_per_batch must be a positive integer, got -100"),
    ("model.dropout", 1.5, r"config.model.dropout must be a number in \[0, 1\), got 1.5"),
    ("model.activation_dropout", 1.0, r"config.model.activation_dropout must be a number in \[0, 1\), "
     r"got 1.0"),
    ("model.word_dropout", -0.1, r"config.model.word_dropout must be a number in \[0, 1\), got -0.1"),
    ("model.qkv_init_gain", 0.0, r"config.model.qkv_init_gain must be a positive number \(1 = "
     r"Glorot-uniform, fairseq's is 0.7071\), got 0.0"),
    ("train.label_smoothing", -0.1, r"config.train.label_smoothing must be a number in \[0, 1\)"),
    ("data.subword_dropout", 1.0, r"config.data.subword_dropout must be a number in \[0, 1\), got 1.0"),
    ("train.ema_decay", 1.0, r"config.train.ema_decay must be a number in \[0, 1\), got 1.0"),
    ("train.warmup_steps", -1, r"config.train.warmup_steps must be a positive integer"),
    ("model.dtype", "float8", r"config.model.dtype must be one of"),
    ("model.matmul_dtype", "float16", r"config.model.matmul_dtype must be one of 'float32', 'bfloat16'"),
    ("model.matmul_dtype", "bfloat16_vocab", r"config.model.matmul_dtype must be one of 'float32', "
     r"'bfloat16'; got 'bfloat16_vocab'"),
    ("decode.matmul_dtype", "int8", r"config.decode.matmul_dtype must be one of 'float32', "
     r"'bfloat16', 'bfloat16_vocab'"),
    ("data.source", "wmt", r"config.data.source must be one of"),
    ("model.d_k", -16, r"config.model.d_k must be a non-negative integer, got -16"),
    ("model.decoder_layers", -1, r"config.model.decoder_layers must be a non-negative integer, got -1"),
    ("decode.min_len", -1, r"config.decode.min_len must be a non-negative integer, got -1"),
    ("train.cooldown_steps", 5000, r"config.train.cooldown_steps \(5000\) must be at most "
     r"config.train.steps \(4800\)"),
])
def test_bad_values_name_the_key(key, value, message):
  c = load("multi30k")
  section, name = key.split(".")
  with c.unlocked():
    c[section][name] = value
  with pytest.raises(ConfigError, match=message) as error:
    validate(c)
  assert "\n" not in str(error.value)


def test_explicit_head_widths_lift_the_divisibility_rule():
  c = load("multi30k")
  c.model.num_heads, c.model.d_k, c.model.d_v = 3, 32, 32
  validate(c)
  c.model.d_v = 0  # d_v = d_model / num_heads again
  with pytest.raises(ConfigError, match="or set config.model.d_k and config.model.d_v"):
    validate(c)


def test_subword_dropout_needs_a_bpe_vocabulary():
  c = load("multi30k")
  c.data.subword_dropout = 0.1
  validate(c)
  c.data.vocab_model_type = "unigram"
  with pytest.raises(ConfigError, match="subword_dropout needs a BPE vocabulary .* is 'unigram'"):
    validate(c)


def test_files_source_needs_its_paths():
  c = load("multi30k")
  c.data.source = "files"
  with pytest.raises(ConfigError, match="config.data.train_src must name a text file"):
    validate(c)
