"""Minimum Bayes risk over sampled translations, against MBR over the beam's n-best list.

    transformer-translate --workdir=RUN --input_file=SRC --output_file=OUT/beam8 --beam_size=8 --nbest=8
    # every source line written N times in a row (SRC_N), then one sample each:
    transformer-translate --workdir=RUN --input_file=SRC_N --output_file=OUT/samples \
        --search=sample --temperature=0.5 --seed=1
    python -m experiments.analyses.mbr_samples --nbest=OUT/beam8.nbest.jsonl \
        --samples=OUT/samples --per_source=N --references=REF

Sampling-based MBR (Eikema & Aziz 2020; Freitag et al. 2023) treats the samples as an unbiased
picture of the model's distribution: each candidate's expected utility is its mean sentence chrF
against the samples. Prints sacreBLEU and the brevity penalty of the beam's best hypothesis, of the
shipped MBR over the beam (transformer/decoding/mbr.py: chrF, weights at temperature 0.75), and of three
sampled variants: candidates = samples, references = samples; candidates = beam + samples,
references = samples; and the same candidates against both, half weight each. The utility and the
weights are transformer/decoding/mbr.py's, so only the candidates and pseudo-references differ.
"""

from __future__ import annotations

import json

import numpy as np
from absl import flags

from transformer.cli import run_program
from transformer.data import sources, text_files
from transformer.decoding import mbr
from transformer.evaluation import bleu

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defined when run as a program only: tests import `choices` beside other programs' flags."""
  flags.DEFINE_string("nbest", None, "transformer-translate's n-best JSON lines (beam search).")
  flags.DEFINE_string("samples", None, "Sampled translations, `per_source` consecutive lines a source.")
  flags.DEFINE_integer("per_source", 16, "Samples per source line.")
  flags.DEFINE_string("references", None, "Reference translations, one per line (.gz or plain).")
  flags.DEFINE_float("temperature", 0.75, "MBR weights of the beam's hypotheses (mbr.weights).")
  flags.mark_flags_as_required(["nbest", "samples", "references"])


def choices(hypotheses: list[dict], samples: list[str], temperature: float) -> dict[str, str]:
  """One sentence's translation under each selection rule."""
  beam = [h["text"] for h in hypotheses]
  scores = [h["score"] for h in hypotheses]
  candidates = list(dict.fromkeys(beam + samples))  # every text once: the beam's, then the samples'
  at = {text: i for i, text in enumerate(candidates)}
  utility = mbr.chrf_matrix(candidates)  # [i, j]: candidate i scored against reference j
  rows = lambda texts: [at[t] for t in texts]
  against_samples = utility[:, rows(samples)].mean(1)
  against_beam = utility[:, rows(beam)] @ mbr.weights(scores, temperature)
  unique_samples = list(dict.fromkeys(samples))
  shipped = mbr.expected_utilities(beam, scores, "chrf", temperature)
  return {
      "beam, best score": beam[0],
      "MBR over the beam (shipped)": beam[int(np.argmax(shipped))],
      "MBR: samples against samples": unique_samples[int(np.argmax(against_samples[rows(unique_samples)]))],
      "MBR: beam + samples against samples": candidates[int(np.argmax(against_samples))],
      "MBR: beam + samples against both": candidates[int(np.argmax(
          0.5 * against_samples + 0.5 * against_beam))],
  }


def main(_) -> None:
  references = text_files.read_lines(FLAGS.references)
  nbest = [json.loads(line)["hypotheses"] for line in text_files.read_lines(FLAGS.nbest)]
  samples = text_files.read_lines(FLAGS.samples)
  n = FLAGS.per_source
  if not len(nbest) == len(references) == len(samples) // n or len(samples) % n:
    raise sources.DataError(f"{len(nbest)} n-best lists, {len(samples)} samples ({n} a source) and "
                            f"{len(references)} references do not line up: pass files of one source file")
  picked: dict[str, list[str]] = {}
  for i, hypotheses in enumerate(nbest):
    for rule, text in choices(hypotheses, samples[i * n:(i + 1) * n], FLAGS.temperature).items():
      picked.setdefault(rule, []).append(text)
  for rule, lines in picked.items():
    score = bleu.sacrebleu_score(lines, references)
    print(f"| {rule} | {score['bleu']:.2f} | {score['brevity_penalty']:.3f} |")


if __name__ == "__main__":
  define_flags()
  run_program("experiments.analyses.mbr_samples", main, compilation_cache=False)
