"""How long is each Multi30k split's target for its source? The lengths that decide a brevity penalty.

    python -m experiments.analyses.split_lengths [--test_dir=DIR] [--src=en --tgt=de] \
        [--record=experiments/results/multi30k_lengths/en-de]

For the bundled training and validation splits and, with --test_dir, the official test sets (the
release's raw files, test_sets.held_out): the sentences, both sides' tokens as the literature's BLEU
counts them (bleu.multi30k_tokenize: lowercased, normalised, Moses-tokenised) and the target tokens a
source token. Where a split's references are longer for their sources than another's, the same
model's translations fall shorter of them (a brevity penalty), and a search or lever that only
lengthens translations gains there and not on the other split.
"""

from __future__ import annotations

import time

from absl import flags

from transformer.cli import run_program
from transformer.data import sources, text_files
from transformer.evaluation import bleu
from transformer.sweeps import records, test_sets

FLAGS = flags.FLAGS


def tokens(lines: list[str], lang: str) -> int:
  """Tokens of `lines` as the literature's BLEU counts them (its references' ref_len)."""
  return sum(len(bleu.multi30k_tokenize(line, lang).split()) for line in lines)


def split_lengths(files: dict[str, tuple[str, str]], src: str, tgt: str) -> list[dict]:
  """{split: (source file, target file)} -> one row per split: sentences, tokens, their ratio."""
  rows = []
  for name, (source_file, target_file) in files.items():
    source, target = text_files.read_lines(source_file), text_files.read_lines(target_file)
    if len(source) != len(target):
      raise sources.DataError(f"{source_file} has {len(source):,} lines but {target_file} has "
                              f"{len(target):,}: pass aligned files")
    source_tokens, target_tokens = tokens(source, src), tokens(target, tgt)
    rows.append({"split": name, "sentences": len(source), "source_tokens": source_tokens,
                 "target_tokens": target_tokens, "ratio": target_tokens / source_tokens})
  return rows


def main(argv: list[str]) -> None:
  started = time.time()
  bundled = sources.BUNDLED_DIR
  files = {split: (str(bundled / f"{stem}.{FLAGS.src}.gz"), str(bundled / f"{stem}.{FLAGS.tgt}.gz"))
           for split, stem in (("train", "train"), ("validation", "val"))}
  if FLAGS.test_dir:
    files.update({name: (pair["source_file"], pair["reference_file"]) for name, pair in
                  test_sets.held_out(FLAGS.test_dir, FLAGS.src, FLAGS.tgt).items()})
  rows = split_lengths(files, FLAGS.src, FLAGS.tgt)
  lines = [f"| split ({FLAGS.src}-{FLAGS.tgt}) | sentences | {FLAGS.src} tokens | {FLAGS.tgt} tokens "
           f"| {FLAGS.tgt} tokens a {FLAGS.src} token |", "|---|---|---|---|---|"]
  lines += [f"| {r['split']} | {r['sentences']:,} | {r['source_tokens']:,} | {r['target_tokens']:,} "
            f"| {r['ratio']:.3f} |" for r in rows]
  print("\n".join(lines))
  if FLAGS.record:
    records.record_table("\n".join(lines), FLAGS.record, "Multi30k: each split's target length for "
                         "its source", time.time() - started, "experiments.analyses.split_lengths")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  flags.DEFINE_string("test_dir", None, "Folder of the official test sets (test_2016_flickr.en.gz, ...).")
  flags.DEFINE_string("src", "en", "Source language.")
  flags.DEFINE_string("tgt", "de", "Target language.")
  records.define_record_flag()
  run_program("experiments.analyses.split_lengths", main, compilation_cache=False)


if __name__ == "__main__":
  run()
