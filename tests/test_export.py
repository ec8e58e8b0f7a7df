"""transformer-export --format=ctranslate2: CTranslate2 computes what our model computes and finds
what our beam search finds. Skipped where ctranslate2 is not installed (CI installs it)."""

import json

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
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.evaluation import export
from transformer.model import positions
from transformer.model.transformer import EOS_ID, PAD_ID, Transformer

ctranslate2 = pytest.importorskip("ctranslate2")
VOCAB = 24
PIECES = ["<pad>", "</s>", "<s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB)]


def pieces(row):
  """A row of ids as the pieces CTranslate2 takes: no EOS (it appends one), no padding."""
  return [PIECES[t] for t in np.asarray(row) if t not in (PAD_ID, EOS_ID)]


def translator(tmp_path, config, params, max_positions=32):
  (tmp_path / "ct2").mkdir()
  export.ctranslate2_spec(config, params, PIECES, max_positions).save(str(tmp_path / "ct2"))
  return ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")


@pytest.mark.parametrize("overrides", [{}, {"norm": "pre", "positional": "learned"},
                                       {"share_embeddings": False}, {"scan_layers": True},
                                       {"d_k": 8, "d_v": 8},
                                       {"num_layers": 3, "decoder_layers": 1},
                                       {"activation": "swish"}, {"activation": "gelu"}])
def test_ctranslate2_scores_targets_as_our_model_does(tmp_path, overrides):
  config = tiny_model_config(vocab_size=VOCAB, **overrides)
  model = Transformer(config)
  params = init_params(model, seed=1)
  src = random_tokens(np.random.default_rng(0), 4, 6, VOCAB, lengths=[6, 5, 3, 2])
  tgt = random_tokens(np.random.default_rng(1), 4, 9, VOCAB, lengths=[9, 4, 5, 2])
  ours = np.asarray(decoding.forced_log_probs(model, params, jnp.asarray(src), jnp.asarray(tgt)))
  theirs = translator(tmp_path, config, params).score_batch([pieces(r) for r in src],
                                                            [pieces(r) for r in tgt])
  for row, result in enumerate(theirs):  # one log-probability per target token, EOS included
    np.testing.assert_allclose(result.log_probs, ours[row][tgt[row] != PAD_ID], atol=1e-4)


@pytest.mark.parametrize("overrides", [{"output_bias": True},
                                       {"decoder_start": "pad", "layer_norm_epsilon": 1e-5,
                                        "activation": "swish", "output_bias": True}])
def test_ctranslate2_scores_and_searches_with_marians_options_as_our_model_does(tmp_path, overrides):
  """A per-word logit bias, decoding that starts from padding, Marian's epsilon (an imported OPUS-MT
  model's options): the same scores, and the same greedy outputs (the start token never written)."""
  config = tiny_model_config(vocab_size=VOCAB, **overrides)
  model = Transformer(config)
  params = init_params(model, seed=2)
  bias = np.random.default_rng(3).normal(0, 0.5, VOCAB).astype(np.float32)
  bias[EOS_ID] += 4.0  # outputs that end before the length limit
  params["decoder"]["output_bias"] = bias
  src = random_tokens(np.random.default_rng(0), 4, 6, VOCAB, lengths=[6, 5, 3, 2])
  tgt = random_tokens(np.random.default_rng(1), 4, 9, VOCAB, lengths=[9, 4, 5, 2])
  ours = np.asarray(decoding.forced_log_probs(model, params, jnp.asarray(src), jnp.asarray(tgt)))
  engine = translator(tmp_path, config, params)
  theirs = engine.score_batch([pieces(r) for r in src], [pieces(r) for r in tgt])
  for row, result in enumerate(theirs):
    np.testing.assert_allclose(result.log_probs, ours[row][tgt[row] != PAD_ID], atol=1e-4)
  limit = 10
  found = decoding.decode(decoding.BeamSearch(1, 0.0), model, params, jnp.asarray(src),
                          jnp.full((len(src),), limit), limit)
  # CTranslate2 forbids none of the model's tokens: padding and the start token are suppressed as
  # our searches forbid them (docs/evaluating.md says so).
  suppress = [[PIECES[i]] for i in config.never_written]
  hypotheses = engine.translate_batch([pieces(r) for r in src], beam_size=1,
                                      max_decoding_length=limit, min_decoding_length=0,
                                      suppress_sequences=suppress)
  compared = 0
  for row, result in zip(np.asarray(found.tokens[:, 0]), hypotheses):
    if EOS_ID in row[:limit - 1]:  # ours ended before the limit, where both stop alike
      assert result.hypotheses[0] == pieces(row)
      compared += 1
  assert compared >= 2


@pytest.mark.slow
def test_ctranslate2_beam_search_finds_our_hypotheses(tmp_path):
  """Same best hypotheses (beam 4, no length penalty: CTranslate2's penalty is length^alpha, ours
  GNMT's), and the log-probabilities the two engines give them agree to 1e-4."""
  config, model, params, src = copy_task_model(VOCAB)
  limit = 14
  ours = decoding.decode(decoding.BeamSearch(4, 0.0), model, params, jnp.asarray(src),
                         jnp.full((len(src),), limit), limit)
  engine = translator(tmp_path, config, params)
  theirs = engine.translate_batch([pieces(r) for r in src], beam_size=4, length_penalty=0.0,
                                  max_decoding_length=limit)
  best = [h.hypotheses[0] for h in theirs]
  assert best == [pieces(r) for r in ours.tokens[:, 0]]
  assert [len(h) for h in best] != [len(h) for h in best[:1]] * len(best)  # lengths of their own
  # CTranslate2's search renormalises over the tokens it allows; its scoring is the model's.
  scored = engine.score_batch([pieces(r) for r in src], best)
  np.testing.assert_allclose([sum(s.log_probs) for s in scored], ours.log_probs[:, 0], atol=1e-4)


@pytest.fixture(scope="module")
def run(two_step_run):
  return two_step_run


def test_transformer_export_writes_a_model_that_ctranslate2_serves(run, tmp_path):
  out = tmp_path / "ct2"
  done = run_cli("transformer.evaluation.export", f"--workdir={run}", "--format=ctranslate2",
                 f"--output={out}")
  assert done.returncode == 0, done.stderr
  assert f"wrote a CTranslate2 model to {out}" in done.stdout
  assert json.loads((out / "config.json").read_text())["add_source_eos"] is True
  vocab = vocab_lib.load_vocab(out / vocab_lib.VOCAB_FILE)
  sentences = ["A man is riding a bike.", "Two dogs play in the snow."]
  src = [vocab.encode(s, out_type=str) for s in sentences]
  engine = ctranslate2.Translator(str(out), device="cpu")
  translations = [vocab.decode_pieces(r.hypotheses[0]) for r in engine.translate_batch(
      src, beam_size=2, max_decoding_length=6)]
  (tmp_path / "src.en").write_text("\n".join(sentences) + "\n")
  (tmp_path / "hyp.de").write_text("\n".join(translations) + "\n")
  scored = run_cli("transformer.evaluation.translate", f"--workdir={run}", f"--input_file={tmp_path / 'src.en'}",
                   f"--score={tmp_path / 'hyp.de'}")
  assert scored.returncode == 0, scored.stderr
  # Our forced log-probabilities of the engine's translations are the engine's own.
  targets = [vocab.encode(t, out_type=str) for t in translations]
  for result, line in zip(engine.score_batch(src, targets), scored.stdout.splitlines(), strict=True):
    assert json.loads(line)["log_prob"] == pytest.approx(sum(result.log_probs), abs=1e-4)


def test_export_refuses_a_directory_in_use_and_says_so(run, tmp_path):
  (tmp_path / "taken").mkdir()
  (tmp_path / "taken" / "notes.txt").write_text("mine")
  done = run_cli("transformer.evaluation.export", f"--workdir={run}", f"--output={tmp_path / 'taken'}")
  assert done.returncode != 0
  assert "exists and is not empty; choose a new directory" in done.stderr
  assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


@pytest.mark.slow  # the default run exports sinusoidal and learned models above
@pytest.mark.parametrize("kind", positions.kinds())
def test_every_kind_exports_where_ctranslate2_holds_it_and_is_refused_clearly_elsewhere(tmp_path,
                                                                                        kind):
  """Scored alike by both engines over targets longer than the relative clip and the T5 buckets'
  exact range, or one line saying CTranslate2 cannot hold the kind and why (ALiBi: its encoder has
  none)."""
  options = (("relative_clip", 3), ("t5_buckets", 8), ("t5_max_distance", 12))
  config = tiny_model_config(vocab_size=VOCAB, positional=kind, position_options=options)
  model = Transformer(config)
  params = init_params(model, seed=1)
  src = random_tokens(np.random.default_rng(0), 3, 14, VOCAB, lengths=[14, 9, 3])
  tgt = random_tokens(np.random.default_rng(1), 3, 16, VOCAB, lengths=[16, 4, 11])
  if not positions.in_ctranslate2(kind):
    with pytest.raises(ConfigError, match=f"CTranslate2 cannot hold {kind!r} positions "
                                          rf"\({positions.get(kind).not_in_ctranslate2}\)"):
      translator(tmp_path, config, params)
    return
  engine = translator(tmp_path, config, params)
  ours = np.asarray(decoding.forced_log_probs(model, params, jnp.asarray(src), jnp.asarray(tgt)))
  theirs = engine.score_batch([pieces(r) for r in src], [pieces(r) for r in tgt])
  for row, result in enumerate(theirs):
    np.testing.assert_allclose(result.log_probs, ours[row][tgt[row] != PAD_ID], atol=1e-4)
