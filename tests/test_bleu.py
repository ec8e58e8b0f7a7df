"""sacreBLEU through our wrapper against BLEU computed by hand from clipped n-gram counts; the paper's
tokenized BLEU; the Multi30k literature's lowercased tokenized BLEU against the release's own
tokenized files and multi-bleu.perl (tests/fixtures/multi30k_lc_tok/README.md)."""

import collections
import gzip
import math
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from transformer.data import sources
from transformer.evaluation.bleu import (
  compound_split,
  lc_tok_bleu,
  multi30k_tokenize,
  paper_tokenize,
  sacrebleu_score,
  tokenized_bleu,
)


def reference_bleu(hypotheses, references):
  """Papineni et al.'s corpus BLEU on whitespace tokens (13a leaves these sentences unchanged)."""
  matches, totals = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_grams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      r_grams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
      totals[n - 1] += max(len(h) - n + 1, 0)
  if not all(matches):
    return 0.0  # multi-bleu.perl: a zero n-gram precision makes BLEU 0
  log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
  brevity = min(1.0, math.exp(1 - ref_len / hyp_len))
  return 100 * brevity * math.exp(log_precision)


def test_matches_hand_computed_corpus_bleu():
  hypotheses = ["the cat sat on the mat today", "a dog runs in the big park",
                "two men are playing football"]
  references = ["the cat sat on a mat today", "a dog runs in the park",
                "two young men are playing football outside"]
  result = sacrebleu_score(hypotheses, references)
  assert result["bleu"] == pytest.approx(reference_bleu(hypotheses, references), abs=1e-6)
  assert result["lines"] == 3 and result["case"] == "cased" and result["tokenizer"] == "13a"
  assert "tok:13a" in result["signature"] and "case:mixed" in result["signature"]


def test_short_hypotheses_pay_the_brevity_penalty_and_case_counts():
  refs = ["the cat sat on the mat with a hat"]
  assert sacrebleu_score(refs, refs)["bleu"] == pytest.approx(100.0)
  assert sacrebleu_score(["The Cat sat on the mat with a hat"], refs)["bleu"] < 100.0
  short = sacrebleu_score(["the cat sat on the mat"], refs)
  assert short["brevity_penalty"] == pytest.approx(math.exp(1 - 9 / 6))
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    sacrebleu_score(["a", "b"], refs)


def test_compound_splitting():
  assert compound_split("eine Sieben-Tage-Woche") == "eine Sieben ##AT##-##AT## Tage ##AT##-##AT## Woche"
  # get_ende_bleu.sh's perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': any two non-space characters,
  # and matches that do not overlap, so a one-character part keeps its second hyphen.
  assert compound_split("a-b-c 3-% x-y-zz") == (
      "a ##AT##-##AT## b-c 3 ##AT##-##AT## % x ##AT##-##AT## y-zz")
  assert compound_split("3 - 4 , - x") == "3 - 4 , - x"  # free-standing hyphens stay


def test_paper_tokenization_replaces_unicode_punctuation_first():
  """replace-unicode-punctuation.perl's table (“ ” … full-width digits and %), then Moses."""
  assert paper_tokenize("“Ein Hund” rennt… ２０％ schneller, oder?", "de") == (
      "&quot; Ein Hund &quot; rennt ... 20 % schneller , oder ?")
  assert paper_tokenize('Ein "Sieben-Tage"-Test, oder?', "de") == (
      "Ein &quot; Sieben ##AT##-##AT## Tage &quot; -Test , oder ?")


def test_tokenized_bleu_on_a_hand_counted_corpus():
  # die Sieben ##AT##-##AT## Tage ##AT##-##AT## Woche vs ... Frist: 6 tokens each; matching n-grams
  # 5/6, 4/5, 3/4, 2/3 -> BLEU = (5*4*3*2 / (6*5*4*3)) ** (1/4) = (1/3) ** (1/4). (Every part has
  # more than one character, so both hyphens are split.)
  result = tokenized_bleu(["die Sieben-Tage-Woche"], ["die Sieben-Tage-Frist"], "de")
  assert result["bleu"] == pytest.approx(100 * (1 / 3) ** 0.25)
  assert result["hyp_len"] == result["ref_len"] == 6
  # Unsplit, the compound is one wrong token: no bigram matches, and without smoothing BLEU is 0.
  assert reference_bleu(["die Sieben-Tage-Woche"], ["die Sieben-Tage-Frist"]) == 0.0


def test_tokenized_bleu_equals_multi_bleu_on_pre_tokenized_text():
  hypotheses = ["Zwei Männer spielen Fußball.", "Ein Hund läuft im Park, oder?",
                "Die Sieben-Tage-Woche ist lang."]
  references = ["Zwei junge Männer spielen Fußball.", "Ein Hund rennt im Park, oder?",
                "Die Sieben-Tage-Woche ist sehr lang."]
  tokenized_refs = ["Zwei junge Männer spielen Fußball .", "Ein Hund rennt im Park , oder ?",
                    "Die Sieben ##AT##-##AT## Tage ##AT##-##AT## Woche ist sehr lang ."]
  tokenized_hyps = ["Zwei Männer spielen Fußball .", "Ein Hund läuft im Park , oder ?",
                    "Die Sieben ##AT##-##AT## Tage ##AT##-##AT## Woche ist lang ."]
  assert [paper_tokenize(r, "de") for r in references] == tokenized_refs
  result = tokenized_bleu(hypotheses, references, "de")
  assert result["bleu"] == pytest.approx(reference_bleu(tokenized_hyps, tokenized_refs), abs=1e-9)
  none = BLEU(tokenize="none", smooth_method="none").corpus_score(tokenized_hyps, [tokenized_refs])
  assert result["bleu"] == pytest.approx(none.score)
  assert result["lines"] == 3 and result["case"] == "cased" and "moses(de)" in result["tokenizer"]
  assert "get_ende_bleu.sh" in result["tokenizer"]
  assert result["bleu"] > sacrebleu_score(hypotheses, references)["bleu"]  # compounds count thrice
  # A run that writes lowercased text: both sides lowercased, the same count as on cased text.
  lowered = tokenized_bleu([h.lower() for h in hypotheses], references, "de", lowercase=True)
  assert lowered["bleu"] == pytest.approx(result["bleu"]) and lowered["case"] == "lowercased"
  assert tokenized_bleu([h.lower() for h in hypotheses], references, "de")["bleu"] < result["bleu"]


LC_TOK = Path(__file__).parent / "fixtures" / "multi30k_lc_tok"


def bundled(split: str, lang: str) -> list[str]:
  with gzip.open(Path(sources.BUNDLED_DIR) / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
    return f.read().splitlines()


@pytest.mark.parametrize("lang", ["de", "en"])
def test_multi30k_tokenize_reproduces_the_releases_tokenized_validation_set(lang):
  official = (LC_TOK / f"val.lc.norm.tok.{lang}").read_text(encoding="utf-8").splitlines()
  ours = [multi30k_tokenize(line, lang) for line in bundled("val", lang)]
  assert len(ours) == len(official) == 1014
  assert [i for i, (a, b) in enumerate(zip(ours, official)) if a != b] == []


def test_multi30k_tokenize_keeps_the_release_mosess_quote_rules():
  # Lines of the release's train files (train.lc.norm.tok.de / .fr): a single quote mark between
  # ASCII letters is an apostrophe, elsewhere a double quote; '."' at a line's end becomes '".'.
  assert multi30k_tokenize("Trader Joe\u2018s, mit einem Wagen.", "de") == (
      "trader joe &apos; s , mit einem wagen .")
  assert multi30k_tokenize("Un coup d\u2019\u0153il.", "fr") == "un coup d &quot; \u0153il ."
  assert multi30k_tokenize('steht: "Come on now."', "de") == (
      "steht : &quot; come on now &quot; .")


def test_lc_tok_bleu_is_multi_bleu_perl_on_the_releases_references():
  hypotheses = (LC_TOK / "hypotheses.de").read_text(encoding="utf-8").splitlines()
  result = lc_tok_bleu(hypotheses, bundled("val", "de")[:200], "de")
  # multi-bleu.perl: BLEU = 33.85, 68.0/43.9/30.3/21.8 (BP=0.903, ratio=0.908, hyp_len=2229,
  # ref_len=2456)
  assert round(result["bleu"], 2) == 33.85
  assert [round(p, 1) for p in result["precisions"]] == [68.0, 43.9, 30.3, 21.8]
  assert round(result["brevity_penalty"], 3) == 0.903
  assert (result["hyp_len"], result["ref_len"], result["lines"]) == (2229, 2456, 200)
  assert result["case"] == "lowercased"
  with pytest.raises(ValueError, match="200 hypotheses but 3 references"):
    lc_tok_bleu(hypotheses, ["a", "b", "c"], "de")
