"""Why are hypotheses shorter than references: the search, or the model?

    python -m experiments.analyses.short_outputs --workdir=runs/m30k [--step=N] [--output=FILE.md]

Decodes the validation set with greedy search and with beam 4 at several length penalties α, and
reports BLEU, brevity penalty and the hypothesis/reference length ratio of each. Then it scores, with
forced decoding, each reference and each beam-4 (α from the config) output under the search's own
objective, log P / ((5 + |y|) / 6)^α: where the reference scores higher, the search missed a better
(and longer) answer — a search error; where the output scores higher, the model itself prefers the
shorter sentence — a model error, which no search fix can repair.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from transformer.cli import run_program
from transformer.data import sources
from transformer.decoding import translator
from transformer.evaluation import bleu
from transformer.training.workdir import load_run

FLAGS = flags.FLAGS


def objective(log_prob: float, tokens: int, alpha: float) -> float:
  """The beam search's score of a finished hypothesis (GNMT length penalty)."""
  return log_prob / ((5.0 + tokens) / 6.0) ** alpha


def main(argv: list[str]) -> None:
  if not FLAGS.workdir:
    raise app.UsageError("pass --workdir=DIR (a training workdir)")
  run = load_run(FLAGS.workdir, FLAGS.step)
  cfg, vocab, model, params, steps = run.config, run.vocab, run.model, run.params(), run.steps
  text = sources.load_split(cfg.data, cfg.data.eval_split)
  compiled: dict = {}
  which = "moving average" if run.ema_params is not None else "raw parameters"
  lines = [f"Checkpoint: {FLAGS.workdir} step {steps[-1]} ({which}), "
           f"{len(text)} {cfg.data.eval_split} sentences.", "",
           "| search | sacreBLEU | brevity penalty | hyp / ref words | empty outputs |",
           "|---|---|---|---|---|"]
  searches = [("greedy", 1, 0.0)] + [(f"beam 4, α {a}", 4, float(a)) for a in FLAGS.alphas]
  outputs = {}
  for name, beam, alpha in searches:
    settings = translator.SearchSettings(beam_size=beam, alpha=alpha)
    hyps = translator.translate(model, params, vocab, text.source, settings, cfg.data.max_len,
                                compiled_cache=compiled).hypotheses
    outputs[(beam, alpha)] = hyps
    score = bleu.sacrebleu_score(hyps, text.target)
    lines.append(f"| {name} | {score['bleu']:.2f} | {score['brevity_penalty']:.3f} | "
                 f"{score['hyp_len'] / score['ref_len']:.3f} | {sum(not h.strip() for h in hyps)} |")
    print(lines[-1], flush=True)

  alpha = cfg.decode.alpha
  beam_out = outputs.get((4, alpha)) or translator.translate(
      model, params, vocab, text.source, translator.SearchSettings(beam_size=4, alpha=alpha),
      cfg.data.max_len, compiled_cache=compiled).hypotheses
  keep = [i for i, h in enumerate(beam_out) if h.strip()]  # forced decoding needs a sentence
  pick = lambda seq: [seq[i] for i in keep]
  forced = {name: translator.score(model, params, vocab, pick(text.source), pick(targets),
                                   tokens_per_batch=cfg.decode.tokens_per_batch,
                                   max_len=cfg.data.max_len)
            for name, targets in (("reference", text.target), ("output", beam_out))}
  pairs = list(zip(forced["reference"], forced["output"]))
  short = [(r, o) for r, o in pairs if o["tokens"] < 0.9 * r["tokens"]]
  search_errors = lambda group: sum(objective(r["log_prob"], r["tokens"], alpha)
                                    > objective(o["log_prob"], o["tokens"], alpha) for r, o in group)
  mean = lambda xs: sum(xs) / len(xs)
  lines += ["", f"Forced decoding of the references and of the beam-4 outputs (α {alpha}), "
            f"{len(pairs)} non-empty outputs:", "",
            "| | sentences | reference scores higher (search error) | output scores higher "
            "(model error) |", "|---|---|---|---|"]
  for name, group in (("all", pairs), ("outputs < 0.9 × reference tokens", short)):
    errors = search_errors(group)
    lines.append(f"| {name} | {len(group)} | {errors} | {len(group) - errors} |")
  lines += ["", f"Mean tokens: references {mean([r['tokens'] for r, _ in pairs]):.2f}, outputs "
            f"{mean([o['tokens'] for _, o in pairs]):.2f}; mean log-probability per token: "
            f"references {mean([r['log_prob'] / r['tokens'] for r, _ in pairs]):.3f}, outputs "
            f"{mean([o['log_prob'] / o['tokens'] for _, o in pairs]):.3f}; mean log P(EOS) where "
            f"the reference ends: {mean([r['token_log_probs'][-1] for r, _ in pairs]):.3f}."]
  report = "\n".join(lines) + "\n"
  print(report)
  if FLAGS.output:
    Path(FLAGS.output).parent.mkdir(parents=True, exist_ok=True)
    Path(FLAGS.output).write_text(report)


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  flags.DEFINE_string("workdir", None, "Training workdir.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_list("alphas", ["0", "0.6", "1.0", "1.5"], "Length penalties to try with beam 4.")
  flags.DEFINE_string("output", None, "Also write the tables to this markdown file.")
  run_program("experiments.analyses.short_outputs", main)


if __name__ == "__main__":
  run()
