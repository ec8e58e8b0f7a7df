"""MBR reranking: expected utilities against a hand computation with sacreBLEU's sentence scores,
the choice it makes, its settings' errors and report names."""

import numpy as np
import pytest
import sacrebleu

from transformer.config import ConfigError, base_config, validate
from transformer.data import sources
from transformer.decoding import mbr
from transformer.decoding.translator import SearchSettings


def test_weights_are_a_tempered_softmax_of_the_scores():
  scores = [-1.0, -2.0, -4.0]
  for temperature in (0.5, 1.0, 3.0):
    z = np.exp(np.array(scores) / temperature)
    np.testing.assert_allclose(mbr.weights(scores, temperature), z / z.sum(), rtol=1e-12)
  np.testing.assert_allclose(mbr.weights([-1000.0, -1001.0], 1.0), mbr.weights([0.0, -1.0], 1.0))


def test_the_chrf_matrix_is_sacrebleus_sentence_chrf_for_every_pair():
  """The counted-once n-grams give sacreBLEU's scores: real sentences, near-duplicates, and the
  edge cases (empty, whitespace, shorter than an n-gram, repeated words)."""
  text = sources.load_split(base_config().data, "validation").target[:30]
  texts = text + [text[0].replace("Männer", "Frauen"), text[1][:-1], "", "  ", "a", "Ein.",
                  "ein Mann ein Mann ein Mann"]
  by_sacrebleu = [[sacrebleu.sentence_chrf(h, [r]).score for r in texts] for h in texts]
  np.testing.assert_allclose(mbr.chrf_matrix(texts), by_sacrebleu, rtol=0, atol=1e-9)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_expected_utilities_are_the_weighted_sentence_scores(utility):
  texts = ["Ein Mann fährt Fahrrad.", "Ein Mann fährt ein Fahrrad.", "Eine Frau liest."]
  scores = [-0.5, -0.7, -0.6]
  w = mbr.weights(scores, 0.75)
  score = (sacrebleu.sentence_chrf if utility == "chrf" else sacrebleu.sentence_bleu)
  by_hand = [sum(w[j] * score(h, [r]).score for j, r in enumerate(texts)) for h in texts]
  np.testing.assert_allclose(mbr.expected_utilities(texts, scores, utility, 0.75), by_hand,
                             rtol=1e-9)


def test_rerank_picks_the_consensus_and_the_top_hypothesis_as_the_temperature_falls():
  nbest = [[{"text": "Eine Katze schläft auf dem Dach.", "score": -0.40},  # best-scored outlier
            {"text": "Ein Hund läuft über eine grüne Wiese.", "score": -0.45},
            {"text": "Ein Hund rennt über eine grüne Wiese.", "score": -0.50}],
           []]  # an empty source has no hypotheses
  assert mbr.rerank(nbest, "chrf", 1.0) == [1, 0]
  utilities = [h["expected_utility"] for h in nbest[0]]
  assert int(np.argmax(utilities)) == 1 and utilities[1] > utilities[2] > utilities[0]
  assert mbr.rerank(nbest, "chrf", 0.001) == [0, 0]  # all the weight on the best-scored


def test_settings_reject_mbr_without_a_beam_and_unknown_utilities():
  with pytest.raises(ConfigError, match=r"--mbr reranks a beam's hypotheses: use beam search with "
                     r"--beam_size >= 2 \(e.g. 8\), not --beam_size=1 \(greedy search\)$"):
    SearchSettings(beam_size=1, mbr="chrf").check()
  with pytest.raises(ConfigError, match="--mbr reranks a beam's hypotheses: .*, not --search=sample$"):
    SearchSettings(search="sample", mbr="chrf").check()
  with pytest.raises(ConfigError, match="--mbr must be one of chrf, bleu"):
    SearchSettings(mbr="comet").check()
  with pytest.raises(ConfigError, match="--mbr_temperature must be > 0, got 0"):
    SearchSettings(mbr="chrf", mbr_temperature=0.0).check()
  cfg = base_config()
  cfg.decode.mbr = "chrf"
  cfg.decode.beam_size = 1
  with pytest.raises(ConfigError, match="config.decode.mbr reranks a beam's hypotheses: set "
                     "config.decode.beam_size >= 2"):
    validate(cfg)
  cfg.decode.mbr = "ter"
  with pytest.raises(ConfigError, match="config.decode.mbr must be one of '', 'chrf', 'bleu'"):
    validate(cfg)


def test_mbr_keeps_the_whole_beam_and_names_its_reports():
  default = SearchSettings()
  chosen = SearchSettings(beam_size=8, mbr="chrf")
  assert chosen.candidates == 8 and default.candidates == 1
  assert chosen.describe()["nbest"] == 1 and chosen.describe()["mbr"] == "chrf"
  assert chosen.tag(default) == "_beam8_mbrchrf_mbrt0.75"
  assert SearchSettings(beam_size=8).tag(chosen) == "_nombr"
  assert chosen.tag(chosen) == ""


def test_sampled_mbr_rules_pick_what_sentence_chrf_by_brute_force_picks():
  from experiments.analyses.mbr_samples import choices
  beam = [{"text": "Eine Katze schläft auf dem Dach.", "score": -0.40},
          {"text": "Ein Hund läuft über eine Wiese.", "score": -0.45}]
  samples = ["Ein Hund rennt über eine Wiese.", "Ein Hund rennt über eine Wiese.",
             "Ein Hund läuft über die Wiese.", "Eine Katze schläft."]
  chrf = lambda h, r: sacrebleu.sentence_chrf(h, [r]).score
  def best(candidates, references, weights):
    return max(candidates, key=lambda c: sum(w * chrf(c, r) for r, w in zip(references, weights)))
  picked = choices(beam, samples, temperature=1.0)
  beam_texts = [h["text"] for h in beam]
  beam_weights = mbr.weights([h["score"] for h in beam], 1.0)
  uniform = [1 / len(samples)] * len(samples)
  candidates = list(dict.fromkeys(beam_texts + samples))
  assert picked["beam, best score"] == beam_texts[0]
  assert picked["MBR over the beam (shipped)"] == best(beam_texts, beam_texts, beam_weights)
  assert picked["MBR: samples against samples"] == best(samples, samples, uniform)
  assert picked["MBR: beam + samples against samples"] == best(candidates, samples, uniform)
  assert picked["MBR: beam + samples against both"] == best(
      candidates, samples + beam_texts, [w / 2 for w in uniform] + [w / 2 for w in beam_weights])
  assert picked["MBR: samples against samples"] == "Ein Hund rennt über eine Wiese."
