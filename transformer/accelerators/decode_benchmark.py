"""Decoding speed as the evaluation program decodes, for transformer-benchmark: a workload of real
evaluation sentences (or seeded synthetic ones) each decoded to a fixed length, so every run does the
same work whatever the parameters; greedy and beam search timed on it, and optionally checked
against the plain search of decoding/textbook.py."""

from __future__ import annotations

import logging
import time
from typing import Any

import ml_collections
import numpy as np

from transformer.data import sources
from transformer.data import vocab as vocab_lib
from transformer.data.sources import DataError
from transformer.decoding import textbook as reference
from transformer.decoding import translator
from transformer.model.transformer import EOS_ID, Transformer

log = logging.getLogger("transformer")


def decode_workload(cfg: ml_collections.ConfigDict, vocab_size: int, sentences: int, seq_len: int
                    ) -> tuple[list[list[int]], list[int], str]:
  """Source ids and output lengths to decode, and where they come from: the config's evaluation
  sentences tokenized with its cached vocabulary, each decoded to its reference's length; or, where
  that data is not on this machine, synthetic sources of seq_len/2 .. 3*seq_len/2 tokens decoded to
  their own length (seeded, so every run does the same work)."""
  try:
    text = sources.load_split(cfg.data, cfg.data.eval_split)
    vocab = vocab_lib.load_vocab(vocab_lib.cached_vocab(
        cfg.data, sources.open_split(cfg.data, cfg.data.train_split), cfg.seed))
  except DataError as e:
    log.info("Decoding synthetic sentences: %s", e)
  else:
    count = len(text) if sentences < 0 else min(sentences, len(text))
    src = [vocab.encode(s)[:cfg.data.max_len - 1] + [EOS_ID] for s in text.source[:count]]
    lengths = [min(len(vocab.encode(t)) + 1, len(s) + cfg.decode.max_extra_len)
               for s, t in zip(src, text.target[:count])]
    return src, lengths, f"{text.name}, first {count} sentences, reference lengths"
  return synthetic_workload(1000 if sentences < 0 else sentences, seq_len, vocab_size)


def synthetic_workload(count: int, seq_len: int, vocab_size: int
                       ) -> tuple[list[list[int]], list[int], str]:
  """`count` seeded sources of seq_len/2 .. 3*seq_len/2 random tokens (EOS last), each to be
  decoded to its own length."""
  rng = np.random.default_rng(2)
  lengths = rng.integers(max(2, seq_len // 2), seq_len * 3 // 2 + 1, count).tolist()
  src = [rng.integers(4, vocab_size, n - 1).tolist() + [EOS_ID] for n in lengths]
  return src, lengths, f"synthetic: {count} sentences of {min(lengths)}-{max(lengths)} tokens"


def benchmark_decode(cfg: ml_collections.ConfigDict, model: Transformer, params: Any, seq_len: int,
                     sentences: int, beams: list[int], reference_sentences: int = 0
                     ) -> dict[str, Any]:
  """Decoding as the evaluation program runs it (translator.search_ids: length buckets, batches of
  decode.tokens_per_batch source tokens, decode.alpha), once per beam size in `beams` (1 = greedy).

  Every hypothesis is decoded to a realistic length (decode_workload) whatever the (untrained)
  parameters: EOS is forbidden before it and forced there, so every run does the same work.
  transformer-eval reports the speed of a trained model, which also stops early. With
  `reference_sentences`, that many of the beam search's results are checked against
  reference.beam_search (`against_reference`).
  """
  src, lengths, origin = decode_workload(cfg, model.config.vocab_size, sentences, seq_len)
  result: dict[str, Any] = {"decode_data": origin, "decode_sentences": len(src),
                            "decode_mean_source_len": float(np.mean([len(s) for s in src])),
                            "decode_mean_output_len": float(np.mean(lengths))}
  for beam in beams:
    log.info("Decoding %d sentences with %s (%s)", len(src),
             "greedy search" if beam == 1 else f"beam {beam}", origin)
    settings = translator.SearchSettings.from_config(cfg, beam_size=beam)
    found, stats = translator.search_ids(model, params, src, settings, cfg.data.max_len,
                                         output_lengths=lengths)
    result.update({f"decode_beam{beam}_sentences_per_sec": stats["sentences_per_sec"],
                   f"decode_beam{beam}_target_tokens_per_sec": stats["target_tokens_per_sec"],
                   f"decode_beam{beam}_sec": stats["decode_sec"],
                   f"decode_beam{beam}_compile_sec": stats["compile_sec"]})
    if reference_sentences and beam == max(beams):
      result.update(against_reference(model, params, src, lengths, found, settings,
                                      reference_sentences))
  return result


def against_reference(model: Transformer, params: Any, src: list[list[int]], lengths: list[int],
                      found: list, settings: translator.SearchSettings, count: int
                      ) -> dict[str, Any]:
  """The fast search's best hypotheses and scores beside reference.beam_search's (full forward
  passes, no cache) on the first `count` sentences of the workload, decoded to the same lengths."""
  same, worst, t = 0, 0.0, time.perf_counter()
  count = min(count, len(src))
  for i in range(count):
    expected = reference.beam_search(model, params, np.asarray(src[i]), lengths[i],
                                     settings.beam_size, settings.alpha, min_len=lengths[i] - 1)
    tokens, score, _ = found[i][0]
    same += tuple(tokens) == expected[0][0]
    worst = max(worst, abs(score - expected[0][1]))
  if same < count or worst > 1e-5:
    log.warning("The fast search differs from the reference: %d of %d hypotheses the same, "
                "largest score difference %.2e", same, count, worst)
  return {"reference_sentences": count, "reference_same_hypotheses": same,
          "reference_max_score_difference": worst,
          "reference_sec": time.perf_counter() - t}
