"""data.pretokenize: training on the Multi30k release's lc.norm.tok text, and what the programs give
back (detokenized text whose lowercased tokenized BLEU is the literature's); grids that score the
mean of the last checkpoints."""

import json

import numpy as np
import pytest
from helpers import cli_overrides, run_cli, tiny_run_config

from transformer.config import ConfigError, base_config, validate
from transformer.data import cache_format, pretokenize, sources, text_files, vocab
from transformer.evaluation import bleu
from transformer.sweeps.grids import Grid, Variant
from transformer.sweeps.plan import plan


@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_detokenized_output_tokenizes_back_to_the_models_own_tokens(lang):
  # The release's own tokenized validation set, as a model trained on it would write it: detokenized
  # and tokenized again, every line comes back token for token, so lc-tok BLEU of the readable
  # output is multi-bleu of the model's tokens against the release's references.
  # (multi30k_tokenize of the bundled text is the release's file: tests/test_bleu.py)
  tokenized = [pretokenize.multi30k_tokenize(line, lang)
               for line in text_files.read_lines(sources.BUNDLED_DIR / f"val.{lang}.gz")]
  form = pretokenize.TextForm("multi30k", "en", lang)
  back = [pretokenize.multi30k_tokenize(form.output(line), lang) for line in tokenized]
  assert [i for i, (a, b) in enumerate(zip(back, tokenized)) if a != b] == []
  assert any("&apos;" in line or "&quot;" in line for line in tokenized)  # escapes were exercised


def test_lc_tok_bleu_of_the_detokenized_output_is_multi_bleu_of_the_tokens():
  refs = text_files.read_lines(sources.BUNDLED_DIR / "val.de.gz")[:300]
  tokenized = [pretokenize.multi30k_tokenize(r, "de") for r in refs]
  hyps = [line.split(" ", 1)[-1] for line in tokenized]  # drop each line's first token
  form = pretokenize.TextForm("multi30k", "en", "de")
  ours = bleu.lc_tok_bleu([form.output(h) for h in hyps], refs, "de")["bleu"]
  direct = bleu.multi_bleu_metric().corpus_score(hyps, [tokenized]).score
  assert ours == pytest.approx(direct, abs=1e-9)
  assert 0 < ours < 100


def test_the_text_form_tokenizes_both_sides_in_their_languages_and_keeps_empty_lines():
  form = pretokenize.TextForm("multi30k", "en", "fr")
  assert form.source(["A man's hat.", ""]) == ["a man &apos;s hat .", ""]
  assert form.target(["L'homme, ici."]) == ["l&apos; homme , ici ."]
  assert form.output("l&apos; homme , ici .") == "l'homme, ici."
  assert pretokenize.AS_GIVEN.source(["A man's hat."]) == ["A man's hat."]
  assert pretokenize.AS_GIVEN.output("A b .") == "A b ."


def test_training_reads_the_tokenized_text_and_its_caches_have_their_own_names(tmp_path):
  cfg = tiny_run_config(tmp_path, train_lines=20, eval_lines=5)
  plain = sources.open_split(cfg.data, "train").read([0])
  cfg.data.pretokenize = "multi30k"
  src, tgt = sources.open_split(cfg.data, "train").read([0])
  assert (src, tgt) == ([pretokenize.multi30k_tokenize(plain[0][0], "en")],
                        [pretokenize.multi30k_tokenize(plain[1][0], "de")])
  assert src != plain[0]
  # Evaluation reads the raw text (sources and references as given).
  assert sources.load_split(cfg.data, "validation").source[0] == \
      text_files.read_lines(tmp_path / "val.en")[0]
  tokenized_names = cache_format.corpus_identity(cfg.data, "train"), vocab.dataset_key(cfg.data)
  cfg.data.pretokenize = "none"
  assert tokenized_names[0] != cache_format.corpus_identity(cfg.data, "train")
  assert tokenized_names[1] != vocab.dataset_key(cfg.data)


def test_an_unknown_text_form_is_a_config_error():
  cfg = base_config()
  cfg.data.pretokenize = "moses"
  with pytest.raises(ConfigError, match="config.data.pretokenize must be one of 'none', 'multi30k'"):
    validate(cfg)


def test_a_lowercased_runs_sacrebleu_is_uncased_and_says_so():
  refs = ["Ein Mann fährt Rad."]
  cased, uncased = (bleu.sacrebleu_score(["ein mann fährt rad."], refs, lowercase=lc)
                    for lc in (False, True))
  assert uncased["bleu"] == pytest.approx(100.0) and cased["bleu"] < 50
  assert "case:lc" in uncased["signature"] and uncased["case"] == "lowercased"
  chrf_cased, chrf_uncased = (bleu.chrf_score(["ein mann fährt rad."], refs, lowercase=lc)
                              for lc in (False, True))
  assert chrf_uncased["chrf"] == pytest.approx(100.0) and chrf_cased["chrf"] < 100
  assert "case:lc" in chrf_uncased["signature"]


def test_the_literatures_recipe_is_wu_et_als_tiny_transformer():
  from configs.multi30k_tiny import get_config
  cfg = validate(get_config())
  m, t = cfg.model, cfg.train
  assert (m.num_layers, m.d_model, m.d_ff, m.num_heads, m.dropout, m.share_embeddings) == \
      (4, 128, 256, 4, 0.3, True)
  peak = t.learning_rate * m.d_model ** -0.5 * t.warmup_steps ** -0.5  # the schedule at warm-up's end
  assert peak == pytest.approx(0.005)
  assert (t.steps, t.warmup_steps, t.label_smoothing, t.adam_eps, t.ema_decay) == \
      (8000, 2000, 0.1, 1e-8, 0.0)
  assert (cfg.data.pretokenize, cfg.data.tokens_per_batch, cfg.decode.beam_size) == \
      ("multi30k", 8192, 5)
  assert t.keep_checkpoints >= 10


def test_a_grid_scores_the_mean_of_its_last_checkpoints_and_refuses_to_average_more_than_kept(
    tmp_path):
  cfg = base_config()
  cfg.train.keep_checkpoints = 10
  grid = Grid("avg", [Variant("a")], average_last=10)
  run = plan(grid, cfg, [], [0], tmp_path, {})[0]
  dev = run.evals["dev"]
  assert "--average_last=10" in dev.command
  assert dev.report.name == "validation_step100000_avg10.json"
  cfg.train.keep_checkpoints = 5
  with pytest.raises(ConfigError, match=r"mean of the last 10 checkpoints, but variant a keeps 5 "
                                        r"\(train.keep_checkpoints\)"):
    plan(grid, cfg, [], [0], tmp_path, {})
  with pytest.raises(ConfigError, match="average_last must be a positive number"):
    Grid("avg", [Variant("a")], average_last=0)


@pytest.mark.slow
def test_a_pretokenized_run_trains_and_translates_raw_text_to_readable_text(tmp_path):
  cfg = tiny_run_config(tmp_path)
  workdir = tmp_path / "run"
  done = run_cli("transformer.training.train", "--config=configs/multi30k.py",
                 *cli_overrides(cfg, **{"data.pretokenize": "multi30k"}),
                 f"--workdir={workdir}")
  assert done.returncode == 0, done.stderr[-2000:]
  stored = json.loads((workdir / "config.json").read_text())
  assert stored["data"]["pretokenize"] == "multi30k"
  done = run_cli("transformer.evaluation.translate", f"--workdir={workdir}",
                 input_text="A man's dog, outside.\n")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "&apos;" not in done.stdout and "&quot;" not in done.stdout
  # The attention maps read the source as the run did: its tokenized, lowercased pieces.
  done = run_cli("transformer.visualisation.attention_maps", f"--workdir={workdir}",
                 "--source=A Man's dog.", "--target=Der Hund.",
                 f"--output_dir={tmp_path / 'maps'}")
  assert done.returncode == 0, done.stderr[-2000:]
  with np.load(tmp_path / "maps" / "attention.npz") as maps:
    tokens = [str(t) for t in maps["source_tokens"]]
  assert "".join(tokens).replace("\u2581", " ").strip().startswith("a man &apos;s dog")


def test_an_export_of_a_pretokenized_run_says_what_text_its_engine_takes(caplog):
  from transformer.evaluation.export import warn_of_text_form
  cfg = base_config()
  with caplog.at_level("WARNING", logger="transformer"):
    warn_of_text_form(cfg)
    assert caplog.text == ""
    cfg.data.pretokenize = "multi30k"
    warn_of_text_form(cfg)
  assert "lowercased, tokenized text" in caplog.text and "multi30k_tokenize" in caplog.text
