"""transformer-import --format=huggingface: a Marian model built in Transformers (OPUS-MT's layout:
EOS 0, unknown 1, padding last and the decoder starting from it, swish, a logit bias, two
SentencePiece models over one vocab.json, all trained or drawn here) scores and translates after
the import as Transformers does; a run exported and imported back is the run. Where torch and
transformers are missing these are skipped with the install line."""

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
from helpers import REPO, run_cli

from transformer import decoding
from transformer.data import marian_vocab
from transformer.evaluation import marian
from transformer.tokens import EOS_ID, PAD_ID
from transformer.training.workdir import load_run

needs_engine = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
    reason=f"importing a Marian model needs torch and transformers: {marian.INSTALL}")
SENTENCES = 3000


def train_spm(path, lines, size):
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(path),
                                 vocab_size=size, model_type="bpe", character_coverage=1.0,
                                 pad_id=-1, bos_id=-1, eos_id=0, unk_id=1, minloglevel=2)
  return path.with_suffix(".model")


def opus_like_marian(folder, activation, seed=0):
  """A MarianMTModel with random weights (LayerNorms and the logit bias drawn too) and
  MarianTokenizer over two SentencePiece models trained on the bundled Multi30k, saved in
  `folder`: OPUS-MT's ids (EOS 0, unknown 1, padding last = the decoder's start)."""
  import torch
  from transformers import MarianConfig, MarianMTModel, MarianTokenizer
  data = REPO / "transformer" / "data" / "multi30k"
  text = {lang: gzip.open(data / f"train.{lang}.gz", "rt").read().splitlines()[:SENTENCES]
          for lang in ("en", "de")}
  source, target = (train_spm(folder / f"spm_{lang}", text[lang], 150) for lang in ("en", "de"))
  pieces = ["</s>", "<unk>"]
  for model in (source, target):
    processor = spm.SentencePieceProcessor(model_file=str(model))
    pieces += [processor.id_to_piece(i) for i in range(2, processor.get_piece_size())
               if processor.id_to_piece(i) not in pieces]
  pieces.append("<pad>")
  (folder / "vocab_in.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
  tokenizer = MarianTokenizer(source_spm=str(source), target_spm=str(target),
                              vocab=str(folder / "vocab_in.json"), source_lang="en",
                              target_lang="de")
  size, pad = len(pieces), len(pieces) - 1
  config = MarianConfig(vocab_size=size, decoder_vocab_size=size, d_model=16, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=32, decoder_ffn_dim=32, activation_function=activation,
                        max_position_embeddings=64, pad_token_id=pad, eos_token_id=0,
                        decoder_start_token_id=pad, forced_eos_token_id=0, scale_embedding=True,
                        share_encoder_decoder_embeddings=True)
  torch.manual_seed(seed)
  engine = MarianMTModel(config).eval()
  with torch.no_grad():
    for name, tensor in engine.named_parameters():
      if "layer_norm" in name or name.endswith(".bias"):
        tensor.add_(torch.randn_like(tensor) * 0.3)
      elif "embed_positions" not in name:
        tensor.normal_(0.0, 0.15)
    engine.final_logits_bias.add_(torch.randn_like(engine.final_logits_bias))
    engine.final_logits_bias[0, 0] += 2.0  # EOS: outputs that end before the length limit
  out = folder / "marian"
  engine.save_pretrained(out)
  tokenizer.save_pretrained(out)
  return out, MarianMTModel.from_pretrained(out).eval(), MarianTokenizer.from_pretrained(out)


def imported(model, workdir):
  done = run_cli("transformer.evaluation.marian_import", "--format=huggingface",
                 f"--model={model}", f"--workdir={workdir}")
  assert done.returncode == 0, done.stderr
  assert f"imported {model} into {workdir}" in done.stdout
  return load_run(workdir)


@pytest.fixture(scope="module", params=["swish", "relu"])
def opus(request, tmp_path_factory):
  folder = tmp_path_factory.mktemp(f"opus_{request.param}")
  path, engine, tokenizer = opus_like_marian(folder, request.param)
  return engine, tokenizer, imported(path, folder / "run")


SOURCES = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow.",
           "A little girl climbs into a wooden playhouse.", "People are walking."]
TARGETS = ["Ein Mann in einem blauen Hemd steht auf einer Leiter.", "Zwei Hunde spielen im Schnee.",
           "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "Leute gehen."]


def padded(rows):
  out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def marian_scores(engine, tokenizer):
  """Transformers' log-probability of each token of TARGETS given SOURCES [B, T], and the label ids
  [B, T] (padded with the model's padding id)."""
  import torch
  batch = tokenizer(SOURCES, text_target=TARGETS, padding=True, return_tensors="pt")
  labels = batch["labels"]
  start = torch.full_like(labels[:, :1], engine.config.decoder_start_token_id)
  with torch.no_grad():
    logits = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    decoder_input_ids=torch.cat([start, labels[:, :-1]], 1)).logits
  return torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0].numpy(), labels.numpy()


@needs_engine
def test_the_import_numbers_pieces_as_marians_tokenizer_cuts_them(opus):
  engine, tokenizer, run = opus
  config = run.model.config
  assert (config.activation, config.decoder_start, config.output_bias) == (
      {"swish": "swish", "relu": "relu"}[engine.config.activation_function], "pad", True)
  assert config.layer_norm_epsilon == 1e-5 and isinstance(run.vocab, marian_vocab.MarianVocab)
  for source, target in zip(SOURCES, TARGETS):
    theirs = tokenizer(source).input_ids
    ours = run.vocab.source.encode(source) + [EOS_ID]
    assert [run.vocab.id_to_piece(i) for i in ours] == tokenizer.convert_ids_to_tokens(theirs)
    theirs = tokenizer(text_target=target).input_ids
    ours = run.vocab.target.encode(target) + [EOS_ID]
    assert [run.vocab.id_to_piece(i) for i in ours] == tokenizer.convert_ids_to_tokens(theirs)
    assert run.vocab.decode(ours[:-1]) == tokenizer.decode(theirs, skip_special_tokens=True)


@needs_engine
def test_the_imported_model_scores_targets_as_transformers_does(opus):
  engine, tokenizer, run = opus
  src = [run.vocab.source.encode(s) + [EOS_ID] for s in SOURCES]
  tgt = [run.vocab.target.encode(t) + [EOS_ID] for t in TARGETS]
  ours = np.asarray(decoding.forced_log_probs(run.model, run.params(), jnp.asarray(padded(src)),
                                              jnp.asarray(padded(tgt))))
  theirs, _ = marian_scores(engine, tokenizer)
  for i, row in enumerate(tgt):
    np.testing.assert_allclose(ours[i, :len(row)], theirs[i, :len(row)], atol=1e-4)
  assert np.abs(ours[ours != 0]).min() > 1e-3  # real scores, not a degenerate model


@needs_engine
def test_output_is_decoded_as_marians_tokenizer_decodes_it_pieces_of_the_source_model_too(opus):
  # In a joint vocabulary the model may write a piece only the source SentencePiece model has
  # (names, numbers, copied words); the target model leaves its word-start mark in the text.
  _, tokenizer, run = opus
  target = run.vocab.target.model
  source_only = [i for i in range(run.vocab.get_piece_size())
                 if run.vocab.id_to_piece(i).startswith("\u2581") and
                 target.piece_to_id(run.vocab.id_to_piece(i)) == target.unk_id()]
  assert len(source_only) > 3
  ours = run.vocab.target.encode(TARGETS[0])
  sequences = [ours[:3] + [source_only[0]] + ours[3:], [source_only[1]] + ours,
               ours + source_only[2:4]]
  for ids in sequences:
    theirs = tokenizer.convert_tokens_to_ids([run.vocab.id_to_piece(i) for i in ids])
    expected = tokenizer.decode(theirs, skip_special_tokens=True)
    assert run.vocab.decode(ids) == expected
    assert "\u2581" not in run.vocab.decode(ids)


@needs_engine
def test_the_imported_model_searches_greedily_as_transformers_does(opus):
  import torch
  engine, tokenizer, run = opus
  limit = 24
  src = [run.vocab.source.encode(s) + [EOS_ID] for s in SOURCES]
  ours = decoding.decode(decoding.BeamSearch(1, 0.0), run.model, run.params(),
                         jnp.asarray(padded(src)), jnp.full((len(src),), limit), limit)
  batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
  with torch.no_grad():
    out = engine.generate(**batch, num_beams=1, do_sample=False, max_length=limit + 1,
                          suppress_tokens=[engine.config.pad_token_id],
                          forced_eos_token_id=0).numpy()
  # Both force EOS at the limit (ours at its last position, theirs with forced_eos_token_id), so
  # outputs that reach it compare too.
  for i, row in enumerate(np.asarray(ours.tokens[:, 0])):
    mine = [run.vocab.id_to_piece(t) for t in row if t != PAD_ID]
    theirs = [p for p in tokenizer.convert_ids_to_tokens(out[i, 1:]) if p != "<pad>"]
    assert mine == theirs
  assert len({tuple(row) for row in np.asarray(ours.tokens[:, 0])}) > 1


@needs_engine
def test_a_run_exported_to_marian_and_imported_back_is_the_run(two_step_run, tmp_path):
  """Through Transformers' own re-save: bit-identical parameters, identical translations."""
  from transformers import MarianMTModel, MarianTokenizer
  exported = tmp_path / "hf"
  done = run_cli("transformer.evaluation.export", f"--workdir={two_step_run}",
                 "--format=huggingface", f"--output={exported}")
  assert done.returncode == 0, done.stderr
  MarianMTModel.from_pretrained(exported).save_pretrained(tmp_path / "resaved")
  MarianTokenizer.from_pretrained(exported).save_pretrained(tmp_path / "resaved")
  original, back = load_run(two_step_run), imported(tmp_path / "resaved", tmp_path / "back")
  for key in ("vocab_size", "num_layers", "num_decoder_layers", "d_model", "d_ff", "num_heads",
              "positional", "activation", "output_bias", "decoder_start", "layer_norm_epsilon"):
    assert getattr(back.model.config, key) == getattr(original.model.config, key), key
  assert jax.tree.structure(back.params()) == jax.tree.structure(original.params())
  for a, b in zip(jax.tree.leaves(original.params()), jax.tree.leaves(back.params())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  sentences = SOURCES + ["A dog.", "Ein Hund."]
  translations = []
  for run in (original, back):
    src = padded([run.vocab.encode(s) + [EOS_ID] for s in sentences])
    found = decoding.decode(decoding.BeamSearch(4, 0.6), run.model, run.params(),
                            jnp.asarray(src), jnp.full((len(src),), 20), 20)
    translations.append([run.vocab.decode([t for t in row if t > EOS_ID])
                         for row in np.asarray(found.tokens[:, 0])])
  assert translations[0] == translations[1]


def test_a_folder_that_holds_no_marian_model_is_refused_in_one_line(tmp_path):
  if importlib.util.find_spec("transformers") is None:
    pytest.skip(f"transformer-import needs transformers: {marian.INSTALL}")
  done = run_cli("transformer.evaluation.marian_import", f"--model={tmp_path}",
                 f"--workdir={tmp_path / 'run'}")
  assert done.returncode != 0
  assert f"--model={tmp_path} holds no config.json: it is not a Marian model's folder" in done.stderr
  assert not (tmp_path / "run").exists()


def test_an_installed_package_without_the_default_config_asks_for_one(tmp_path):
  """Outside a repository checkout (a non-editable install) there is no configs/multi30k.py."""
  program = ("import sys; from pathlib import Path; from transformer.evaluation import marian_import as m; "
             f"m.DEFAULT_CONFIG = Path({str(tmp_path / 'configs' / 'multi30k.py')!r}); m.run()")
  done = subprocess.run([sys.executable, "-c", program, f"--model={tmp_path}",
                         f"--workdir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 2, done.stderr
  assert done.stderr.strip().splitlines()[-1] == (
      "transformer-import: error: pass --config=A_CONFIG_FILE (its data, training and decoding "
      "settings; e.g. configs/multi30k.py of the repository): the default, "
      f"{tmp_path / 'configs' / 'multi30k.py'}, is not there (an installed package has no "
      "configs/ folder)")
  assert not (tmp_path / "run").exists()


@needs_engine
@pytest.mark.slow
@pytest.mark.parametrize("opus", ["swish"], indirect=True)
def test_a_fine_tune_of_an_import_starts_at_its_loss_and_lowers_it(opus, tmp_path):
  """train.init_from: the architecture and vocabulary come with the parameters; the first step's
  loss is the imported model's on that batch (nothing re-initialised), and training lowers it."""
  from helpers import tiny_run_config

  from transformer.data import pipeline
  from transformer.data.loader import PipelineState
  from transformer.metrics import read_metrics
  from transformer.training.train import train_and_evaluate
  _, _, run = opus
  cfg = tiny_run_config(tmp_path)
  cfg.train.init_from = str(run.workdir)
  cfg.model.dropout = 0.0  # a training-only key the fine-tune sets itself
  cfg.train.ema_decay = 0.9  # a moving average too, started from the imported parameters
  cfg.train.steps, cfg.train.log_every, cfg.train.eval_every = 40, 1, 40
  cfg.train.warmup_steps, cfg.train.learning_rate = 10, 0.5
  train_and_evaluate(cfg, str(tmp_path / "tuned"))
  assert (tmp_path / "tuned" / marian_vocab.MARIAN_VOCAB_FILE).read_bytes() == (
      run.workdir / marian_vocab.MARIAN_VOCAB_FILE).read_bytes()
  records = read_metrics(tmp_path / "tuned", "train")
  stored = json.loads((tmp_path / "tuned" / "config.json").read_text())
  assert stored["model"]["activation"] == run.config.model.activation
  assert stored["data"]["vocab_size"] == run.config.data.vocab_size
  from transformer.training.checkpoints import load_run_config
  _, loader, _ = pipeline.training_inputs(load_run_config(tmp_path / "tuned"), tmp_path / "tuned", 1)
  batch, _ = next(loader.batches(PipelineState()))
  scores = np.asarray(decoding.forced_log_probs(run.model, run.params(), jnp.asarray(batch["src"]),
                                                jnp.asarray(batch["tgt"])))
  expected = -scores.sum() / (batch["tgt"] != PAD_ID).sum()
  assert records[0]["nll"] == pytest.approx(expected, rel=1e-4)
  assert np.mean([r["nll"] for r in records[-5:]]) < 0.8 * records[0]["nll"]


@needs_engine
@pytest.mark.slow
@pytest.mark.parametrize("opus", ["swish"], indirect=True)
def test_every_program_takes_an_imported_run_as_a_trained_one(opus, tmp_path):
  """As a user runs them: translate (scores checked against Transformers, n-best, an ensemble),
  export to both formats (the Marian export scores as the model imported), attention maps."""
  from transformers import MarianMTModel, MarianTokenizer
  engine, tokenizer, run = opus
  (tmp_path / "in.en").write_text("\n".join(SOURCES) + "\n")
  (tmp_path / "in.de").write_text("\n".join(TARGETS) + "\n")
  workdir = f"--workdir={run.workdir}"
  done = run_cli("transformer.evaluation.translate", workdir, f"--input_file={tmp_path / 'in.en'}",
                 f"--score={tmp_path / 'in.de'}")
  assert done.returncode == 0, done.stderr
  scores = [json.loads(line)["log_prob"] for line in done.stdout.splitlines()]
  theirs, labels = marian_scores(engine, tokenizer)
  theirs = (theirs * (labels != engine.config.pad_token_id)).sum(1)
  np.testing.assert_allclose(scores, theirs, atol=1e-3)
  done = run_cli("transformer.evaluation.translate", workdir, f"--input_file={tmp_path / 'in.en'}",
                 "--nbest=2", f"--ensemble={run.workdir}")
  assert done.returncode == 0, done.stderr
  assert [len(json.loads(line)["hypotheses"]) for line in done.stdout.splitlines()] == [2] * 4
  for form in ("huggingface", "ctranslate2"):
    done = run_cli("transformer.evaluation.export", workdir, f"--format={form}",
                   f"--output={tmp_path / form}")
    assert done.returncode == 0, done.stderr
  assert (tmp_path / "ctranslate2" / "source.spm").is_file()
  back, back_tokenizer = (MarianMTModel.from_pretrained(tmp_path / "huggingface").eval(),
                          MarianTokenizer.from_pretrained(tmp_path / "huggingface"))
  exported, again = marian_scores(back, back_tokenizer)
  assert [back_tokenizer.convert_ids_to_tokens(row) for row in again] == [
      tokenizer.convert_ids_to_tokens(row) for row in labels]
  exported = (exported * (again != back.config.pad_token_id)).sum(1)
  np.testing.assert_allclose(exported, theirs, atol=1e-3)
  done = run_cli("transformer.visualisation.attention_maps", workdir, f"--source={SOURCES[1]}",
                 f"--output_dir={tmp_path / 'maps'}")
  assert done.returncode == 0, done.stderr
  assert (tmp_path / "maps" / "attention.npz").is_file()


@needs_engine
@pytest.mark.slow
@pytest.mark.parametrize("opus", ["relu"], indirect=True)
def test_a_hub_name_is_read_from_the_hubs_cache_as_transformers_fetches_it(opus, tmp_path,
                                                                           monkeypatch):
  """`--model=ORG/NAME`: Transformers' own hub loader, offline here, over a hub cache laid out as a
  download leaves it (models--ORG--NAME/snapshots/<commit>/, refs/main)."""
  import shutil
  _, _, run = opus
  repo = tmp_path / "hub" / "hub" / "models--local-org--opus-mt-test"
  shutil.copytree(run.workdir.parent / "marian", repo / "snapshots" / "0123abcd")
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text("0123abcd")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hub"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  done = run_cli("transformer.evaluation.marian_import", "--model=local-org/opus-mt-test",
                 f"--workdir={tmp_path / 'run'}")
  assert done.returncode == 0, done.stderr
  assert (tmp_path / "run" / marian_vocab.MARIAN_VOCAB_FILE).read_bytes() == (
      run.workdir / marian_vocab.MARIAN_VOCAB_FILE).read_bytes()
  fetched = load_run(tmp_path / "run")
  for a, b in zip(jax.tree.leaves(fetched.params()), jax.tree.leaves(run.params())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_engine
@pytest.mark.parametrize("opus", ["relu"], indirect=True)
def test_what_the_import_cannot_take_is_refused_in_one_line_and_nothing_is_written(
    opus, tmp_path, monkeypatch):
  import shutil
  import sys

  from transformers import MarianConfig

  from transformer.config import base_config
  from transformer.errors import ConfigError
  from transformer.evaluation.marian_import import import_marian
  _, _, run = opus
  source = run.workdir.parent / "marian"
  cfg = base_config()

  def refused(model, message, workdir=None):
    workdir = workdir or tmp_path / "new"
    before = sorted(p.name for p in workdir.iterdir()) if workdir.exists() else None
    with pytest.raises(ConfigError, match=message):
      import_marian(str(model), workdir, cfg)
    assert (sorted(p.name for p in workdir.iterdir()) if workdir.exists() else None) == before
    assert not workdir.with_name(workdir.name + ".partial").exists()

  refused(source, "exists and is not empty", workdir=run.workdir)
  for name in ("target.spm", "vocab.json"):
    broken = tmp_path / f"no_{name}"
    shutil.copytree(source, broken)
    (broken / name).unlink()
    refused(broken, f"has no {name}: a Marian model's folder holds MarianTokenizer's files")
  # What the config alone refuses is refused before the weights are read: these weights are cut
  # short, and the refusal is still the config's.
  for change, message in (
      ({"share_encoder_decoder_embeddings": False}, "source and target embeddings are separate"),
      ({"tie_word_embeddings": False}, "its output layer is a matrix of its own "
                                       r"\(tie_word_embeddings=False, lm_head.weight\)"),
      ({"decoder_attention_heads": 2}, "differ in heads or feed-forward width"),
      ({"activation_function": "tanh"}, "activation 'tanh' is not one of"),
      ({"scale_embedding": False}, "embeddings are not scaled")):
    variant = tmp_path / f"variant_{next(iter(change))}"
    shutil.copytree(source, variant)
    config = MarianConfig.from_pretrained(variant)
    for key, value in change.items():
      setattr(config, key, value)
    config.save_pretrained(variant)
    os.truncate(variant / "model.safetensors", 100)
    refused(variant, message)
  truncated = tmp_path / "truncated"
  shutil.copytree(source, truncated)
  os.truncate(truncated / "model.safetensors", 1000)
  refused(truncated, f"--model={truncated}: Transformers cannot load a Marian model and tokenizer "
                     "there")
  # A mistyped folder is not tried on the hub for a minute: one line says it is neither.
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  started = time.monotonic()
  refused(tmp_path / "mistyped", "no such folder here, and no hub model of that name can be "
                                 r"fetched \(HF_HUB_OFFLINE is set")
  assert time.monotonic() - started < 10
  monkeypatch.setitem(sys.modules, "torch", None)
  refused(source, r"reads the model with torch: pip install -e '\.\[huggingface\]'")
