"""Translate text with a trained (or averaged) workdir: stdin -> stdout, or files.

    echo "A man is riding a bicycle." | transformer-translate --workdir=runs/m30k
    transformer-translate --workdir=runs/m30k --input_file=in.en --output_file=out.de --beam_size=1

One output line per input line, in the input's order; sentences are batched by length for speed
(evaluate.translate, compiled once per length bucket). Empty input lines give empty output lines;
lines longer than the model's source limit (config.data.max_len tokens) are truncated, with a warning.
Beam size, alpha (GNMT length penalty) and greedy search (--beam_size=1) are selectable; the config's
decode settings are the defaults. Logs go to stderr, translations to stdout.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from absl import app, flags

from transformer import checkpoints, progress
from transformer.cli import define_progress_flag, run_program
from transformer.config import ConfigError
from transformer.data import sources
from transformer.evaluate import decode_settings, load_model, translate

log = logging.getLogger("transformer")
FLAGS = flags.FLAGS


def read_input(input_file: str | None) -> list[str]:
  if input_file:
    lines = sources.read_lines(input_file)
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
  path = Path(output_file)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, path)  # a failed run never leaves half a file


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.workdir is None:
    raise app.UsageError("pass --workdir=DIR, the directory transformer-train wrote")
  try:
    progress.configure(FLAGS.progress)
    sentences = read_input(FLAGS.input_file)
    cfg = checkpoints.load_run_config(FLAGS.workdir)
    settings = decode_settings(cfg, FLAGS.beam_size, FLAGS.alpha, FLAGS.max_extra_len)
    cfg, vocab, model, params, steps = load_model(FLAGS.workdir, FLAGS.step, FLAGS.average_last)
    hypotheses, stats = translate(model, params, vocab, sentences,
                                  tokens_per_batch=cfg.decode.tokens_per_batch,
                                  max_source_len=cfg.data.max_len, **settings)
    if stats["truncated_sources"]:
      log.warning("%d input lines were longer than %d tokens and were truncated to that length",
                  stats["truncated_sources"], cfg.data.max_len)
    write_output(hypotheses, FLAGS.output_file)
  except (ConfigError, sources.DataError, checkpoints.CheckpointError) as e:
    sys.exit(f"transformer-translate: error: {e}")
  log.info("Translated %d lines with step %d%s (%.1f sentences/s, +%.1fs compile)", len(sentences),
           steps[-1], f" (average of {len(steps)})" if len(steps) > 1 else "",
           stats["sentences_per_sec"], stats["compile_sec"])


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_string("workdir", None, "Training (or transformer-average) workdir.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_integer("average_last", 1, "Average the last N checkpoints' parameters.")
  flags.DEFINE_string("input_file", None, "Sentences to translate, one per line (default: stdin).")
  flags.DEFINE_string("output_file", None, "Where to write translations (default: stdout).")
  flags.DEFINE_integer("beam_size", None, "Beam size (default: config.decode.beam_size; 1 = greedy).")
  flags.DEFINE_float("alpha", None, "Length-penalty alpha (default: config.decode.alpha).")
  flags.DEFINE_integer("max_extra_len", None, "Output length limit = input length + this.")
  define_progress_flag()
  run_program("transformer-translate", main)


if __name__ == "__main__":
  run()
