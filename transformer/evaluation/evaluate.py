"""Score a trained run: restore a checkpoint, translate with beam search, report sacreBLEU and the
paper's tokenized BLEU.

    transformer-eval --workdir=runs/m30k                       # latest checkpoint, config's eval split
    transformer-eval --workdir=runs/m30k --step=4000 --beam_size=1
    transformer-eval --workdir=runs/m30k --source_file=test.en --reference_file=test.de
    transformer-eval --workdir=runs/m30k --nbest=4             # also the 4 best of every sentence
    transformer-eval --workdir=runs/seed0 --ensemble=runs/seed1,runs/seed2

It runs as its own process, beside or after training, and rebuilds everything from the workdir
(config.json, vocab.model, checkpoints/). Results go to WORKDIR/eval/: the detokenized hypotheses
(and n-best lists), a JSON report (BLEU, chrF, signatures, checkpoint step, decode settings, speed),
and a 'bleu' record in metrics.jsonl; `--report_dir` sends the reports elsewhere (a run the user
may read but not write) and leaves the run untouched. Where the reports go is checked before
anything is decoded, and the scores are logged before they are written. Decoding is
translator.py's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from absl import app, flags

from transformer import progress
from transformer.cli import define_progress_flag, run_program
from transformer.data import pretokenize, sources
from transformer.decoding import translator
from transformer.errors import ConfigError
from transformer.evaluation import bleu
from transformer.evaluation.watch import watch
from transformer.files import writable_directory, writable_file
from transformer.metrics import METRICS_FILE, MetricWriter, evaluation_suffix, format_duration
from transformer.training import checkpoints
from transformer.training import workdir as runs

log = logging.getLogger("transformer")
FLAGS = flags.FLAGS


def test_set_name(split: str | None, source_file: str | None) -> str:
  """What reports call an evaluation set: the file's name without its language and compression
  ('long' for long.en, 'test_2016_flickr' for test_2016_flickr.en.gz), else the split."""
  if not source_file:
    return split
  path = Path(source_file)
  return Path(path.stem).stem if path.suffix == ".gz" else path.stem


def report_path(workdir: str | Path, test_set: str, step: int, averaged: int = 1,
                ensemble: int = 1, ema: bool = False, min_len: int = 0, search: str = "") -> Path:
  """WORKDIR/eval/<test set>_step<N>[_avg<K>][_ens<M>][<search>][_min<L>][_ema].json; the
  hypotheses sit beside it as .hyp.txt (and the n-best lists as .nbest.jsonl). A search other than
  the run config's (`search`: SearchSettings.tag) and a minimum output length have their own names,
  so comparing them with the default search keeps every report."""
  suffix = evaluation_suffix(averaged, ensemble, ema, min_len, search)
  return Path(workdir) / "eval" / f"{test_set}_step{step}{suffix}.json"


def nbest_lines(sources: Sequence[str], translations: translator.Translations) -> str:
  """One JSON line per sentence: its index, source, translation (the best-scored hypothesis, or
  the MBR choice) and hypotheses (best-scored first) with scores."""
  return "".join(json.dumps({"index": i, "source": source, "translation": translation,
                             "hypotheses": hypotheses}, ensure_ascii=False) + "\n"
                 for i, (source, translation, hypotheses) in enumerate(
                     zip(sources, translations.hypotheses, translations.nbest)))


def evaluate(workdir: str, step: int | None = None, split: str | None = None,
             source_file: str | None = None, reference_file: str | None = None,
             average_last: int = 1, ensemble: Sequence[str] = (),
             compiled_cache: dict | None = None, ema: bool = True,
             loaded: Sequence[runs.LoadedRun] | None = None, report_dir: str | None = None,
             **search: Any) -> dict[str, Any]:
  """Translates an evaluation set with a checkpoint of `workdir` (or an ensemble with the
  `ensemble` workdirs), scores it, writes the report. With `ema`, a run that keeps a moving average
  of its parameters is scored with it (report['ema'] says which were used). `loaded`: the runs
  already loaded by runs.load_runs, which then stand for `workdir`, `step`, `average_last` and
  `ensemble`. `report_dir`: where the reports go instead of WORKDIR/eval (then the run's
  metrics.jsonl gets no record). `search`:
  SearchSettings fields to override the config's decode settings (beam_size=1, nbest=4, ...; None =
  the config's)."""
  if (source_file is None) != (reference_file is None):
    raise ConfigError("pass both --source_file and --reference_file, or neither")
  check_reports_writable(workdir, report_dir)
  loaded = loaded or runs.load_runs([workdir, *ensemble], step, average_last)
  members = [str(run.workdir) for run in loaded]
  cfg, vocab, steps = loaded[0].config, loaded[0].vocab, loaded[0].steps
  ema = ema and loaded[0].ema_params is not None
  models = tuple(run.model for run in loaded)
  params = tuple(run.params(ema) for run in loaded)
  settings = translator.SearchSettings.from_config(cfg, **search)
  tag = settings.tag(translator.SearchSettings.from_config(cfg))
  if source_file:
    text = sources.read_parallel(source_file, reference_file)
    name = test_set_name(split, source_file)
  else:
    split = split or cfg.data.eval_split
    text = sources.load_split(cfg.data, split)
    name = split
  step = steps[-1]
  log.info("Translating %d sentences of %s with %s%s%s (%s)", len(text), text.name,
           "the parameters' moving average of " if ema else "",
           f"the checkpoint at step {step}" if len(steps) == 1 else
           f"the average of the checkpoints at steps {', '.join(map(str, steps))}",
           f" and {len(members) - 1} more run(s) as an ensemble" if len(members) > 1 else "",
           ", ".join(f"{k} {v}" for k, v in settings.describe().items()))
  t = time.time()
  form = pretokenize.text_form(cfg.data)
  result = translator.translate(models, params, vocab, text.source, settings,
                                max_source_len=cfg.data.max_len, compiled_cache=compiled_cache,
                                text_form=form)
  hypotheses, stats = result.hypotheses, result.stats
  if stats["truncated_sources"]:
    log.warning("%d source sentences were longer than %d tokens and were truncated",
                stats["truncated_sources"], cfg.data.max_len)
  score = bleu.sacrebleu_score(hypotheses, text.target, lowercase=form.lowercases)
  chrf = bleu.chrf_score(hypotheses, text.target, form.lowercases)
  paper_score = bleu.tokenized_bleu(hypotheses, text.target, cfg.data.tgt_lang, form.lowercases)
  lc_tok = bleu.lc_tok_bleu(hypotheses, text.target, cfg.data.tgt_lang)
  report = {"workdir": members[0], "checkpoint_step": step, "averaged_steps": steps,
            "ensemble": members if len(members) > 1 else None, "ema": ema,
            "test_set": name,
            "source": text.name, "direction": f"{cfg.data.src_lang}-{cfg.data.tgt_lang}",
            "sacrebleu": score, "chrf": chrf, "tokenized_bleu": paper_score,
            "lc_tok_bleu": lc_tok, "decode": settings.describe(), "search_tag": tag, **stats,
            "total_sec": time.time() - t}
  log.info("%s, step %d: sacreBLEU %.2f, chrF %.2f, tokenized BLEU %.2f, lowercased tokenized "
           "BLEU %.2f", name, step, score["bleu"], chrf["chrf"], paper_score["bleu"],
           lc_tok["bleu"])  # on the terminal even if the reports cannot be written
  report["files"] = write_report(report, result, text.source, settings, report_dir)
  return report


def check_reports_writable(workdir: str, report_dir: str | None,
                           advice: str = "pass --report_dir=DIR to write the reports there (the "
                           "run stays untouched), or make the run writable") -> None:
  """Before anything is loaded or decoded: the reports' folder (and, without `report_dir`, the
  run's metrics.jsonl) can be written; else a UserError saying what to do (`advice`)."""
  if report_dir:
    writable_directory(report_dir, "--report_dir", create=False)
    return
  if not (Path(workdir) / "config.json").exists():
    return  # not a workdir: load_runs says so
  writable_directory(Path(workdir) / "eval", "--report_dir", create=False, advice=advice)
  writable_file(Path(workdir) / METRICS_FILE, "--report_dir", advice=advice)


def write_report(report: dict[str, Any], result: translator.Translations, sources_: Sequence[str],
                 settings: translator.SearchSettings, report_dir: str | None = None) -> list[str]:
  """The hypotheses (and n-best lists), the JSON report and (without `report_dir`) a `bleu` record
  in metrics.jsonl and TensorBoard; returns the files written."""
  workdir, step, steps = report["workdir"], report["checkpoint_step"], report["averaged_steps"]
  members = len(report["ensemble"] or [None])
  json_path = report_path(workdir, report["test_set"], step, len(steps), members, report["ema"],
                          settings.min_len, report["search_tag"])
  if report_dir:
    json_path = Path(report_dir) / json_path.name
  hyp_path = json_path.with_suffix(".hyp.txt")
  json_path.parent.mkdir(parents=True, exist_ok=True)
  hyp_path.write_text("".join(h + "\n" for h in result.hypotheses))
  files = [str(hyp_path), str(json_path)]
  if settings.nbest > 1:
    nbest_path = json_path.with_suffix(".nbest.jsonl")
    nbest_path.write_text(nbest_lines(sources_, result))
    files.append(str(nbest_path))
  json_path.write_text(json.dumps(report, indent=2) + "\n")
  if report_dir:
    return files
  with MetricWriter(workdir, tensorboard_dir="eval") as writer:
    writer.write("bleu", step, test_set=report["test_set"], averaged=len(steps), ensemble=members,
                 ema=report["ema"], bleu=report["sacrebleu"]["bleu"], chrf=report["chrf"]["chrf"],
                 tokenized_bleu=report["tokenized_bleu"]["bleu"],
                 lc_tok_bleu=report["lc_tok_bleu"]["bleu"],
                 signature=report["sacrebleu"]["signature"], search_tag=report["search_tag"],
                 **settings.describe())
  return files


def main(argv: list[str]) -> None:
  if FLAGS.workdir is None:
    raise app.UsageError("pass --workdir=DIR, the directory transformer-train wrote")
  progress.configure(FLAGS.progress)
  search = translator.search_overrides()
  compiled: dict = {}  # beam searches compiled once, for every checkpoint and parameter set
  if FLAGS.watch:
    if FLAGS.report_dir:
      raise app.UsageError("--watch keeps its record in the run (eval/best.json, metrics.jsonl); "
                           "drop --report_dir, or evaluate single checkpoints with it")
    check_reports_writable(FLAGS.workdir, None, advice="--watch keeps its record in the run "
                           "(eval/, metrics.jsonl): make the run writable")
    cfg = checkpoints.load_run_config(FLAGS.workdir)
    settings = translator.SearchSettings.from_config(cfg, **search)
    watch(FLAGS.workdir, lambda step: evaluate(FLAGS.workdir, step=step, compiled_cache=compiled,
                                               ema=FLAGS.ema, **search),
          poll_seconds=FLAGS.poll_seconds, idle_minutes=FLAGS.idle_minutes,
          search_tag=settings.tag(translator.SearchSettings.from_config(cfg)),
          min_len=settings.min_len)
    return
  args = (FLAGS.workdir, FLAGS.step, FLAGS.split, FLAGS.source_file, FLAGS.reference_file,
          FLAGS.average_last, FLAGS.ensemble)
  check_reports_writable(FLAGS.workdir, FLAGS.report_dir)
  loaded = runs.load_runs([FLAGS.workdir, *FLAGS.ensemble], FLAGS.step, FLAGS.average_last)
  kwargs = dict(compiled_cache=compiled, loaded=loaded, report_dir=FLAGS.report_dir, **search)
  report = evaluate(*args, ema=FLAGS.ema, **kwargs)
  # The single checkpoint's own parameters, beside their moving average (same compiled search).
  raw = evaluate(*args, ema=False, **kwargs) if report["ema"] else None
  print_report(report)
  if raw:
    print(f"  without the moving average (the checkpoint's own parameters): sacreBLEU "
          f"{raw['sacrebleu']['bleu']:.2f}, chrF {raw['chrf']['chrf']:.2f}, tokenized BLEU "
          f"{raw['tokenized_bleu']['bleu']:.2f}, lowercased tokenized BLEU "
          f"{raw['lc_tok_bleu']['bleu']:.2f}; report: {raw['files'][1]}")


def print_report(report: dict[str, Any]) -> None:
  score = report["sacrebleu"]
  averaged = len(report["averaged_steps"])
  members = len(report["ensemble"] or [])
  print(f"{report['test_set']} ({report['direction']}, {score['lines']} lines), step "
        f"{report['checkpoint_step']}{f' (average of {averaged})' if averaged > 1 else ''}"
        f"{' (moving average of the parameters)' if report['ema'] else ''}"
        f"{f', ensemble of {members} runs' if members else ''}: "
        f"sacreBLEU {score['bleu']:.2f}  {score['signature']}")
  print(f"  length {score['hyp_len'] / score['ref_len']:.3f} of the references' (sacreBLEU's "
        f"tokens; brevity penalty {score['brevity_penalty']:.3f})")
  print(f"  chrF {report['chrf']['chrf']:.2f}  {report['chrf']['signature']}")
  paper = report["tokenized_bleu"]
  print(f"  tokenized BLEU (the paper's: {paper['tokenizer']}, {paper['case']}, multi-bleu) "
        f"{paper['bleu']:.2f}")
  print(f"  lowercased tokenized BLEU (the Multi30k literature's: lc.norm.tok, multi-bleu) "
        f"{report['lc_tok_bleu']['bleu']:.2f}")
  devices = report.get("devices", 1)
  mbr_time = f"+{report['mbr_sec']:.1f}s MBR, " if "mbr_sec" in report else ""
  print(f"decoded {report['sentences']} sentences"
        f"{f' on {devices} devices' if devices > 1 else ''} in {format_duration(report['decode_sec'])} "
        f"({report['sentences_per_sec']:.1f} sentences/s, {report['target_tokens_per_sec']:.0f} "
        f"target tokens/s; +{report['compile_sec']:.1f}s compile, "
        f"{mbr_time}{format_duration(report['total_sec'])} in all); report: {report['files'][1]}")


def run() -> None:
  """Console-script entry point."""
  flags.DEFINE_string("workdir", None, "Training workdir (config.json, vocab.model, checkpoints/).")
  flags.DEFINE_integer("step", None, "Checkpoint step to evaluate (default: the latest).")
  flags.DEFINE_string("split", None, "Split of the config's dataset (default: config.data.eval_split).")
  flags.DEFINE_string("source_file", None, "Evaluate on this source text file instead of a split.")
  flags.DEFINE_string("reference_file", None, "Reference translations of --source_file.")
  flags.DEFINE_string("report_dir", None, "Write the reports (hypotheses, JSON) here instead of "
                      "WORKDIR/eval, and nothing into the run: for a run you may read but not "
                      "write.")
  translator.define_search_flags()
  flags.DEFINE_bool("watch", False, "Run beside training: evaluate every new checkpoint on the "
                    "validation split, track the best, stop when training has finished.")
  flags.DEFINE_float("poll_seconds", 60, "With --watch: how often to look for new checkpoints.")
  flags.DEFINE_float("idle_minutes", 0, "With --watch: also stop after this long without a new "
                     "checkpoint (0 = wait until training finishes).")
  flags.DEFINE_integer("average_last", 1, "Average the parameters of the last N checkpoints (up to "
                       "--step if given), as the paper did: 5 for base, 20 for big.")
  flags.DEFINE_bool("ema", True, "Score the moving average of the parameters where the run keeps "
                    "one (config.train.ema_decay > 0), with the checkpoint's own parameters' score "
                    "beside it; --noema scores only the latter.")
  define_progress_flag()
  run_program("transformer-eval", main)


if __name__ == "__main__":
  run()
