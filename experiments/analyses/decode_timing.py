"""How fast this checkout translates a run's validation set, and a hash of what it wrote.

    PYTHONPATH=CHECKOUT python experiments/analyses/decode_timing.py --workdir=RUN [--beam_size=1]

For A/B tests of decoding code: run it once per checkout (PYTHONPATH picks the code), alternating,
on the same run; the rates compare speeds and equal hashes show that the change kept every
translation. The search is compiled by a first, untimed call, then timed `--repeats` times
(translator.translate, tokenizing included, as transformer-eval runs it); prints sentences/s per
repeat and the first 12 hex digits of the sha256 of the translations.
"""

from __future__ import annotations

import hashlib
import time

from absl import app, flags

from transformer import partitioning
from transformer.data import sources
from transformer.decoding import translator
from transformer.training import workdir as runs

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  partitioning.use_cpu_devices(FLAGS.cpu_devices)
  run = runs.load_run(FLAGS.workdir)
  settings = translator.SearchSettings.from_config(run.config, beam_size=FLAGS.beam_size)
  sentences = list(sources.load_split(run.config.data, run.config.data.eval_split).source)
  args = (run.model, run.params(True), run.vocab, sentences, settings, run.config.data.max_len, {})
  translator.translate(*args)  # compiles
  rates = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    hypotheses = translator.translate(*args).hypotheses
    rates.append(len(sentences) / (time.perf_counter() - start))
  digest = hashlib.sha256("\n".join(hypotheses).encode()).hexdigest()[:12]
  print(f"{' / '.join(f'{r:.0f}' for r in rates)} sentences/s; translations {digest}")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  flags.DEFINE_string("workdir", None, "The training run whose moving average translates.", required=True)
  flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's; 1 = greedy).")
  flags.DEFINE_integer("repeats", 3, "Timed translations of the validation set.")
  flags.DEFINE_integer("cpu_devices", 2, "JAX devices the CPU is split into (transformer-eval's flag).")
  app.run(main)


if __name__ == "__main__":
  run()
