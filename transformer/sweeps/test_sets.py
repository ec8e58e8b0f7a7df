"""Extra test sets a grid can ask for, written once per experiment as plain parallel text files,
and the held-out test sets of a corpus, read from a folder the user provides.

'long' tests the paper's argument for sinusoids (Section 3.5: they "may allow the model to extrapolate
to sequence lengths longer than the ones encountered during training"): consecutive sentence pairs of
the dev split are joined into one sentence each side (", and" / ", und"), until the joined source is
longer (in subword tokens, EOS included) than the longest source the training run keeps. Every long
source is then beyond every position a learned table was trained on. Joined sources longer than
`data.max_len` are left out, since evaluation truncates there.

The held-out sets (`held_out`) are Multi30k's official test sets, which the project does not bundle:
a grid given `--test_dir` scores every run on them too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
import sentencepiece as spm

from transformer.data import sources
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError

log = logging.getLogger("transformer")
READ_CHUNK = 50_000  # training pairs read and tokenized at a time (WMT has millions)


def longest_training_source(cfg: ml_collections.ConfigDict, vocab: spm.SentencePieceProcessor) -> int:
  """Tokens (with EOS) of the longest training source that training keeps (<= data.max_len)."""
  train = sources.open_split(cfg.data, cfg.data.train_split)
  longest = 0
  for start in range(0, len(train), READ_CHUNK):
    source, _ = train.read(range(start, min(start + READ_CHUNK, len(train))))
    lengths = [len(ids) + 1 for ids in vocab.encode(source)]
    longest = max([longest] + [n for n in lengths if n <= cfg.data.max_len])
  return longest


# Clauses are joined into one sentence with a comma and the language's "and": joined with plain
# spaces, a model trained on single sentences translates the first and stops, and the set would measure
# that rather than positions.
CONJUNCTIONS = {"en": "and", "de": "und", "fr": "et", "cs": "a", "es": "y", "it": "e", "ro": "și"}


def join_clauses(parts: list[str], lang: str) -> str:
  """'A man sits.' + 'A dog runs.' -> 'A man sits, and a dog runs.': final punctuation of all but the
  last part dropped; later parts lower-cased at their first letter, except in German (nouns)."""
  conjunction = CONJUNCTIONS.get(lang)
  if conjunction is None:
    return " ".join(p.strip() for p in parts)
  clauses = [p.strip() for p in parts]
  clauses = [c.rstrip(".!?;,").rstrip() for c in clauses[:-1]] + clauses[-1:]
  if lang != "de":
    clauses = clauses[:1] + [c[:1].lower() + c[1:] for c in clauses[1:]]
  return f", {conjunction} ".join(clauses)


def join_until_longer(source: list[str], target: list[str], vocab: spm.SentencePieceProcessor,
                      longer_than: int, max_len: int, src_lang: str = "",
                      tgt_lang: str = "") -> tuple[list[str], list[str]]:
  """Joins consecutive pairs until the source exceeds `longer_than` tokens; drops those over max_len."""
  long_source, long_target = [], []
  parts_src: list[str] = []
  parts_tgt: list[str] = []
  for s, t in zip(source, target):
    parts_src.append(s)
    parts_tgt.append(t)
    joined = join_clauses(parts_src, src_lang)
    length = len(vocab.encode(joined)) + 1
    if length > longer_than:
      if length <= max_len:
        long_source.append(joined)
        long_target.append(join_clauses(parts_tgt, tgt_lang))
      parts_src, parts_tgt = [], []
  return long_source, long_target


def long_sentences(cfg: ml_collections.ConfigDict, vocab: spm.SentencePieceProcessor,
                   out_dir: Path) -> dict[str, Any]:
  """Writes out_dir/long.{src,tgt} and long.json; returns the description stored there."""
  longest = longest_training_source(cfg, vocab)
  if longest >= cfg.data.max_len:
    raise ConfigError(f"training keeps sources up to config.data.max_len = {cfg.data.max_len} tokens, "
                     "so a longer test sentence would be truncated at evaluation; lower data.max_len "
                     "(e.g. --base.data.max_len=64) to test length extrapolation")
  dev = sources.load_split(cfg.data, cfg.data.eval_split)
  source, target = join_until_longer(dev.source, dev.target, vocab, longest, cfg.data.max_len,
                                     cfg.data.src_lang, cfg.data.tgt_lang)
  if not source:
    raise ConfigError(f"no joined dev sentences fit between {longest} and {cfg.data.max_len} tokens")
  lengths = np.array([len(ids) + 1 for ids in vocab.encode(source)])
  info = {"name": "long", "how": "consecutive dev pairs joined into one sentence (', and' / ', und') "
                                 "until the source is longer than the longest training source",
          "dev_split": cfg.data.eval_split, "longest_training_source_tokens": longest,
          "sentences": len(source), "source_tokens_min": int(lengths.min()),
          "source_tokens_mean": round(float(lengths.mean()), 1),
          "source_tokens_max": int(lengths.max()),
          "source_file": str(out_dir / f"long.{cfg.data.src_lang}"),
          "reference_file": str(out_dir / f"long.{cfg.data.tgt_lang}")}
  out_dir.mkdir(parents=True, exist_ok=True)
  Path(info["source_file"]).write_text("".join(s + "\n" for s in source), encoding="utf-8")
  Path(info["reference_file"]).write_text("".join(t + "\n" for t in target), encoding="utf-8")
  (out_dir / "long.json").write_text(json.dumps(info, indent=2) + "\n")
  log.info("Test set 'long': %d sentences of %d-%d source tokens (longest in training: %d)",
           len(source), info["source_tokens_min"], info["source_tokens_max"], longest)
  return info


BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {"long": long_sentences}


def planned(name: str, cfg: ml_collections.ConfigDict, out_dir: Path) -> dict[str, Any]:
  """Where `build` writes the test set `name` (its source and reference files), without building
  it: what the commands of `transformer-experiment --print_commands` name, on a machine that may
  not have the data."""
  if name not in BUILDERS:
    raise ConfigError(f"unknown test set {name!r}; known: {', '.join(BUILDERS)}")
  return {"name": name, "source_file": str(out_dir / f"{name}.{cfg.data.src_lang}"),
          "reference_file": str(out_dir / f"{name}.{cfg.data.tgt_lang}")}


def build(name: str, cfg: ml_collections.ConfigDict, seed: int, out_dir: Path) -> dict[str, Any]:
  """The test set `name` for runs of `cfg`, built once: read from out_dir/<name>.json if there.

  The vocabulary is the one training builds and caches for this dataset and `seed`.
  """
  if name not in BUILDERS:
    raise ConfigError(f"unknown test set {name!r}; known: {', '.join(BUILDERS)}")
  described = out_dir / f"{name}.json"
  if described.is_file():
    return json.loads(described.read_text())
  train = sources.open_split(cfg.data, cfg.data.train_split)
  vocab = vocab_lib.load_vocab(vocab_lib.cached_vocab(cfg.data, train, seed))
  return BUILDERS[name](cfg, vocab, out_dir)


HELD_OUT = tuple(sources.MULTI30K_TEST_URLS)  # test_2016_flickr, test_2017_flickr, test_2017_mscoco


def held_out(test_dir: str | Path, src: str, tgt: str, check: bool = True
             ) -> dict[str, dict[str, str]]:
  """The source and reference file of each held-out test set in `test_dir` (the release's raw
  files, .gz or plain): {name: {'source_file': ..., 'reference_file': ...}}. Every file must be
  there; the error names each missing one with the address to download it from. `check=False`
  names the .gz file where none is found (commands printed for another machine)."""
  found, missing = {}, []
  for name in HELD_OUT:
    pair = []
    for lang in (src, tgt):
      options = [Path(test_dir) / f"{name}.{lang}{suffix}" for suffix in (".gz", "")]
      present = [p for p in options if p.is_file()] or ([] if check else options[:1])
      if present:
        pair.append(str(present[0]))
      else:
        missing.append(sources.MULTI30K_TEST_URLS[name].format(lang=lang))
    if len(pair) == 2:
      found[name] = {"source_file": pair[0], "reference_file": pair[1]}
  if missing:
    folder = missing[0].rsplit("/", 1)[0]
    names = ", ".join(url.rsplit("/", 1)[1] for url in missing)
    raise ConfigError(f"{len(missing)} test file(s) missing in {test_dir}: {names}; download them "
                      f"there from {folder}/ (curl -LO {folder}/NAME)")
  return found
