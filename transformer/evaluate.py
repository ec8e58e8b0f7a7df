"""The evaluation program: restore a checkpoint, translate with beam search, score with sacreBLEU.

    transformer-eval --workdir=runs/m30k                       # latest checkpoint, config's eval split
    transformer-eval --workdir=runs/m30k --step=4000 --beam_size=1
    transformer-eval --workdir=runs/m30k --source_file=test.en --reference_file=test.de

It runs as its own process, beside or after training, and rebuilds everything from the workdir
(config.json, vocab.model, checkpoints/). Results go to WORKDIR/eval/: the detokenized hypotheses and
a JSON report (BLEU, signature, checkpoint step, decode settings, speed), and a 'bleu' record in
metrics.jsonl. Decoding is batched by source length and compiled once per length bucket.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import sentencepiece as spm
from absl import app, flags

from transformer import bleu, checkpoints, decode, partitioning, progress
from transformer.cli import define_progress_flag, run_program
from transformer.config import ConfigError
from transformer.data import sources
from transformer.data import vocab as vocab_lib
from transformer.data.batching import pad_rows
from transformer.metrics import MetricWriter, format_duration
from transformer.model import EOS_ID, ModelConfig, Transformer
from transformer.train import abstract_train_state

log = logging.getLogger("transformer")
FLAGS = flags.FLAGS
DECODE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024)  # coarse: decoding time barely depends on padding


def load_model(workdir: str | Path, step: int | None = None, average_last: int = 1
               ) -> tuple[ml_collections.ConfigDict, spm.SentencePieceProcessor, Transformer, Any,
                          list[int]]:
  """(config, vocabulary, model, parameters, steps) of a training workdir's checkpoint, or the mean
  parameters of its last `average_last` checkpoints (up to `step` if given)."""
  cfg = checkpoints.load_run_config(workdir)
  vocab = vocab_lib.load_run_vocab(workdir, cfg.data)
  model = Transformer(ModelConfig.from_config(cfg.model, vocab.get_piece_size()))
  mesh = partitioning.data_mesh()
  mngr = checkpoints.manager(workdir, read_only=True)
  abstract = abstract_train_state(cfg, model, partitioning.replicated(mesh))
  if average_last == 1:
    state = checkpoints.restore(mngr, abstract, step)
    return cfg, vocab, model, state.params, [int(state.step)]
  steps = checkpoints.last_steps(mngr, average_last, up_to=step)
  log.info("Averaging the parameters of the checkpoints at steps %s", ", ".join(map(str, steps)))
  return cfg, vocab, model, checkpoints.average_params(mngr, abstract, steps), steps


def translate(model: Transformer, params: Any, vocab: spm.SentencePieceProcessor,
              sentences: Sequence[str], beam_size: int, alpha: float, max_extra_len: int,
              tokens_per_batch: int, max_source_len: int, compiled_cache: dict | None = None
              ) -> tuple[list[str], dict[str, float]]:
  """Translates `sentences` (order kept) and returns them with timing figures.

  Sources longer than `max_source_len` tokens are truncated (and counted). Empty sources give empty
  translations. beam_size 1 uses greedy search. Pass the same `compiled_cache` dict to later calls
  (other checkpoints of the same model) to reuse the compiled search functions.
  """
  compiled_cache = {} if compiled_cache is None else compiled_cache
  mesh = partitioning.data_mesh()
  encoded = [vocab.encode(s) if s.strip() else [] for s in sentences]
  truncated = sum(len(e) > max_source_len - 1 for e in encoded)
  ids = [e[:max_source_len - 1] + [EOS_ID] if e else [] for e in encoded]
  order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
  max_output = model.config.max_len if model.config.positional == "learned" else None

  def bucket(length):  # never longer than max_source_len, the limit of learned position tables
    return min(next((b for b in DECODE_BUCKETS if b >= length), length), max_source_len)

  groups: dict[int, list[int]] = {}
  for i in order:
    groups.setdefault(bucket(len(ids[i])), []).append(i)

  if beam_size == 1:
    search = lambda p, src, lim, decode_len: decode.greedy_search(
        model, p, src, lim, decode_len)
  else:
    search = lambda p, src, lim, decode_len: decode.beam_search(
        model, p, src, lim, decode_len, beam_size, alpha)[0]
  outputs: list[list[int]] = [[] for _ in sentences]
  compile_time, decode_time = 0.0, 0.0
  with progress.Progress("translating", len(order), "sentences", line_seconds=10.0) as bar:
    for length, members in groups.items():
      decode_len = length + max_extra_len if max_output is None else min(length + max_extra_len,
                                                                         max_output)
      rows = max(mesh.size, tokens_per_batch // length // mesh.size * mesh.size)
      fn = jax.jit(functools.partial(search, decode_len=decode_len))
      key = (length, rows, decode_len, beam_size, alpha)
      compiled = compiled_cache.get(key)
      for start in range(0, len(members), rows):
        chunk = members[start:start + rows]
        src = pad_rows([np.array(ids[i], np.int32) for i in chunk], length, rows)
        src_len = (src != 0).sum(1)
        limits = np.where(src_len > 0, np.minimum(src_len + max_extra_len, decode_len), 1)
        batch = partitioning.shard_batch({"src": src, "limits": limits.astype(np.int32)}, mesh)
        if compiled is None:
          t = time.time()
          compiled = compiled_cache[key] = fn.lower(params, batch["src"], batch["limits"]).compile()
          compile_time += time.time() - t
        t = time.time()
        tokens = np.asarray(jax.device_get(compiled(params, batch["src"], batch["limits"])))
        decode_time += time.time() - t
        for row, i in enumerate(chunk):
          out = tokens[row].tolist()
          outputs[i] = out[:out.index(EOS_ID)] if EOS_ID in out else out
        bar.update(len(chunk), tokens=sum(len(outputs[i]) for i in chunk))
  hypotheses = [vocab.decode(o) for o in outputs]
  stats = {"sentences": len(sentences), "truncated_sources": truncated,
           "compile_sec": compile_time, "decode_sec": decode_time,
           "sentences_per_sec": len(sentences) / decode_time if decode_time else float("nan")}
  return hypotheses, stats


def decode_settings(cfg: ml_collections.ConfigDict, beam_size: int | None, alpha: float | None,
                    max_extra_len: int | None) -> dict[str, Any]:
  """The config's decode settings with the given overrides, checked."""
  settings = {"beam_size": cfg.decode.beam_size if beam_size is None else beam_size,
              "alpha": cfg.decode.alpha if alpha is None else alpha,
              "max_extra_len": cfg.decode.max_extra_len if max_extra_len is None else max_extra_len}
  if settings["beam_size"] < 1 or settings["alpha"] < 0 or settings["max_extra_len"] < 0:
    raise ConfigError(f"decode settings must be beam_size >= 1, alpha >= 0, max_extra_len >= 0; "
                      f"got {settings}")
  return settings


def test_set_name(split: str | None, source_file: str | None) -> str:
  """What reports call an evaluation set: the file's stem ('long' for long.en), else the split."""
  return Path(source_file).stem if source_file else split


def report_path(workdir: str | Path, test_set: str, step: int, averaged: int = 1) -> Path:
  """WORKDIR/eval/<test set>_step<N>[_avg<K>].json; the hypotheses sit beside it as .hyp.txt."""
  stem = f"{test_set}_step{step}" + (f"_avg{averaged}" if averaged > 1 else "")
  return Path(workdir) / "eval" / f"{stem}.json"


def evaluate(workdir: str, step: int | None = None, split: str | None = None,
             source_file: str | None = None, reference_file: str | None = None,
             beam_size: int | None = None, alpha: float | None = None,
             max_extra_len: int | None = None, average_last: int = 1,
             compiled_cache: dict | None = None) -> dict[str, Any]:
  """Translates an evaluation set with a checkpoint of `workdir`, scores it, writes the report."""
  cfg = checkpoints.load_run_config(workdir)
  if (source_file is None) != (reference_file is None):
    raise ConfigError("pass both --source_file and --reference_file, or neither")
  settings = decode_settings(cfg, beam_size, alpha, max_extra_len)
  if source_file:
    text = sources.read_parallel(source_file, reference_file)
    name = test_set_name(split, source_file)
  else:
    split = split or cfg.data.eval_split
    text = sources.load_split(cfg.data, split)
    name = split
  cfg, vocab, model, params, steps = load_model(workdir, step, average_last)
  step = steps[-1]
  log.info("Translating %d sentences of %s with %s (beam %d, alpha %.2f)", len(text), text.name,
           f"the checkpoint at step {step}" if len(steps) == 1 else
           f"the average of the checkpoints at steps {', '.join(map(str, steps))}",
           settings["beam_size"], settings["alpha"])
  t = time.time()
  hypotheses, stats = translate(model, params, vocab, text.source,
                                tokens_per_batch=cfg.decode.tokens_per_batch,
                                max_source_len=cfg.data.max_len, compiled_cache=compiled_cache,
                                **settings)
  if stats["truncated_sources"]:
    log.warning("%d source sentences were longer than %d tokens and were truncated",
                stats["truncated_sources"], cfg.data.max_len)
  score = bleu.sacrebleu_score(hypotheses, text.target)
  paper_score = bleu.tokenized_bleu(hypotheses, text.target, cfg.data.tgt_lang)
  report = {"workdir": str(workdir), "checkpoint_step": step, "averaged_steps": steps,
            "test_set": name,
            "source": text.name, "direction": f"{cfg.data.src_lang}-{cfg.data.tgt_lang}",
            "sacrebleu": score, "tokenized_bleu": paper_score, "decode": settings, **stats,
            "total_sec": time.time() - t}
  json_path = report_path(workdir, name, step, len(steps))
  hyp_path = json_path.with_suffix(".hyp.txt")
  json_path.parent.mkdir(exist_ok=True)
  hyp_path.write_text("".join(h + "\n" for h in hypotheses))
  json_path.write_text(json.dumps(report, indent=2) + "\n")
  with MetricWriter(workdir, tensorboard_dir="eval") as writer:
    writer.write("bleu", step, test_set=name, averaged=len(steps), bleu=score["bleu"],
                 tokenized_bleu=paper_score["bleu"], signature=score["signature"], **settings)
  report["files"] = [str(hyp_path), str(json_path)]
  return report


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.workdir is None:
    raise app.UsageError("pass --workdir=DIR, the directory transformer-train wrote")
  try:
    progress.configure(FLAGS.progress)
    if FLAGS.watch:
      from transformer.watch import watch
      watch(FLAGS.workdir, poll_seconds=FLAGS.poll_seconds, idle_minutes=FLAGS.idle_minutes,
            beam_size=FLAGS.beam_size, alpha=FLAGS.alpha, max_extra_len=FLAGS.max_extra_len)
      return
    report = evaluate(FLAGS.workdir, FLAGS.step, FLAGS.split, FLAGS.source_file,
                      FLAGS.reference_file, FLAGS.beam_size, FLAGS.alpha, FLAGS.max_extra_len,
                      FLAGS.average_last)
  except (ConfigError, sources.DataError, checkpoints.CheckpointError) as e:
    sys.exit(f"transformer-eval: error: {e}")
  score = report["sacrebleu"]
  averaged = len(report["averaged_steps"])
  print(f"{report['test_set']} ({report['direction']}, {score['lines']} lines), step "
        f"{report['checkpoint_step']}{f' (average of {averaged})' if averaged > 1 else ''}: "
        f"sacreBLEU {score['bleu']:.2f}  {score['signature']}")
  paper = report["tokenized_bleu"]
  print(f"  tokenized BLEU (the paper's: {paper['tokenizer']}, cased, multi-bleu) "
        f"{paper['bleu']:.2f}")
  print(f"decoded {report['sentences']} sentences in {format_duration(report['decode_sec'])} "
        f"({report['sentences_per_sec']:.1f} sentences/s, +{report['compile_sec']:.1f}s compile); "
        f"report: {report['files'][1]}")


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_string("workdir", None, "Training workdir (config.json, vocab.model, checkpoints/).")
  flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the latest).")
  flags.DEFINE_string("split", None, "Split of the config's dataset (default: config.data.eval_split).")
  flags.DEFINE_string("source_file", None, "Evaluate on this source text file instead of a split.")
  flags.DEFINE_string("reference_file", None, "Reference translations of --source_file.")
  flags.DEFINE_integer("beam_size", None, "Beam size (default: config.decode.beam_size; 1 = greedy).")
  flags.DEFINE_float("alpha", None, "Length-penalty alpha (default: config.decode.alpha).")
  flags.DEFINE_integer("max_extra_len", None, "Output length limit = input length + this.")
  flags.DEFINE_bool("watch", False, "Run beside training: evaluate every new checkpoint on the "
                    "validation split, track the best, stop when training has finished.")
  flags.DEFINE_float("poll_seconds", 60, "With --watch: how often to look for new checkpoints.")
  flags.DEFINE_float("idle_minutes", 0, "With --watch: also stop after this long without a new "
                     "checkpoint (0 = wait until training finishes).")
  flags.DEFINE_integer("average_last", 1, "Average the parameters of the last N checkpoints (up to "
                       "--step if given), as the paper did: 5 for base, 20 for big.")
  define_progress_flag()
  run_program("transformer-eval", main)


if __name__ == "__main__":
  run()
