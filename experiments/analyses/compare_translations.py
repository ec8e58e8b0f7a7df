"""Is one set of translations better than another? Both BLEUs and a paired bootstrap for each.

    python -m experiments.analyses.compare_translations --references=val.de --lang=de \
        BASELINE.hyp.txt SYSTEM.hyp.txt [MORE.hyp.txt ...] [--record=experiments/results/NAME]

Each file holds one translation per line of the reference file (transformer-eval writes them beside
its JSON reports: RUN/eval/<split>_step<N>[...]_ema.hyp.txt). Prints, for each file after the
first, sacreBLEU and the Multi30k literature's lowercased tokenized BLEU (bleu.lc_tok_bleu) and
the paired bootstrap p-value of its difference from the first file on each (Koehn 2004, sacreBLEU's
resampling; transformer/sweeps/significance.py), and beside the lowercased score its two factors:
the length of the translations against the references' (tokens) and the BLEU without the brevity
penalty (the score over it: the n-gram precisions' geometric mean). A gain that is all brevity penalty is a gain in
length only: it transfers to another test set only where that set's references are as long.
The lowercased score is the one to compare when one system writes lowercased text
(data.vocab_normalization=nmt_nfkc_cf) and the other not.
Where every file is lowercased (runs trained on the release's lowercased text,
data.pretokenize='multi30k'), sacreBLEU is scored uncased, as transformer-eval scores those runs.
"""

from __future__ import annotations

import time

from absl import app, flags
from sacrebleu.metrics import BLEU

from transformer.cli import run_program
from transformer.data import sources, text_files
from transformer.evaluation import bleu
from transformer.sweeps import records, significance

FLAGS = flags.FLAGS


def lowercased(lines: list[str]) -> bool:
  """Whether a system wrote no capital letter at all (a model trained on lowercased text)."""
  return not any(character.isupper() for line in lines for character in line)


def compare(files: list[str], references: list[str], lang: str) -> list[dict]:
  """One row per file: both BLEUs, and for every file after the first its p against the first
  (sacreBLEU uncased where every file is lowercased: `uncased` in each row says which)."""
  hyps = [text_files.read_lines(f) for f in files]
  for path, lines in zip(files, hyps):
    if len(lines) != len(references):
      raise sources.DataError(f"{path} has {len(lines)} lines for {len(references)} references: "
                              "pass the translations of the same reference file")
  uncased = all(lowercased(lines) for lines in hyps)
  # bleu.lc_tok_bleu's score, each side tokenized once for the score and the bootstrap alike
  tokenized_refs = [bleu.multi30k_tokenize(r, lang) for r in references]
  tokenized = [[bleu.multi30k_tokenize(h, lang) for h in lines] for lines in hyps]
  rows = []
  for i, (path, lines) in enumerate(zip(files, hyps)):
    lc_tok = bleu.multi_bleu_metric().corpus_score(tokenized[i], [tokenized_refs])
    row = {"file": path, "uncased": uncased,
           "sacrebleu": bleu.sacrebleu_score(lines, references, lowercase=uncased)["bleu"],
           "lc_tok_bleu": lc_tok.score, "length_ratio": lc_tok.sys_len / lc_tok.ref_len,
           "lc_tok_without_bp": lc_tok.score / lc_tok.bp if lc_tok.bp else 0.0}
    if i:
      row["sacrebleu_p"] = significance.paired_bootstrap(hyps[0], lines, references,
                                                         metric=BLEU(lowercase=uncased))
      row["lc_tok_p"] = significance.paired_bootstrap(tokenized[0], tokenized[i], tokenized_refs,
                                                      metric=bleu.multi_bleu_metric())
    rows.append(row)
  return rows


def main(argv: list[str]) -> None:
  files = argv[1:]
  if len(files) < 2 or not FLAGS.references or not FLAGS.lang:
    raise app.UsageError("pass --references=FILE --lang=LANG and at least two translation files "
                         "(the first is the baseline)")
  started = time.time()
  rows = compare(files, text_files.read_lines(FLAGS.references), FLAGS.lang)
  sacre = "sacreBLEU, uncased" if rows[0]["uncased"] else "sacreBLEU"
  lines = [f"| translations | {sacre} | p vs first | lowercased tokenized BLEU | p vs first "
           "| its length / the references' | its BLEU without the brevity penalty |",
           "|---|---|---|---|---|---|---|"]
  for row in rows:
    lines.append(f"| {row['file']} | {row['sacrebleu']:.2f} | "
                 f"{row.get('sacrebleu_p', float('nan')):.3f} | {row['lc_tok_bleu']:.2f} | "
                 f"{row.get('lc_tok_p', float('nan')):.3f} | {row['length_ratio']:.3f} | "
                 f"{row['lc_tok_without_bp']:.2f} |".replace("nan", "–"))
  print("\n".join(lines))
  if FLAGS.record:
    records.record_table("\n".join(lines), FLAGS.record, "Translations compared: BLEU and the paired "
                         "bootstrap", time.time() - started, "experiments.analyses.compare_translations")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  flags.DEFINE_string("references", None, "Reference translations, one per line (.gz or plain).")
  flags.DEFINE_string("lang", None, "Target language (de, fr, en): the Moses rules of the lowercased score.")
  records.define_record_flag()
  run_program("experiments.analyses.compare_translations", main, takes_arguments=True,
              compilation_cache=False)


if __name__ == "__main__":
  run()
