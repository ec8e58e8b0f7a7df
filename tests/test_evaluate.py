"""translator: order kept, empty and over-long lines handled, the same tokens as a direct search,
n-best lists, sampling independent of batching, forced scores equal to training's dev loss."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from helpers import init_params, run_cli, tiny_model_config, tiny_run_config
from sentencepiece import sentencepiece_model_pb2

from transformer import decoding
from transformer.config import ConfigError, base_config
from transformer.data import sources
from transformer.data import vocab as vocab_lib
from transformer.decoding import translator
from transformer.decoding.translator import SearchSettings, translate
from transformer.evaluation.evaluate import evaluate
from transformer.metrics import read_metrics
from transformer.model.transformer import EOS_ID, PAD_ID, Transformer
from transformer.training.train import train_and_evaluate
from transformer.training.workdir import load_run


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  text = sources.load_split(base_config().data, "validation")
  path = tmp_path_factory.mktemp("vocab") / vocab_lib.VOCAB_FILE
  return vocab_lib.train_vocab(text.source + text.target, path, 300)


@pytest.mark.parametrize("positional", ["sinusoidal", pytest.param("learned", marks=pytest.mark.slow)])
def test_translate_keeps_order_and_handles_empty_and_long_lines(vocab, positional):
  model = Transformer(tiny_model_config(vocab_size=300, positional=positional, max_len=20))
  params = init_params(model, scale=2.0)
  sentences = ["A dog runs on the beach.", "", "Two men are playing football in a big park "
               "while a woman with a red hat watches them from a bench.", "A girl.", "   "]
  result = translate(model, params, vocab, sentences,
                     SearchSettings(beam_size=1, max_extra_len=5, tokens_per_batch=64),
                     max_source_len=20)
  hypotheses, stats = result.hypotheses, result.stats
  assert len(hypotheses) == 5 and hypotheses[1] == "" and hypotheses[4] == ""
  assert stats["truncated_sources"] == 1 and stats["sentences"] == 5
  for sentence, hypothesis in zip(sentences, hypotheses):
    if not sentence.strip():
      continue
    ids = vocab.encode(sentence)[:19] + [EOS_ID]  # truncated to max_source_len with EOS
    src = jnp.asarray([ids])
    limit = min(len(ids) + 5, 20) if positional == "learned" else len(ids) + 5
    tokens = np.asarray(decoding.decode(decoding.Greedy(), model, params, src, jnp.array([limit]),
                                        limit).tokens)[0, 0]
    tokens = tokens.tolist()
    tokens = tokens[:tokens.index(EOS_ID)] if EOS_ID in tokens else tokens
    assert hypothesis == vocab.decode(tokens)


def always_eos(model, params):
  """`params` changed so the decoder prefers EOS at every step: the last layer's final layer norm
  outputs a constant vector that points along EOS's (tied) output embedding, made the longest."""
  params = jax.tree.map(lambda x: x, params)
  embedding = params["embed"]["embedding"].at[EOS_ID].multiply(4.0)
  params["embed"]["embedding"] = embedding
  last = params["decoder"][f"layer_{model.config.num_layers - 1}"]["ffn_norm"]
  last["scale"] = jnp.zeros_like(last["scale"])
  last["bias"] = embedding[EOS_ID]
  return params


# The slot loop forbids early EOS for every search alike, and greedy search's minimum lengths are
# checked against the reference in test_long_outputs.py: greedy and sampling run here with -m slow.
@pytest.mark.parametrize("search", [dict(beam_size=3, nbest=3),
                                    pytest.param(dict(beam_size=1), marks=pytest.mark.slow),
                                    pytest.param(dict(search="sample", top_k=1),
                                                 marks=pytest.mark.slow)])
def test_min_len_rules_out_the_empty_translation_and_yields_to_the_length_limit(vocab, search):
  model = Transformer(tiny_model_config(vocab_size=300))
  params = always_eos(model, init_params(model))
  sentences = ["A dog runs on the beach.", "A girl.", "Two men are playing football in a park."]
  limits = [len(vocab.encode(s)) + 1 + 2 for s in sentences]  # source with EOS + max_extra_len
  for min_len in (0, 1, 4):
    settings = SearchSettings(max_extra_len=2, min_len=min_len, tokens_per_batch=64, **search)
    result = translate(model, params, vocab, sentences, settings, max_source_len=32)
    for hypotheses, limit in zip(result.nbest, limits):
      # The model wants EOS at once: the best has exactly min_len tokens before it, or as many as
      # the limit leaves (with min_len 0 the empty translation); none of the n best has fewer.
      shortest = min(min_len + 1, limit)
      assert hypotheses[0]["tokens"] == shortest
      assert all(h["tokens"] >= shortest for h in hypotheses)
      assert (hypotheses[0]["text"] == "") == (min_len == 0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny finished run that keeps a moving average of its parameters: (config, workdir)."""
  tmp = tmp_path_factory.mktemp("trained")
  cfg = tiny_run_config(tmp)
  cfg.train.ema_decay = 0.9
  train_and_evaluate(cfg, str(tmp / "run"))
  return cfg, tmp / "run"


@pytest.mark.parametrize("ema", [True, False])
def test_mean_forced_nll_on_the_dev_set_is_trainings_dev_loss(trained, ema):
  """The moving average's (loaded by default) and the raw parameters' forced NLL equal the dev
  losses training logged for each: the programs load the parameters training evaluated."""
  cfg, workdir = trained
  run = load_run(workdir)
  cfg, vocab, model, params, steps = run.config, run.vocab, run.model, run.params(ema), run.steps
  text = sources.load_split(cfg.data, cfg.data.eval_split)
  pairs = [(s, t) for s, t in zip(text.source, text.target)  # training's eval keeps these pairs
           if max(len(vocab.encode(s)), len(vocab.encode(t))) + 1 <= cfg.data.max_len]
  scores = translator.score(model, params, vocab, [s for s, _ in pairs], [t for _, t in pairs],
                            tokens_per_batch=128, max_len=cfg.data.max_len)
  nll = -sum(s["log_prob"] for s in scores) / sum(s["tokens"] for s in scores)
  dev = [r for r in read_metrics(workdir, "eval") if r["step"] == steps[-1]][0]
  assert sum(s["tokens"] for s in scores) == dev["tokens"]
  assert nll == pytest.approx(dev["ema_nll" if ema else "nll"], rel=1e-4)
  assert abs(dev["ema_nll"] - dev["nll"]) > 1e-3  # the two are different models
  first = scores[0]
  assert len(first["token_log_probs"]) == len(first["pieces"]) == first["tokens"]
  assert first["pieces"][-1] == "</s>" and first["log_prob"] == pytest.approx(
      sum(first["token_log_probs"]), rel=1e-6)


def test_nbest_lists_are_the_searchs_and_start_with_the_translation(trained):
  cfg, workdir = trained
  run = load_run(workdir)
  cfg, vocab, model, params = run.config, run.vocab, run.model, run.params()
  sentences = sources.load_split(cfg.data, cfg.data.eval_split).source[:12]
  settings = SearchSettings(beam_size=3, nbest=3, max_extra_len=5, tokens_per_batch=48)
  result = translate(model, params, vocab, sentences, settings, max_source_len=cfg.data.max_len)
  single = translate(model, params, vocab, sentences,
                     SearchSettings(beam_size=3, max_extra_len=5, tokens_per_batch=1000),
                     max_source_len=cfg.data.max_len)
  assert result.hypotheses == single.hypotheses
  # The reference: each sentence searched alone, padded to one shape (one compilation; padding is
  # masked out) and stopped at its own length limit.
  ids = [vocab.encode(sentence)[:cfg.data.max_len - 1] + [EOS_ID] for sentence in sentences]
  width = max(map(len, ids))
  for ids_one, nbest, best in zip(ids, result.nbest, result.hypotheses):
    assert len(nbest) == 3 and nbest[0]["text"] == best
    assert [h["score"] for h in nbest] == sorted((h["score"] for h in nbest), reverse=True)
    padded = jnp.asarray([ids_one + [PAD_ID] * (width - len(ids_one))])
    found = decoding.decode(decoding.BeamSearch(beam_size=3, alpha=0.6, nbest=3), model, params,
                            padded, jnp.array([len(ids_one) + 5]), width + 5)
    for h, row, score in zip(nbest, np.asarray(found.tokens[0]), np.asarray(found.scores[0])):
      n = int((row != 0).sum())
      assert h["text"] == vocab.decode(row[:n - 1].tolist()) and h["tokens"] == n
      assert h["score"] == pytest.approx(float(score), abs=1e-5)
      assert h["log_prob"] == pytest.approx(float(score) * ((5 + n) / 6) ** 0.6, abs=1e-4)


@pytest.mark.slow
def test_bfloat16_search_scores_its_hypotheses_as_the_float32_model_does(trained):
  """Quantised decoding: the bf16 search's log-probabilities are the float32 model's up to bf16
  rounding, and its translations mostly the same; its reports get their own name."""
  cfg, workdir = trained
  run = load_run(workdir)
  cfg, vocab, model, params = run.config, run.vocab, run.model, run.params()
  sentences = sources.load_split(cfg.data, cfg.data.eval_split).source[:16]
  settings = SearchSettings(beam_size=3, max_extra_len=5, tokens_per_batch=1000)
  half = dataclasses.replace(settings, matmul_dtype="bfloat16")
  models, cast = translator.with_matmul_dtype([model], [params], "bfloat16")
  assert models[0].config.matmul_dtype == jnp.bfloat16
  kinds = {(jax.tree_util.keystr(path).split("'")[-2], x.dtype)
           for path, x in jax.tree_util.tree_leaves_with_path(cast)}
  assert {name for name, dtype in kinds if dtype == jnp.bfloat16} == {"kernel", "embedding"}
  assert {name for name, dtype in kinds if dtype == jnp.float32} == {"bias", "scale"}
  ids = [vocab.encode(s)[:cfg.data.max_len - 1] + [EOS_ID] for s in sentences]
  full, _ = translator.search_ids(model, params, ids, settings, cfg.data.max_len)
  quantised, _ = translator.search_ids(model, params, ids, half, cfg.data.max_len)
  found = [hypotheses[0][0] for hypotheses in quantised]
  src = jnp.asarray([i + [PAD_ID] * (cfg.data.max_len - len(i)) for i in ids])
  width = max(map(len, found))
  tgt = jnp.asarray([t + [PAD_ID] * (width - len(t)) for t in found])
  exact = np.asarray(decoding.forced_log_probs(model, params, src, tgt)).sum(-1)
  rounded = np.asarray(decoding.forced_log_probs(models[0], cast[0], src, tgt)).sum(-1)
  # The search's log-probabilities are the bf16 model's, within bf16 rounding of the exact ones.
  np.testing.assert_allclose([h[0][2] for h in quantised], rounded, rtol=1e-4, atol=1e-3)
  per_token = np.abs(rounded - exact) / np.array([len(t) for t in found])
  assert 0 < per_token.max() < 0.02, per_token  # nats per token
  assert sum(a[0][0] == b[0][0] for a, b in zip(full, quantised)) >= 12
  assert half.tag(settings) == "_bfloat16" and half.describe()["matmul_dtype"] == "bfloat16"
  # Only the projection onto the vocabulary rounded: the same agreement with its own model.
  vocab_only = dataclasses.replace(settings, matmul_dtype="bfloat16_vocab")
  models, cast = translator.with_matmul_dtype([model], [params], "bfloat16_vocab")
  searched, _ = translator.search_ids(model, params, ids, vocab_only, cfg.data.max_len)
  found = [hypotheses[0][0] for hypotheses in searched]
  width = max(map(len, found))
  tgt = jnp.asarray([t + [PAD_ID] * (width - len(t)) for t in found])
  rounded = np.asarray(decoding.forced_log_probs(models[0], cast[0], src, tgt)).sum(-1)
  np.testing.assert_allclose([h[0][2] for h in searched], rounded, rtol=1e-4, atol=1e-3)
  assert sum(a[0][0] == b[0][0] for a, b in zip(full, searched)) >= 12
  assert vocab_only.tag(settings) == "_bfloat16_vocab"
  with pytest.raises(ConfigError, match="--matmul_dtype must be one of float32, bfloat16, "
                     "bfloat16_vocab"):
    dataclasses.replace(settings, matmul_dtype="int4").check()


# Translates the first 40 validation sentences of a run three ways; prints each one's n-best lists.
SEARCHES_ON_DEVICES = """
import dataclasses, json, sys
import jax
from transformer.data import sources
from transformer.training.workdir import load_run
from transformer.decoding.translator import SearchSettings, translate
run = load_run(sys.argv[1])
sentences = sources.load_split(run.config.data, run.config.data.eval_split).source[:40]
sentences[7] = ""  # an empty line, and with 40 sentences over 3 devices, uneven shares and padding
out = {"devices": jax.device_count()}
for name, settings in {"beam": SearchSettings(beam_size=3, nbest=2, max_extra_len=5),
                       "greedy": SearchSettings(beam_size=1, max_extra_len=5),
                       "sample": SearchSettings(search="sample", top_k=20, seed=1, max_extra_len=5)
                       }.items():
  found = translate(run.model, run.params(), run.vocab, sentences,
                    dataclasses.replace(settings, tokens_per_batch=96), run.config.data.max_len)
  out[name] = [[(h["text"], h["score"]) for h in n] for n in found.nbest]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_each_device_translates_its_own_share_and_the_translations_do_not_change(trained):
  """On 3 CPU devices every device decodes its own rows of each queue in its own loop: the same
  hypotheses (and n-best lists, and samples) come back for every sentence as on one device, scores
  to float rounding, each in its sentence's place."""
  _, workdir = trained
  results = []
  for devices in (1, 3):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    out = subprocess.run([sys.executable, "-c", SEARCHES_ON_DEVICES, str(workdir)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    results.append(json.loads(out.stdout.strip().splitlines()[-1]))
  one, three = results
  assert (one["devices"], three["devices"]) == (1, 3)
  for search in ("beam", "greedy", "sample"):
    assert len(one[search]) == len(three[search]) == 40
    assert one[search][7] == three[search][7] == []  # the empty line: no hypotheses
    for a, b in zip(one[search], three[search]):
      assert [text for text, _ in a] == [text for text, _ in b]
      np.testing.assert_allclose([score for _, score in a], [score for _, score in b], atol=1e-4)
  scores = [n[0][1] for n in one["beam"] if n]
  assert len(set(scores)) > 20  # the sentences' scores differ: a result in another's place shows


@pytest.mark.slow
def test_samples_do_not_depend_on_batching(trained):
  cfg, workdir = trained
  run = load_run(workdir)
  cfg, vocab, model, params = run.config, run.vocab, run.model, run.params()
  sentences = sources.load_split(cfg.data, cfg.data.eval_split).source[:10]
  settings = SearchSettings(search="sample", top_k=20, seed=3, max_extra_len=5)
  runs = [translate(model, params, vocab, sentences,
                    dataclasses.replace(settings, tokens_per_batch=n),
                    max_source_len=cfg.data.max_len).hypotheses for n in (40, 1000)]
  assert runs[0] == runs[1]
  other_seed = translate(model, params, vocab, sentences, dataclasses.replace(settings, seed=4),
                         max_source_len=cfg.data.max_len).hypotheses
  assert other_seed != runs[0]


@pytest.mark.slow
def test_the_programs_write_nbest_lists_scores_samples_and_ensemble_reports(trained, tmp_path):
  cfg, workdir = trained
  source = tmp_path / "in.en"
  source.write_text("A dog runs on the beach.\nTwo men play football.\n")
  out = run_cli("transformer.evaluation.translate", f"--workdir={workdir}", f"--input_file={source}",
                f"--output_file={tmp_path / 'out.de'}", "--beam_size=3", "--nbest=2",
                "--min_len=1")  # no empty translation: each is scored below as a target
  assert out.returncode == 0, out.stderr[-3000:]
  best = (tmp_path / "out.de").read_text().splitlines()
  lists = [json.loads(line) for line in (tmp_path / "out.de.nbest.jsonl").read_text().splitlines()]
  assert [entry["index"] for entry in lists] == [0, 1] and len(best) == 2
  assert [entry["hypotheses"][0]["text"] for entry in lists] == best
  assert all(len(entry["hypotheses"]) == 2 for entry in lists)

  out = run_cli("transformer.evaluation.translate", f"--workdir={workdir}", f"--input_file={source}",
                f"--score={tmp_path / 'out.de'}")
  assert out.returncode == 0, out.stderr[-3000:]
  scores = [json.loads(line) for line in out.stdout.splitlines()]
  run = load_run(workdir)
  vocab, model, params = run.vocab, run.model, run.params()
  expected = translator.score(model, params, vocab, source.read_text().splitlines(), best,
                              tokens_per_batch=1024, max_len=cfg.data.max_len)
  assert len(scores) == 2
  for score, reference in zip(scores, expected):
    assert score["pieces"] == reference["pieces"] and score["tokens"] == len(score["pieces"])
    assert score["log_prob"] == pytest.approx(reference["log_prob"], abs=1e-4)
  assert "mean NLL" in out.stderr

  samples = [run_cli("transformer.evaluation.translate", f"--workdir={workdir}", f"--input_file={source}",
                     flag, "--top_p=0.9", "--seed=5") for flag in ("--search=sample", "--sample")]
  assert samples[0].stdout == samples[1].stdout and len(samples[0].stdout.splitlines()) == 2
  assert "--sample is deprecated and will be removed; use --search=sample" in samples[1].stderr
  out = run_cli("transformer.evaluation.evaluate", f"--workdir={workdir}", "--search=sample", "--top_p=0.9",
                "--seed=5")  # transformer-eval scores samples too, under their own name
  assert out.returncode == 0, out.stderr[-3000:]
  name = str(workdir / "eval" / "validation_step6_sample_t1_k0_p0.9_seed5_ema")
  sampled = json.loads(Path(name + ".json").read_text())
  assert sampled["decode"] == {"search": "sample", "temperature": 1.0, "top_k": 0, "top_p": 0.9,
                               "seed": 5, "beam_size": 1, "max_extra_len": cfg.decode.max_extra_len}
  expected = translate(model, params, vocab, sources.load_split(cfg.data, cfg.data.eval_split).source,
                       SearchSettings(search="sample", top_p=0.9, seed=5,
                                      max_extra_len=cfg.decode.max_extra_len),
                       max_source_len=cfg.data.max_len).hypotheses
  assert Path(name + ".hyp.txt").read_text().splitlines() == expected

  # Another seed's run: its vocabulary trained apart on the same text records another temporary
  # path; the vocabularies are the same, so the runs ensemble.
  other = tmp_path / "other_seed"
  shutil.copytree(workdir, other, ignore=shutil.ignore_patterns("eval"))
  proto = sentencepiece_model_pb2.ModelProto.FromString((other / "vocab.model").read_bytes())
  proto.trainer_spec.model_prefix = "/tmp/elsewhere/spm"
  (other / "vocab.model").write_bytes(proto.SerializeToString())
  assert (other / "vocab.model").read_bytes() != (workdir / "vocab.model").read_bytes()
  out = run_cli("transformer.evaluation.evaluate", f"--workdir={workdir}", f"--ensemble={other}",
                "--beam_size=2", "--nbest=2")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "ensemble of 2 runs" in out.stdout and "chrF" in out.stdout
  assert "(moving average of the parameters)" in out.stdout
  report = json.loads((workdir / "eval" / "validation_step6_ens2_beam2_nbest2_ema.json").read_text())
  raw = json.loads((workdir / "eval" / "validation_step6_ens2_beam2_nbest2.json").read_text())
  assert report["ema"] and not raw["ema"]
  score = report["sacrebleu"]  # how long the translations are, beside the score
  assert (f"length {score['hyp_len'] / score['ref_len']:.3f} of the references' (sacreBLEU's "
          f"tokens; brevity penalty {score['brevity_penalty']:.3f})") in out.stdout
  assert f"without the moving average (the checkpoint's own parameters): sacreBLEU " \
         f"{raw['sacrebleu']['bleu']:.2f}" in out.stdout
  single = evaluate(str(workdir), beam_size=2)  # the same model twice decodes as the model
  assert report["sacrebleu"]["bleu"] == pytest.approx(single["sacrebleu"]["bleu"])
  assert report["chrf"]["chrf"] == pytest.approx(single["chrf"]["chrf"])
  nbest = (workdir / "eval" / "validation_step6_ens2_beam2_nbest2_ema.nbest.jsonl").read_text().splitlines()
  assert len(nbest) == 40 and len(json.loads(nbest[0])["hypotheses"]) == 2


@pytest.mark.slow
def test_a_minimum_length_has_its_own_report_and_no_empty_output(trained):
  cfg, workdir = trained
  default = evaluate(str(workdir))
  kept = Path(default["files"][1]).read_text()
  report = evaluate(str(workdir), min_len=1)
  assert report["files"][1] == str(workdir / "eval" / "validation_step6_min1_ema.json")
  assert report["decode"]["min_len"] == 1 and "min_len" not in default["decode"]
  assert "" not in Path(report["files"][0]).read_text().splitlines()
  assert Path(default["files"][1]).read_text() == kept


def test_averaging_a_run_with_a_moving_average_averages_both(trained, tmp_path):
  """transformer-average: the new checkpoint's raw parameters are the mean of the raw ones, its
  moving average the mean of the moving averages (each read from one restore per checkpoint)."""
  from transformer.evaluation.average import average_checkpoints
  _, workdir = trained
  assert average_checkpoints(str(workdir), 2, str(tmp_path / "avg")) == [3, 6]
  for ema in (False, True):
    got = load_run(tmp_path / "avg").params(ema)
    each = [load_run(workdir, step=s).params(ema) for s in (3, 6)]
    for g, a, b in zip(*(jax.tree.leaves(t) for t in (got, *each))):
      np.testing.assert_allclose(g, (a + b) / 2, rtol=1e-6, atol=1e-7)


def test_a_params_only_average_decodes_as_the_checkpoints_it_averages(trained, tmp_path):
  """transformer-average --params_only: float32 keeps exactly the on-the-fly mean (both the raw
  parameters and the moving average), and transformer-eval's translations of it are those of
  --average_last on the checkpoints; float16 is that mean rounded to float16, read back as float32."""
  from transformer.evaluation.average import average_checkpoints
  _, trained_dir = trained
  workdir = tmp_path / "run"
  shutil.copytree(trained_dir, workdir)
  assert average_checkpoints(str(workdir), 2, str(tmp_path / "kept"), params_only=True) == [3, 6]
  assert not (tmp_path / "kept" / "checkpoints").exists()
  kept, mean = load_run(tmp_path / "kept"), load_run(workdir, average_last=2)
  assert kept.steps == [3, 6]
  for ema in (False, True):
    for k, m in zip(*(jax.tree.leaves(r.params(ema)) for r in (kept, mean))):
      assert k.dtype == jnp.float32
      np.testing.assert_array_equal(k, m)
  assert average_checkpoints(str(workdir), 2, str(tmp_path / "half"), params_only=True,
                             dtype="float16") == [3, 6]
  half = load_run(tmp_path / "half", average_last=2, step=6)  # the grid's own flags are accepted
  for h, m in zip(*(jax.tree.leaves(r.params()) for r in (half, mean))):
    assert h.dtype == jnp.float32
    np.testing.assert_array_equal(h, np.asarray(m).astype(np.float16).astype(np.float32))
  assert (tmp_path / "half/params.msgpack").stat().st_size < 0.6 * (
      tmp_path / "kept/params.msgpack").stat().st_size

  on_the_fly = evaluate(str(workdir), average_last=2, beam_size=2)
  from_kept = evaluate(str(tmp_path / "kept"), beam_size=2)
  assert Path(from_kept["files"][0]).name == Path(on_the_fly["files"][0]).name  # "..._avg2..."
  for a, b in zip(on_the_fly["files"], from_kept["files"]):
    if a.endswith(".hyp.txt"):
      assert Path(a).read_text() == Path(b).read_text()
  assert from_kept["sacrebleu"]["bleu"] == on_the_fly["sacrebleu"]["bleu"]


def test_a_params_only_workdir_refuses_what_it_does_not_hold(trained, tmp_path):
  """Training state, another step, another averaging, a damaged file and another model's config
  are each one clear error."""
  from transformer.evaluation.average import average_checkpoints
  from transformer.training.params_file import ParamsFileError
  _, workdir = trained
  kept = tmp_path / "kept"
  average_checkpoints(str(workdir), 2, str(kept), params_only=True)
  with pytest.raises(ParamsFileError, match="keeps only the parameters of step 6 .the mean of its "
                     "last 2 checkpoints., no optimizer state"):
    average_checkpoints(str(kept), 1, str(tmp_path / "again"))
  with pytest.raises(ParamsFileError, match="not of step 3: drop --step"):
    load_run(kept, step=3)
  with pytest.raises(ParamsFileError, match="cannot average its last 3; drop --average_last"):
    load_run(kept, average_last=3)
  with pytest.raises(ConfigError, match="already holds a model; choose a new --output"):
    average_checkpoints(str(workdir), 2, str(kept), params_only=True)
  with pytest.raises(ConfigError, match="--dtype=float16 applies to --params_only"):
    average_checkpoints(str(workdir), 2, str(tmp_path / "other"), dtype="float16")
  assert not (tmp_path / "other").exists()
  config = json.loads((kept / "config.json").read_text())
  config["model"]["d_ff"] *= 2
  (kept / "config.json").write_text(json.dumps(config))
  with pytest.raises(ParamsFileError, match="holds the parameters of another model than its "
                     "config.json describes .e.g. .*ffn"):
    load_run(kept)
  (kept / "params.msgpack").write_bytes(b"not msgpack at all")
  with pytest.raises(ParamsFileError, match="params.msgpack cannot be read .*write it again with "
                     "transformer-average --params_only"):
    load_run(kept)


@pytest.mark.slow
def test_programs_keep_compiled_searches_in_the_persistent_cache(trained, tmp_path):
  """--compilation_cache: the first evaluation stores its compiled searches, a second one loads
  them (no new entries), and '' turns the cache off."""
  _, workdir = trained
  cache = tmp_path / "xla_cache"
  args = ("transformer.evaluation.evaluate", f"--workdir={workdir}", "--beam_size=2", "--noema")
  first = run_cli(*args, f"--compilation_cache={cache}")
  assert first.returncode == 0, first.stderr[-3000:]
  stored = sorted(p.name for p in cache.iterdir())
  assert any("search" in name or "fn" in name for name in stored), stored
  second = run_cli(*args, f"--compilation_cache={cache}")
  assert second.returncode == 0 and sorted(p.name for p in cache.iterdir()) == stored
  off = run_cli(*args, "--compilation_cache=")
  assert off.returncode == 0, off.stderr[-3000:]


def test_a_test_file_is_named_without_its_language_and_compression():
  from transformer.evaluation.evaluate import (
    test_set_name as name_of_test_set,  # a global test_* is collected
  )
  assert name_of_test_set(None, "x/long.en") == "long"
  assert name_of_test_set(None, "data/test_2016_flickr.en.gz") == "test_2016_flickr"
  assert name_of_test_set("validation", None) == "validation"


@pytest.mark.slow
def test_mbr_translates_with_the_beams_consensus(trained, tmp_path):
  """--mbr: each translation is the hypothesis of the beam's n-best list with the highest expected
  chrF against the list (computed here by brute force), and the programs write it."""
  cfg, workdir = trained
  run = load_run(workdir)
  vocab, model, params = run.vocab, run.model, run.params()
  sentences = sources.load_split(cfg.data, cfg.data.eval_split).source[:12]
  plain = translate(model, params, vocab, sentences,
                    SearchSettings(beam_size=3, nbest=3, max_extra_len=5),
                    max_source_len=cfg.data.max_len)
  result = translate(model, params, vocab, sentences,
                     SearchSettings(beam_size=3, max_extra_len=5, mbr="chrf", mbr_temperature=0.5),
                     max_source_len=cfg.data.max_len)
  for nbest, chosen, kept in zip(plain.nbest, result.hypotheses, result.nbest):
    texts, scores = [h["text"] for h in nbest], np.array([h["score"] for h in nbest])
    w = np.exp((scores - scores.max()) / 0.5)
    w /= w.sum()
    expected = [sum(wj * sacrebleu.sentence_chrf(h, [r]).score for wj, r in zip(w, texts))
                for h in texts]
    assert chosen == texts[int(np.argmax(expected))]
    assert len(kept) == 1 and kept[0]["text"] == texts[0]  # nbest=1: the best-scored, annotated
    assert kept[0]["expected_utility"] == pytest.approx(expected[0], rel=1e-9)
  assert "mbr_sec" in result.stats

  source = tmp_path / "in.en"
  source.write_text("\n".join(sentences[:3]) + "\n")
  out = run_cli("transformer.evaluation.translate", f"--workdir={workdir}", f"--input_file={source}",
                f"--output_file={tmp_path / 'out.de'}", "--beam_size=3", "--nbest=3",
                "--mbr=chrf", "--mbr_temperature=0.5")
  assert out.returncode == 0, out.stderr[-3000:]
  lists = [json.loads(line) for line in (tmp_path / "out.de.nbest.jsonl").read_text().splitlines()]
  assert (tmp_path / "out.de").read_text().splitlines() == result.hypotheses[:3]
  assert [entry["translation"] for entry in lists] == result.hypotheses[:3]
  assert all(len(entry["hypotheses"]) == 3 for entry in lists)
