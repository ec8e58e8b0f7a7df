"""Translate (or score) text with a trained (or averaged) workdir: stdin -> stdout, or files.

    echo "A man is riding a bicycle." | transformer-translate --workdir=runs/m30k
    transformer-translate --workdir=runs/m30k --input_file=in.en --output_file=out.de --beam_size=1
    transformer-translate --workdir=runs/m30k --input_file=in.en --output_file=out.de --nbest=4
    transformer-translate --workdir=runs/m30k --input_file=mono.en --search=sample --top_p=0.9 --seed=1
    transformer-translate --workdir=runs/m30k --input_file=in.en --score=out.de   # JSON lines
    transformer-translate --workdir=runs/seed0 --ensemble=runs/seed1,runs/seed2 < in.en

One output line per input line, in the input's order; sentences are batched by length for speed
(translator.py, compiled once per length bucket). Empty input lines give empty output lines;
lines longer than the model's source limit (config.data.max_len tokens) are truncated, with a warning.
Beam size, alpha (GNMT length penalty), greedy search (--beam_size=1), n-best lists (--nbest: JSON
lines, to stdout or beside --output_file as .nbest.jsonl), sampling (--search=sample with --temperature,
--top_k, --top_p, --seed) and ensembles (--ensemble) are selectable; the config's decode settings are
the defaults. --score gives forced-decoding log-probabilities instead. Logs go to stderr, results to
stdout.
"""

from __future__ import annotations

import json
import logging
import sys

from absl import app, flags

from transformer import progress
from transformer.cli import define_progress_flag, run_program
from transformer.data import pretokenize, sources, text_files
from transformer.decoding import translator
from transformer.evaluation.evaluate import nbest_lines
from transformer.files import writable_file, write_atomically
from transformer.training import workdir as runs

log = logging.getLogger("transformer")
FLAGS = flags.FLAGS


def read_input(input_file: str | None) -> list[str]:
  if input_file:
    lines = text_files.read_lines(input_file)
  else:
    data = sys.stdin.buffer.read()
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise sources.DataError(f"standard input is not valid UTF-8 (byte {e.start}); re-encode "
                              "it") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
      lines.pop()
    lines = [line.rstrip("\r") for line in lines]
  if not lines:
    raise sources.DataError(f"no input sentences in {input_file or 'standard input'}; give one "
                            "sentence per line")
  return lines


def write_output(lines: list[str], output_file: str | None) -> None:
  text = "".join(line + "\n" for line in lines)
  if not output_file:
    sys.stdout.write(text)
    return
  write_atomically(output_file, text)


def main(argv: list[str]) -> None:
  if FLAGS.workdir is None:
    raise app.UsageError("pass --workdir=DIR, the directory transformer-train wrote")
  progress.configure(FLAGS.progress)
  sentences = read_input(FLAGS.input_file)
  targets = text_files.read_lines(FLAGS.score) if FLAGS.score else None
  search = translator.search_overrides()
  if FLAGS.output_file:  # before anything is loaded or decoded
    writable_file(FLAGS.output_file, "--output_file")
  loaded = runs.load_runs([FLAGS.workdir, *FLAGS.ensemble], FLAGS.step, FLAGS.average_last)
  cfg, vocab, steps = loaded[0].config, loaded[0].vocab, loaded[0].steps
  models, params = tuple(r.model for r in loaded), tuple(r.params() for r in loaded)
  settings = translator.SearchSettings.from_config(cfg, **search)
  if targets is not None:
    scores = translator.score(models, params, vocab, sentences, targets,
                              tokens_per_batch=settings.tokens_per_batch,
                              max_len=cfg.data.max_len,
                              text_form=pretokenize.text_form(cfg.data))
    write_output([json.dumps(s, ensure_ascii=False) for s in scores], FLAGS.output_file)
    tokens = sum(s["tokens"] for s in scores)
    log.info("Scored %d pairs with step %d: mean NLL %.4f per target token (%d tokens)",
             len(scores), steps[-1], -sum(s["log_prob"] for s in scores) / tokens, tokens)
    return
  result = translator.translate(models, params, vocab, sentences, settings,
                                max_source_len=cfg.data.max_len,
                                text_form=pretokenize.text_form(cfg.data))
  stats = result.stats
  if stats["truncated_sources"]:
    log.warning("%d input lines were longer than %d tokens and were truncated to that length",
                stats["truncated_sources"], cfg.data.max_len)
  if settings.nbest > 1 and not FLAGS.output_file:  # the lists are the output
    sys.stdout.write(nbest_lines(sentences, result))
  else:
    write_output(result.hypotheses, FLAGS.output_file)
    if settings.nbest > 1:
      write_output(nbest_lines(sentences, result).splitlines(), FLAGS.output_file + ".nbest.jsonl")
  speed = (f"{stats['sentences_per_sec']:.1f} sentences/s, +{stats['compile_sec']:.1f}s compile"
           if stats["decode_sec"] else "every line empty: nothing to decode")
  log.info("Translated %d lines with step %d%s%s (%s)", len(sentences), steps[-1],
           f" (average of {len(steps)})" if len(steps) > 1 else "",
           f", an ensemble of {len(models)} runs" if len(models) > 1 else "", speed)


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_string("workdir", None, "Training (or transformer-average) workdir.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_integer("average_last", 1, "Average the last N checkpoints' parameters.")
  flags.DEFINE_string("input_file", None, "Sentences to translate, one per line (default: stdin).")
  flags.DEFINE_string("output_file", None, "Where to write translations (default: stdout).")
  flags.DEFINE_string("score", None, "Instead of translating, score the target sentences in this "
                      "file (one per input line): writes one JSON line per pair with the "
                      "log-probability of the sentence and of each token (forced decoding).")
  translator.define_search_flags(deprecated_sample_flag=True)
  define_progress_flag()
  run_program("transformer-translate", main)


if __name__ == "__main__":
  run()
