"""A WMT-sized stand-in corpus, generated offline from the bundled Multi30k, to measure the input side.

WMT14 cannot be downloaded everywhere, but what costs time and memory in preparing and loading it is
its size and shape, not its meaning. This builds parallel text with that shape:

* **Lengths**: each pair is a run of Multi30k pairs (so its two sides stay translations of each
  other), cut to a word count drawn from a log-normal fitted to WMT14 En-De's (mean ~25 words a
  side, a tail past 100); both sides are cut at the same fraction.
* **Vocabulary**: a share of the words (`rare_share`) is replaced by made-up words drawn from a Zipf
  law over `word_types` ranks (10^6 by default, WMT14 En-De's order), spelled from a per-language
  syllable set, so that training and applying a 37k BPE costs what it would on WMT.
* **Junk**, in known numbers, at seeded positions: pairs with an empty side, over-long pairs (300+
  words a side) and misaligned pairs (a long source against a one-word target). `prepare`'s filters
  must drop exactly these; `standin.json` beside the text records the numbers.

    python -m transformer.data.standin --out=/data/standin --pairs=4500000   # En-De's size

writes `train.en`, `train.de` (plain UTF-8, a sentence a line), `valid.en`, `valid.de` (3,000 clean
pairs) and `standin.json`. For En-Fr's 40.8M pairs an id cache of that size is enough to measure the
loader, and cheaper than its text: `--synthetic_ids --pairs=40800000` writes one directly
(`token_cache.write_synthetic`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
from absl import flags

from transformer.data import sources, text_files
from transformer.data.workers import worker_processes
from transformer.files import disk_problem, writable_directory, write_atomically
from transformer.hardware import usable_cpus

# Word counts: log-normal with median 19.5 and sigma 0.7 gives a mean of ~25 words and ~0.8% of
# pairs past 100 words, close to WMT14 En-De's training side; clipped to [MIN_WORDS, MAX_WORDS].
LENGTH_MEDIAN, LENGTH_SIGMA, MIN_WORDS, MAX_WORDS = 19.5, 0.7, 3, 120
SYLLABLES = {
    "en": ("ba ce di fo gu ha je ki lo mu na pe ri so tu va we xi yo za bra cle dro fle gri "
           "pla sto tri ther ing ous ent").split(),
    "de": ("ba ce di fo gu ha je ki lo mu na pe ri so tu wa we zi jo za bre kle dra flü grö "
           "pla sto tri sch ung ein äu").split(),
    "fr": ("ba ce di fo gu ha je ki lo mu na pe ri so tu va ve xi yo za bré clè dro flo gri "
           "pla sto tri eau ion ent où").split(),
}
CHUNK = 50_000  # pairs a worker generates at a time (its own seed: the output does not depend on workers)


@dataclasses.dataclass(frozen=True)
class Shape:
  pairs: int = 4_500_000
  word_types: int = 1_000_000
  rare_share: float = 0.25     # share of word occurrences replaced by a Zipf-drawn made-up word
  zipf_exponent: float = 1.0
  empty: float = 0.002         # shares of the junk injected
  too_long: float = 0.001
  misaligned: float = 0.002
  seed: int = 0

  def junk_counts(self) -> dict[str, int]:
    return {"empty": round(self.pairs * self.empty), "too_long": round(self.pairs * self.too_long),
            "length_ratio": round(self.pairs * self.misaligned)}


def made_up_word(rank: int, syllables: list[str]) -> str:
  """A word spelled from `rank` in base len(syllables): distinct ranks give distinct words."""
  out, base = [], len(syllables)
  rank += base  # at least two syllables
  while rank:
    rank, digit = divmod(rank, base)
    out.append(syllables[digit])
  return "".join(out)


class _Generator:
  """Holds Multi30k as word lists and the Zipf table; `chunk(k)` makes the k-th chunk's text."""

  def __init__(self, shape: Shape, src_lang: str, tgt_lang: str):
    self.shape = shape
    self.langs = (src_lang, tgt_lang)
    self.words = [[line.split() for line in text_files.read_lines(
        sources.BUNDLED_DIR / f"train.{lang}.gz")] for lang in self.langs]
    ranks = np.arange(1, shape.word_types + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -shape.zipf_exponent)
    self.cdf = cdf / cdf[-1]
    self.rare = [{} for _ in self.langs]  # rank -> word, filled as ranks are drawn

  def _rare_word(self, side: int, rank: int) -> str:
    word = self.rare[side].get(rank)
    if word is None:
      word = self.rare[side][rank] = made_up_word(rank, SYLLABLES.get(self.langs[side],
                                                                      SYLLABLES["en"]))
    return word

  def _pair(self, rng: np.random.Generator, num_words: int) -> tuple[list[str], list[str]]:
    """A run of Multi30k pairs, both sides cut at the fraction that leaves `num_words` source words."""
    src, tgt = [], []
    while len(src) < num_words:
      k = int(rng.integers(len(self.words[0])))
      src += self.words[0][k]
      tgt += self.words[1][k]
    keep = num_words / len(src)
    return src[:num_words], tgt[:max(min(MIN_WORDS, len(tgt)), round(len(tgt) * keep))]

  def _inflate(self, rng: np.random.Generator, words: list[str], side: int) -> str:
    replace = rng.random(len(words)) < self.shape.rare_share
    if replace.any():
      ranks = np.searchsorted(self.cdf, rng.random(int(replace.sum())))
      for i, rank in zip(np.nonzero(replace)[0], ranks):
        words[i] = self._rare_word(side, int(rank))
    return " ".join(words)

  def chunk(self, k: int, start: int, stop: int, junk: dict[int, str]) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng([self.shape.seed, k])
    lengths = np.clip(np.rint(rng.lognormal(np.log(LENGTH_MEDIAN), LENGTH_SIGMA, stop - start)),
                      MIN_WORDS, MAX_WORDS).astype(int)
    src_lines, tgt_lines = [], []
    for i, num_words in zip(range(start, stop), lengths):
      kind = junk.get(i)
      if kind == "too_long":
        num_words = int(rng.integers(300, 400))
      elif kind == "length_ratio":
        num_words = int(rng.integers(60, 100))
      src, tgt = self._pair(rng, int(num_words))
      src_text = self._inflate(rng, src, 0)
      if kind == "length_ratio":  # one common word (a piece or two) against 60-100 words
        tgt_text = tgt[0]
      else:
        tgt_text = self._inflate(rng, tgt, 1)
      if kind == "empty_source":
        src_text = ""
      elif kind == "empty_target":
        tgt_text = ""
      src_lines.append(src_text)
      tgt_lines.append(tgt_text)
    return src_lines, tgt_lines


def junk_positions(shape: Shape) -> dict[int, str]:
  """Pair index -> kind of junk, at seeded distinct positions."""
  counts = shape.junk_counts()
  counts = {"empty_source": counts["empty"] // 2, "empty_target": counts["empty"] - counts["empty"] // 2,
            "too_long": counts["too_long"], "length_ratio": counts["length_ratio"]}
  picked = np.random.default_rng([shape.seed, 2**31]).choice(shape.pairs, sum(counts.values()),
                                                             replace=False)
  kinds = np.repeat(list(counts), list(counts.values()))
  return {int(i): str(kind) for i, kind in zip(picked, kinds)}


_worker: _Generator | None = None


def _init_worker(shape: Shape, src_lang: str, tgt_lang: str) -> None:
  global _worker
  _worker = _Generator(shape, src_lang, tgt_lang)


def _make_chunk(args: tuple[int, int, int, dict[int, str]]) -> tuple[str, str]:
  src, tgt = _worker.chunk(*args)
  return "".join(s + "\n" for s in src), "".join(t + "\n" for t in tgt)


def generate(out: str | os.PathLike, shape: Shape, src_lang: str = "en", tgt_lang: str = "de",
             valid_pairs: int = 3000, workers: int | None = None) -> dict:
  """Writes the stand-in corpus into `out`; returns the manifest (also `out/standin.json`)."""
  from transformer.progress import Progress
  out = writable_directory(out, "--out")
  t0 = time.time()
  workers = workers or usable_cpus()
  junk = junk_positions(shape)
  starts = range(0, shape.pairs, CHUNK)
  tasks = [(k, s, min(s + CHUNK, shape.pairs), {i: v for i, v in junk.items()
                                                 if s <= i < s + CHUNK})
           for k, s in enumerate(starts)]
  partial = [out / f"train.{lang}.partial" for lang in (src_lang, tgt_lang)]
  try:
    with (worker_processes(workers, _init_worker, (shape, src_lang, tgt_lang)) as pool,
          open(partial[0], "w", encoding="utf-8") as fs, open(partial[1], "w", encoding="utf-8") as ft,
          Progress("stand-in corpus", shape.pairs, "pairs", line_seconds=30) as bar):
      for (_, s, e, _), (src, tgt) in zip(tasks, pool.map(_make_chunk, tasks)):
        fs.write(src)
        ft.write(tgt)
        bar.update(e - s)
    for lang, path in zip((src_lang, tgt_lang), partial):
      os.replace(path, out / f"train.{lang}")
    valid = _Generator(dataclasses.replace(shape, seed=shape.seed + 1), src_lang, tgt_lang)
    src, tgt = valid.chunk(0, 0, valid_pairs, {})
    for lang, lines in ((src_lang, src), (tgt_lang, tgt)):
      write_atomically(out / f"valid.{lang}", "".join(s + "\n" for s in lines))
  except OSError as e:
    for path in partial:
      path.unlink(missing_ok=True)
    raise sources.DataError(f"could not write the stand-in corpus in {out}: {disk_problem(e)}"
                            ) from None
  manifest = {"shape": dataclasses.asdict(shape), "languages": [src_lang, tgt_lang],
              "injected": shape.junk_counts(), "valid_pairs": valid_pairs,
              "seconds": round(time.time() - t0, 1), "workers": workers}
  (out / "standin.json").write_text(json.dumps(manifest, indent=1) + "\n")
  return manifest


def check_drops(out: str | os.PathLike, cache_dir: str | os.PathLike) -> dict:
  """Which pairs a training token cache of the corpus in `out` dropped, against the junk injected
  there: the injected pairs dropped and kept, and any other pair dropped (with the first few)."""
  from transformer.data.token_cache import TokenCache
  manifest = json.loads((Path(out) / "standin.json").read_text())
  shape = Shape(**manifest["shape"])
  junk = junk_positions(shape)
  kept = np.zeros(shape.pairs, bool)
  kept[np.asarray(TokenCache(cache_dir).index)] = True
  dropped = set(np.flatnonzero(~kept).tolist())
  others = sorted(dropped - set(junk))
  text = sources.TextFilePairs(*(Path(out) / f"train.{lang}" for lang in manifest["languages"]))
  examples = [dict(zip(("index", "source", "target"), (i, *(side[0] for side in text.read([i])))))
              for i in others[:5]]
  return {"injected": len(junk), "injected_dropped": len(dropped & set(junk)),
          "injected_kept": len(set(junk) - dropped), "other_dropped": len(others),
          "other_examples": examples}


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.check_cache:
    print(json.dumps(check_drops(FLAGS.out, FLAGS.check_cache), ensure_ascii=False))
    return
  if FLAGS.synthetic_ids:
    from transformer.data.token_cache import write_synthetic
    cache = write_synthetic(FLAGS.out, FLAGS.pairs, seed=FLAGS.seed)
    print(json.dumps({"cache": str(cache.directory), "pairs": len(cache),
                      "tokens": cache.meta["tokens"]}))
    return
  shape = Shape(pairs=FLAGS.pairs, word_types=FLAGS.word_types, seed=FLAGS.seed)
  manifest = generate(FLAGS.out, shape, FLAGS.src_lang, FLAGS.tgt_lang, workers=FLAGS.workers)
  print(json.dumps(manifest))


def run() -> None:
  flags.DEFINE_string("out", None, "Directory to write the corpus into.", required=True)
  flags.DEFINE_integer("pairs", Shape.pairs, "Training pairs (WMT14 En-De: 4.5M).")
  flags.DEFINE_integer("word_types", Shape.word_types, "Ranks of the Zipf law of made-up words.")
  flags.DEFINE_integer("seed", 0, "Seed of everything drawn.")
  flags.DEFINE_string("src_lang", "en", "Source language (a bundled Multi30k one: en, de, fr).")
  flags.DEFINE_string("tgt_lang", "de", "Target language.")
  flags.DEFINE_integer("workers", None, "Worker processes (default: the cores this job may use).")
  flags.DEFINE_string("check_cache", None, "Compare this training token cache's drops with the "
                      "junk injected into the corpus at --out, and print the result.")
  flags.DEFINE_bool("synthetic_ids", False, "Write a token cache of random ids with WMT-shaped "
                    "lengths instead of text (no vocabulary; for the loader at En-Fr's 40.8M).")
  from transformer.cli import run_program
  run_program("transformer.data.standin", main, compilation_cache=False)


if __name__ == "__main__":
  run()
