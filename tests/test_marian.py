"""transformer-export --format=huggingface: the tensors Marian's names and shapes take (everywhere),
and Transformers' MarianMTModel scoring and searching as our model does (where torch and
transformers are installed: `pip install -e '.[huggingface]'`; skipped with that line otherwise)."""

import importlib.util
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
  copy_task_model,
  init_params,
  random_tokens,
  run_cli,
  tiny_model_config,
)

from transformer import decoding
from transformer.config import base_config
from transformer.data import text_files
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.evaluation import export, marian
from transformer.model import positions
from transformer.model.positions.sinusoidal import sinusoidal_encoding
from transformer.model.transformer import BOS_ID, EOS_ID, PAD_ID, Transformer, shift_right

VOCAB = 24
ROWS = 32
HAVE_ENGINE = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_engine = pytest.mark.skipif(
    not HAVE_ENGINE, reason="Transformers' side of the Marian export needs torch and transformers: "
                            f"{marian.INSTALL}")


def expected_shapes(config, rows):
  """MarianMTModel's stored tensors, named and shaped as its modules are (written out here from
  its layout, not from our export)."""
  D, F, V = config.d_model, config.d_ff, config.vocab_size
  shapes = {"model.shared.weight": (V, D), "final_logits_bias": (1, V),
            "model.encoder.embed_positions.weight": (rows, D),
            "model.decoder.embed_positions.weight": (rows, D)}
  for stack, count in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
    for i in range(count):
      layer = f"model.{stack}.layers.{i}."
      blocks = ["self_attn"] + (["encoder_attn"] if stack == "decoder" else [])
      for block in blocks:
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
          shapes[layer + f"{block}.{proj}.weight"], shapes[layer + f"{block}.{proj}.bias"] = (D, D), (D,)
        shapes[layer + f"{block}_layer_norm.weight"] = shapes[layer + f"{block}_layer_norm.bias"] = (D,)
      shapes[layer + "fc1.weight"], shapes[layer + "fc1.bias"] = (F, D), (F,)
      shapes[layer + "fc2.weight"], shapes[layer + "fc2.bias"] = (D, F), (D,)
      shapes[layer + "final_layer_norm.weight"] = shapes[layer + "final_layer_norm.bias"] = (D,)
  return shapes


@pytest.mark.parametrize("overrides", [{}, {"scan_layers": True}, {"num_layers": 3, "decoder_layers": 1},
                                       {"positional": "learned"}])
def test_tensors_have_marians_names_and_shapes_and_carry_our_parameters(overrides):
  config = tiny_model_config(vocab_size=VOCAB, **overrides)
  model = Transformer(config)
  params = init_params(model, seed=1)
  tensors = marian.marian_tensors(config, params, ROWS)
  assert {k: v.shape for k, v in tensors.items()} == expected_shapes(config, ROWS)
  assert all(v.dtype == np.float32 for v in tensors.values())
  # Every parameter of ours is there once (position tables apart, which Marian stores per stack).
  ours = sum(np.size(x) for x in jax.tree.leaves(params))
  tables = 2 * config.max_len * config.d_model if config.positional == "learned" else 0
  stored = sum(v.size for k, v in tensors.items() if "embed_positions" not in k
               and k != "final_logits_bias")
  assert stored == ours - tables
  # A projection computes what ours does: Marian's q = W x + b, ours einsum(x, kernel[D, H, K]).
  layer = params["encoder"]["layers"] if config.scan_layers else params["encoder"]["layer_0"]
  query = layer["self_attention"]["query"]
  kernel = np.asarray(query["kernel"][0] if config.scan_layers else query["kernel"])
  bias = np.asarray(query["bias"][0] if config.scan_layers else query["bias"])
  # On Marian's residual stream: ours at coordinates 0, 2, 4, ..., then 1, 3, 5, ...
  order = np.r_[0:config.d_model:2, 1:config.d_model:2]
  x = np.random.default_rng(0).normal(size=config.d_model).astype(np.float32)
  q = tensors["model.encoder.layers.0.self_attn.q_proj.weight"] @ x[order] + tensors[
      "model.encoder.layers.0.self_attn.q_proj.bias"]
  np.testing.assert_allclose(q, (np.einsum("d,dhk->hk", x, kernel) + bias).reshape(-1), atol=1e-5)
  np.testing.assert_array_equal(tensors["model.shared.weight"],
                                np.asarray(params["embed"]["embedding"])[:, order])
  assert not tensors["final_logits_bias"].any()


def test_a_sinusoidal_runs_table_is_marians_own_sinusoids():
  """Marian's formula (Transformers computes it where no table is stored, as after a re-save): the
  paper's sines in the first half, its cosines in the second. In Marian's order of the stream,
  the paper's interleaved table is exactly that, so nothing depends on the stored table."""
  config = tiny_model_config(vocab_size=VOCAB)
  tensors = marian.marian_tensors(config, init_params(Transformer(config)), ROWS)
  d = config.d_model
  angles = np.arange(ROWS)[:, None] / np.power(10000, 2 * np.arange(d // 2) / d)[None, :]
  marians = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
  for stack in ("encoder", "decoder"):
    np.testing.assert_allclose(tensors[f"model.{stack}.embed_positions.weight"], marians, atol=1e-6)
  interleaved = np.asarray(sinusoidal_encoding(jnp.arange(ROWS), d))
  assert np.abs(interleaved - marians).max() > 0.5  # the order is what makes them one
  none = marian.marian_tensors(tiny_model_config(vocab_size=VOCAB, positional="none"),
                               init_params(Transformer(tiny_model_config(vocab_size=VOCAB,
                                                                         positional="none"))), ROWS)
  assert not none["model.decoder.embed_positions.weight"].any()


def test_kinds_whose_table_a_resave_loses_are_exported_with_a_warning_and_sinusoids_without():
  assert marian.resave_warning(tiny_model_config(vocab_size=VOCAB)) is None
  for kind in ("learned", "none"):
    warning = marian.resave_warning(tiny_model_config(vocab_size=VOCAB, positional=kind))
    assert f"this {kind!r}-position model is exact as written" in warning
    assert "a re-saved copy loads Marian's own sinusoids instead and is another model" in warning


def test_config_and_generation_settings_are_the_runs():
  cfg = base_config()
  cfg.decode.beam_size, cfg.decode.alpha = 5, 0.7
  config = tiny_model_config(vocab_size=VOCAB, num_layers=3, decoder_layers=2, dropout=0.1)
  settings = marian.marian_settings(config, 60)
  assert settings["encoder_layers"] == 3 and settings["decoder_layers"] == 2
  assert (settings["d_model"], settings["encoder_ffn_dim"], settings["encoder_attention_heads"]) == (16, 32, 4)
  assert settings["max_position_embeddings"] == 60 and settings["vocab_size"] == VOCAB
  assert settings["activation_function"] == "relu" and settings["scale_embedding"] is True
  assert (settings["pad_token_id"], settings["eos_token_id"], settings["decoder_start_token_id"]) == (
      PAD_ID, EOS_ID, BOS_ID)
  generation = marian.generation_settings(cfg, config, 60)
  assert generation["num_beams"] == 5 and generation["length_penalty"] == 0.7
  assert generation["max_length"] == 61  # 60 output tokens after the start token
  assert sorted(generation["suppress_tokens"]) == sorted([PAD_ID, BOS_ID])
  assert generation["forced_eos_token_id"] == EOS_ID and "min_new_tokens" not in generation
  cfg.decode.min_len = 1
  assert marian.generation_settings(cfg, config, 60)["min_new_tokens"] == 1


def test_the_additive_kinds_are_exported_and_every_other_is_refused_in_one_line():
  exported = []
  for kind in positions.kinds():
    config = tiny_model_config(vocab_size=VOCAB, positional=kind)
    params = init_params(Transformer(config))
    try:
      tensors = marian.marian_tensors(config, params, ROWS)
    except ConfigError as refusal:
      assert str(refusal).startswith(
          f"Marian cannot hold '{kind}' positions: it adds one position table to each stack's "
          f"embeddings, and '{kind}' acts inside attention")
      assert "\n" not in str(refusal)
    else:
      exported.append(kind)
      assert tensors["model.encoder.embed_positions.weight"].shape == (ROWS, config.d_model)
  assert exported == ["sinusoidal", "learned", "none"]


@pytest.mark.parametrize("overrides,message", [
    ({"norm": "pre"}, "Marian's layers are post-LayerNorm; this model is pre-LayerNorm"),
    ({"share_embeddings": False}, "Marian shares one matrix between the source and target"),
    ({"d_k": 8, "d_v": 8}, "Marian's heads are d_model / heads = 4 wide; this model's d_k and d_v "
                           "are 8 and 8")])
def test_layouts_marian_cannot_hold_are_refused(overrides, message):
  with pytest.raises(ConfigError, match=message):
    marian.check_marian(tiny_model_config(vocab_size=VOCAB, **overrides))


# ------------------------------------------------------------------- the engine (torch, transformers)

def load_marian(tmp_path, config, params, rows=ROWS, scale=None, resaved=True):
  """MarianMTModel.from_pretrained of the tensors and model config the export writes, by default
  saved again by Transformers and loaded from there (what push_to_hub and a Trainer's saves do)."""
  from safetensors.numpy import save_file
  from transformers import MarianConfig, MarianMTModel
  save_file(marian.marian_tensors(config, params, rows, scale), str(tmp_path / "model.safetensors"),
            metadata={"format": "pt"})
  MarianConfig(**marian.marian_settings(config, rows)).save_pretrained(tmp_path)
  engine = MarianMTModel.from_pretrained(tmp_path).eval()
  if not resaved:
    return engine
  engine.save_pretrained(tmp_path / "resaved")
  return MarianMTModel.from_pretrained(tmp_path / "resaved").eval()


def marian_log_probs(engine, src, tgt):
  """Transformers' log-probability of every target token given the source, [B, T]."""
  import torch
  with torch.no_grad():
    logits = engine(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != PAD_ID),
                    decoder_input_ids=torch.tensor(np.asarray(shift_right(jnp.asarray(tgt))))).logits
  log_probs = torch.log_softmax(logits, -1).numpy()
  return np.take_along_axis(log_probs, tgt[..., None].astype(np.int64), -1)[..., 0]


@needs_engine
@pytest.mark.parametrize("overrides,resaved", [
    ({}, True), ({"scan_layers": True}, True), ({"num_layers": 3, "decoder_layers": 1}, True),
    ({"activation": "swish"}, True), ({"activation": "gelu"}, True),
    ({"positional": "learned"}, False), ({"positional": "none"}, False)])
def test_transformers_scores_targets_as_our_model_does(tmp_path, overrides, resaved):
  """Sinusoidal runs after a re-save by Transformers; the kinds it cannot recompute as written."""
  config = tiny_model_config(vocab_size=VOCAB, **overrides)
  model = Transformer(config)
  params = init_params(model, seed=1)
  engine = load_marian(tmp_path, config, params, resaved=resaved)
  src = random_tokens(np.random.default_rng(0), 4, 14, VOCAB, lengths=[14, 5, 3, 2])
  tgt = random_tokens(np.random.default_rng(1), 4, 20, VOCAB, lengths=[20, 4, 11, 2])
  ours = np.asarray(decoding.forced_log_probs(model, params, jnp.asarray(src), jnp.asarray(tgt)))
  real = tgt != PAD_ID
  np.testing.assert_allclose(marian_log_probs(engine, src, tgt)[real], ours[real], atol=1e-4)


@needs_engine
def test_a_resave_loses_a_learned_table_as_the_export_warns(tmp_path):
  config = tiny_model_config(vocab_size=VOCAB, positional="learned")
  model = Transformer(config)
  params = init_params(model, seed=1)
  src = random_tokens(np.random.default_rng(0), 4, 14, VOCAB, lengths=[14, 5, 3, 2])
  tgt = random_tokens(np.random.default_rng(1), 4, 20, VOCAB, lengths=[20, 4, 11, 2])
  ours = np.asarray(decoding.forced_log_probs(model, params, jnp.asarray(src), jnp.asarray(tgt)))
  resaved = marian_log_probs(load_marian(tmp_path, config, params), src, tgt)
  assert np.abs(resaved - ours)[tgt != PAD_ID].max() > 1e-2


@needs_engine
@pytest.mark.parametrize("scaled", [True, False])
def test_where_marians_layer_norm_epsilon_would_matter_the_scaled_stream_computes_ours(
    tmp_path, scaled):
  """LayerNorm gains and biases of 0.003 keep the stream's variance near the epsilons (1e-6 ours,
  1e-5 Marian's) after each stack's first LayerNorm, where the two LayerNorms part: with the
  stream scaled by sqrt(10) from there on (the export's way), the scores still agree to 1e-4
  after a re-save; unscaled, they do not."""
  config = tiny_model_config(vocab_size=VOCAB)
  model = Transformer(config)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 0 + 0.003 if "norm" in jax.tree_util.keystr(path) else x,
      init_params(model, seed=1))
  engine = load_marian(tmp_path, config, params, scale=None if scaled else 1.0)
  src = random_tokens(np.random.default_rng(0), 4, 14, VOCAB, lengths=[14, 5, 3, 2])
  tgt = random_tokens(np.random.default_rng(1), 4, 20, VOCAB, lengths=[20, 4, 11, 2])
  ours = np.asarray(decoding.forced_log_probs(model, params, jnp.asarray(src), jnp.asarray(tgt)))
  difference = np.abs(marian_log_probs(engine, src, tgt) - ours)[tgt != PAD_ID].max()
  assert (difference < 1e-4) == scaled, difference


@needs_engine
def test_transformers_keeps_the_stored_position_table(tmp_path):
  """What Transformers does with a stored `embed_positions.weight`: it loads it (were it to
  recompute its own [sin | cos] sinusoids, the scores above would disagree)."""
  config = tiny_model_config(vocab_size=VOCAB, positional="learned")
  params = init_params(Transformer(config), seed=1)
  engine = load_marian(tmp_path, config, params, resaved=False)
  stored = marian.marian_tensors(config, params, ROWS)["model.decoder.embed_positions.weight"]
  np.testing.assert_array_equal(engine.model.decoder.embed_positions.weight.detach().numpy(), stored)
  assert engine.lm_head.weight.data_ptr() == engine.model.shared.weight.data_ptr()  # tied


@needs_engine
def test_transformers_greedy_search_writes_our_greedy_outputs(tmp_path):
  """A model that stops by itself (the copy task), both searches well within the limit: the same
  tokens, and their scores agree."""
  import torch
  config, model, params, src = copy_task_model(VOCAB)
  limit = 14
  ours = decoding.decode(decoding.BeamSearch(1, 0.0), model, params, jnp.asarray(src),
                         jnp.full((len(src),), limit), limit)
  from transformers import GenerationConfig
  cfg = base_config()
  cfg.decode.beam_size = 1
  engine = load_marian(tmp_path, config, params)
  settings = GenerationConfig(**marian.generation_settings(cfg, config, ROWS))
  with torch.no_grad():
    out = engine.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(src != PAD_ID),
                          generation_config=settings).numpy()
  theirs = [[t for t in row[1:] if t != PAD_ID] for row in out]  # after the start token
  mine = [[t for t in row if t != PAD_ID] for row in np.asarray(ours.tokens[:, 0])]
  assert theirs == mine
  assert all(row[-1] == EOS_ID and len(row) < limit for row in mine)
  assert len({len(row) for row in mine}) > 1


@pytest.fixture(scope="module")
def run(two_step_run):
  return two_step_run


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
  """The run exported as a user runs it (needs transformers, not torch)."""
  if importlib.util.find_spec("transformers") is None:
    pytest.skip(f"--format=huggingface writes with transformers: {marian.INSTALL}")
  out = tmp_path_factory.mktemp("exported") / "hf"
  done = run_cli("transformer.evaluation.export", f"--workdir={run}", "--format=huggingface",
                 f"--output={out}")
  assert done.returncode == 0, done.stderr
  assert f"wrote a Hugging Face Marian model to {out}" in done.stdout
  return out


def validation_pairs(run, vocab):
  """The fixture's validation pairs whose sides fit the model's length limit."""
  limit = json.loads((run / "config.json").read_text())["data"]["max_len"]
  pairs = [(s, t) for s, t in zip(text_files.read_lines(run.parent / "val.en"),
                                  text_files.read_lines(run.parent / "val.de"))
           if max(len(vocab.encode(s)), len(vocab.encode(t))) < limit]
  assert len(pairs) > 20
  return map(list, zip(*pairs))


def test_export_writes_the_files_configs_and_tokenizer_of_the_run(run, exported):
  """Layout, values and tokenizer, read without torch: the weights are marian_tensors' (checked
  above against Marian's names), the configs the run's, MarianTokenizer's ids ours."""
  from safetensors.numpy import load_file
  from transformers import MarianTokenizer
  assert sorted(p.name for p in exported.iterdir()) == [
      "config.json", "generation_config.json", "model.safetensors", "source.spm", "target.spm",
      "tokenizer_config.json", "vocab.json"]
  stored = json.loads((run / "config.json").read_text())
  rows = stored["data"]["max_len"] + stored["decode"]["max_extra_len"]
  weights = load_file(str(exported / "model.safetensors"))
  model = json.loads((exported / "config.json").read_text())
  assert weights["model.encoder.embed_positions.weight"].shape == (rows, stored["model"]["d_model"])
  assert (model["model_type"], model["max_position_embeddings"], model["encoder_layers"]) == (
      "marian", rows, stored["model"]["num_layers"])
  generation = json.loads((exported / "generation_config.json").read_text())
  assert generation["num_beams"] == stored["decode"]["beam_size"]
  assert generation["length_penalty"] == stored["decode"]["alpha"]
  assert generation["max_length"] == rows + 1
  tokenizer = MarianTokenizer.from_pretrained(exported)
  ours = vocab_lib.load_vocab(run / vocab_lib.VOCAB_FILE)
  assert len(tokenizer) == ours.get_piece_size() == stored["data"]["vocab_size"]
  assert tokenizer.model_max_length == stored["data"]["max_len"]
  sentences, references = validation_pairs(run, ours)
  assert tokenizer(sentences)["input_ids"] == [ours.encode(s) + [EOS_ID] for s in sentences]
  assert tokenizer(text_target=references)["input_ids"] == [ours.encode(t) + [EOS_ID]
                                                           for t in references]
  assert [tokenizer.decode(ours.encode(t), skip_special_tokens=True) for t in references] == references


@needs_engine
def test_exported_run_scores_the_validation_set_as_we_do_and_translates(run, exported, tmp_path):
  """MarianMTModel from the directory alone, saved again by Transformers as push_to_hub or a
  Trainer would: its scores of the references = transformer-translate --score's, token by token;
  generate() translates with the run's search settings."""
  import torch
  from safetensors.numpy import load_file
  from transformers import MarianMTModel, MarianTokenizer
  MarianMTModel.from_pretrained(exported).save_pretrained(tmp_path / "resaved")
  MarianTokenizer.from_pretrained(exported).save_pretrained(tmp_path / "resaved")
  assert "model.encoder.embed_positions.weight" not in load_file(
      str(tmp_path / "resaved" / "model.safetensors"))  # Transformers dropped the stored tables
  tokenizer = MarianTokenizer.from_pretrained(tmp_path / "resaved")
  engine = MarianMTModel.from_pretrained(tmp_path / "resaved").eval()
  ours = vocab_lib.load_vocab(run / vocab_lib.VOCAB_FILE)
  sentences, references = validation_pairs(run, ours)
  (tmp_path / "src.en").write_text("\n".join(sentences) + "\n")
  (tmp_path / "ref.de").write_text("\n".join(references) + "\n")
  scored = run_cli("transformer.evaluation.translate", f"--workdir={run}",
                   f"--input_file={tmp_path / 'src.en'}", f"--score={tmp_path / 'ref.de'}")
  assert scored.returncode == 0, scored.stderr
  batch = tokenizer(sentences, text_target=references, return_tensors="pt", padding=True)
  with torch.no_grad():
    log_probs = torch.log_softmax(engine(**batch).logits, -1)
  lines = scored.stdout.splitlines()
  assert len(lines) == len(sentences)
  for row, line in enumerate(lines):
    expected = json.loads(line)["token_log_probs"]
    labels = batch["labels"][row][:len(expected)]
    theirs = log_probs[row, torch.arange(len(expected)), labels].numpy()
    np.testing.assert_allclose(theirs, expected, atol=1e-4)
  # Translating as the docs show: the generation config alone sets the search (the run's beam).
  batch = tokenizer(sentences[:3], return_tensors="pt", padding=True, truncation=True)
  with torch.no_grad():
    generated = engine.generate(**batch)
  assert generated.shape[1] <= engine.generation_config.max_length
  assert engine.generation_config.num_beams == json.loads((run / "config.json").read_text())["decode"]["beam_size"]
  assert (generated[:, 0] == BOS_ID).all()
  texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
  assert texts == [ours.decode([t for t in row.tolist() if t not in (PAD_ID, BOS_ID, EOS_ID)])
                   for row in generated]


@pytest.mark.parametrize("rows", [0, -5])
def test_a_position_table_of_no_rows_is_refused_before_anything_is_written(run, tmp_path, rows):
  for form in ("huggingface", "ctranslate2"):
    done = run_cli("transformer.evaluation.export", f"--workdir={run}", f"--format={form}",
                   f"--output={tmp_path / form}", f"--max_positions={rows}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (f"--max_positions must be a positive number of rows (the longest input and output "
            f"the engine takes, end token included), got {rows}") in done.stderr
  assert list(tmp_path.iterdir()) == []


def test_a_shorter_position_table_shortens_the_tokenizers_inputs(run, tmp_path):
  if importlib.util.find_spec("transformers") is None:
    pytest.skip(f"--format=huggingface writes with transformers: {marian.INSTALL}")
  from transformers import MarianTokenizer
  done = run_cli("transformer.evaluation.export", f"--workdir={run}", "--format=huggingface",
                 f"--output={tmp_path / 'hf'}", "--max_positions=12")
  assert done.returncode == 0, done.stderr
  tokenizer = MarianTokenizer.from_pretrained(tmp_path / "hf")
  assert tokenizer.model_max_length == 12
  assert len(tokenizer(["a " * 40], truncation=True)["input_ids"][0]) == 12


def test_export_without_transformers_names_the_install_line_and_writes_nothing(run, tmp_path,
                                                                               monkeypatch):
  monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now fails
  with pytest.raises(ConfigError, match=r"--format=huggingface needs the transformers package: "
                                        r"pip install -e '\.\[huggingface\]'"):
    export.export_huggingface(run, tmp_path / "hf")
  assert list(tmp_path.iterdir()) == []
