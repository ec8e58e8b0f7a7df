"""Our beam search and greedy search beside CTranslate2's, same model, same weights.

    python experiments/analyses/versus_ctranslate2.py --workload=trained --workdir=RUN \
        --repeats=5 --output=trained.json
    python experiments/analyses/versus_ctranslate2.py --config=configs/multi30k.py \
        --config.model.num_layers=3 --workload=synthetic --repeats=4 --output=synthetic.json

`--workload=trained --workdir=RUN`: what a deployment does. A trained run's checkpoint (its moving
average), exported with transformer-export, translates the run's validation sentences text to text
(tokenizing included), each engine batching its own way and stopping at EOS, with no length penalty
(where the two searches find the same hypotheses: tests/test_export.py; `--alpha` sets one, each
engine its own formula); rates are sentences/s, and the share of identical translations is printed.

The fixed-length workloads do equal work with the model of `--config` (untrained, seeded, exported
with transformer-export's converter): every sentence is decoded to a fixed length (ours: EOS
forbidden before it and forced there; CTranslate2: min_decoding_length = max_decoding_length = n, no
EOS), so both do the same number of decoder steps whatever the untrained weights prefer:
- `--workload=synthetic`: 1,000 sources of 8-24 random tokens, each decoded to its own length
  (transformer-benchmark's synthetic workload at --seq_len=16);
- `--workload=validation`: the config's validation sentences (Multi30k: 1,014, test2016's size),
  each decoded to its reference's length.
CTranslate2 takes one length per call, so its sentences go in one call per output length, batched by
`--ct2_batch_tokens` (its best on this machine: 8,192); ours go through translator.search_ids as
transformer-eval runs them. Both favour one engine: the synthetic one hands CTranslate2 batches of
one source length and one output length (no padding, no sentence finishing early), the validation
one costs it dozens of small calls.

Both engines use every core their own best way: ours splits the CPU into one JAX device per core
(`--cpu_devices`, as transformer-eval does), each decoding its share of the sentences; CTranslate2
runs `--ct2_layouts` (inter_threads x intra_threads: 1x2 = one worker of two threads, 2x1 = a worker
per core, each taking whole batches; the fixed-length workloads submit all their calls at once so
that every worker has some). Engines alternate `--repeats` times; compile and
load times are left out. Ours runs with float32 and
with bf16 weight matrices or a bf16 projection onto the vocabulary only (decode.matmul_dtype;
`--matmul_dtypes`), CTranslate2 with float32 and int8
weights (`--compute_types`). Prints a markdown table (each engine's rates and its ratio to ours in
the first matmul dtype) and writes the figures as JSON.

`--huggingface` (trained workload; `pip install -e '.[huggingface]'`): Hugging Face Transformers too,
the run exported with `transformer-export --format=huggingface` and translated as its docs show
(MarianTokenizer, then MarianMTModel.generate on batches of `--hf_batch_sentences` sentences of
similar length, torch on every core, `--alpha` as its length penalty, the same absolute length
limit as CTranslate2's); it also scores the validation references in both (the largest difference of a
token's log-probability is recorded).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformer import partitioning  # noqa: E402
from transformer.accelerators.decode_benchmark import decode_workload, synthetic_workload  # noqa: E402
from transformer.data import sources  # noqa: E402
from transformer.decoding import translator
from transformer.evaluation import export
from transformer.hardware import cpu_id  # noqa: E402
from transformer.model.transformer import ModelConfig, Transformer, initial_params  # noqa: E402
from transformer.training.workdir import load_run  # noqa: E402
from transformer.version import commit  # noqa: E402

FLAGS = flags.FLAGS


def ours(model, params, src, lengths, beam, max_len, matmul_dtype):
  settings = translator.SearchSettings.from_config(FLAGS.config, beam_size=beam,
                                                   matmul_dtype=matmul_dtype,
                                                   tokens_per_batch=FLAGS.tokens_per_batch)
  cache = {}
  translator.search_ids(model, params, src, settings, max_len, cache, lengths)  # compiles
  t = time.perf_counter()
  translator.search_ids(model, params, src, settings, max_len, cache, lengths)
  return time.perf_counter() - t


def engine_name(matmul_dtype: str) -> str:
  if matmul_dtype == "bfloat16_vocab":
    return "ours bfloat16 vocabulary projection"
  return "ours" if matmul_dtype == "float32" else f"ours {matmul_dtype} matrices"


def load_engine(directory: str, compute_type: str, layout: str):
  """A CTranslate2 engine with the threads of `layout` (INTERxINTRA), loaded for one measurement."""
  import ctranslate2
  inter, intra = map(int, layout.split("x"))
  return ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                intra_threads=intra, inter_threads=inter)


def ct2_engines() -> list[tuple[str, str, str]]:
  """(name, compute type, layout) of every CTranslate2 configuration to time."""
  return [(f"ctranslate2 {ct}" + (f" {layout}" if len(FLAGS.ct2_layouts) > 1 else ""), ct, layout)
          for layout in FLAGS.ct2_layouts for ct in FLAGS.compute_types]


def theirs(directory, compute_type, layout, pieces, lengths, beam):
  """One engine loaded for this measurement alone (threads of an idle engine still spin)."""
  engine = load_engine(directory, compute_type, layout)
  groups = collections.defaultdict(list)
  for source, n in zip(pieces, lengths):
    groups[n].append(source)
  options = dict(beam_size=beam, max_batch_size=FLAGS.ct2_batch_tokens, batch_type="tokens")
  engine.translate_batch(pieces[:8], min_decoding_length=4, max_decoding_length=4, **options)
  t = time.perf_counter()
  # Every call submitted at once, so that each of several workers (inter_threads) takes calls.
  pending = [(n, engine.translate_batch(batch, min_decoding_length=n, max_decoding_length=n,
                                        asynchronous=True, **options)) for n, batch in groups.items()]
  done = [(n, [r.result() for r in results]) for n, results in pending]
  seconds = time.perf_counter() - t
  assert all(len(out[0].hypotheses[0]) == n for n, out in done), "not decoded to the length asked"
  del engine
  return seconds


def fixed_length_seconds(directory: str) -> tuple[dict, dict]:
  """The synthetic or validation workload: every sentence to a fixed length, untrained weights."""
  cfg = FLAGS.config
  config = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
  model = Transformer(config)
  params = initial_params(model, jax.random.key(0))
  if FLAGS.workload == "synthetic":
    src, lengths, origin = synthetic_workload(1000, 16, config.vocab_size)
  else:
    src, lengths, origin = decode_workload(cfg, config.vocab_size, -1, 16)
  pieces = [[f"w{t}" for t in s[:-1]] for s in src]  # no EOS: CTranslate2 appends it
  vocabulary = ["<pad>", "</s>", "<s>", "<unk>"] + [f"w{i}" for i in range(4, config.vocab_size)]
  Path(directory).mkdir()
  export.ctranslate2_spec(config, params, vocabulary, max(lengths) + 1).save(directory)
  seconds = collections.defaultdict(list)
  for _ in range(FLAGS.repeats):
    for beam in map(int, FLAGS.beams):
      for dtype in FLAGS.matmul_dtypes:
        seconds[(engine_name(dtype), beam)].append(
            ours(model, params, src, lengths, beam, cfg.data.max_len, dtype))
      for name, ct, layout in ct2_engines():
        time.sleep(1)  # the last engine's idle threads stop spinning
        seconds[(name, beam)].append(theirs(directory, ct, layout, pieces, lengths, beam))
  work = {"workload": origin, "sentences": len(src), "target_tokens": sum(lengths),
          "layers": config.num_layers, "d_model": config.d_model}
  return seconds, work


def ours_text(run, sentences: list[str], beam: int, dtype: str, cache: dict
              ) -> tuple[float, list[str]]:
  """Seconds to translate `sentences` (compiled beforehand) and the translations."""
  settings = translator.SearchSettings.from_config(run.config, beam_size=beam, alpha=FLAGS.alpha,
                                                   matmul_dtype=dtype,
                                                   tokens_per_batch=FLAGS.tokens_per_batch)
  args = (run.model, run.params(True), run.vocab, sentences, settings, run.config.data.max_len,
          cache)
  if not cache:
    translator.translate(*args)  # compiles
  t = time.perf_counter()
  hypotheses = translator.translate(*args).hypotheses
  return time.perf_counter() - t, hypotheses


def theirs_text(directory: str, compute_type: str, layout: str, vocab, sentences: list[str],
                beam: int, longest: int) -> tuple[float, list[str]]:
  """The same for CTranslate2, tokenizing and detokenizing inside the timing as ours does."""
  engine = load_engine(directory, compute_type, layout)
  options = dict(beam_size=beam, length_penalty=FLAGS.alpha, max_decoding_length=longest,
                 max_batch_size=FLAGS.ct2_batch_tokens, batch_type="tokens")
  engine.translate_batch([vocab.encode(sentences[0], out_type=str)], **options)
  t = time.perf_counter()
  out = engine.translate_batch([vocab.encode(s, out_type=str) for s in sentences], **options)
  hypotheses = [vocab.decode_pieces(r.hypotheses[0]) for r in out]
  seconds = time.perf_counter() - t
  del engine
  return seconds, hypotheses


def load_marian(directory: str):
  """Transformers' tokenizer and model of an exported run, torch on every core."""
  import torch
  from transformers import MarianMTModel, MarianTokenizer
  torch.set_num_threads(os.cpu_count())
  return MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory).eval()


def huggingface_text(directory: str, sentences: list[str], beam: int, longest: int
                     ) -> tuple[float, list[str]]:
  """Transformers' translations, text to text, in batches of sentences of similar length."""
  import torch
  tokenizer, model = load_marian(directory)
  options = dict(num_beams=beam, max_length=longest + 1, do_sample=False)
  if beam > 1:  # its penalty length^alpha, and our rule to decide a sentence (docs/evaluating.md)
    options.update(length_penalty=FLAGS.alpha, early_stopping="never")

  def translate(texts: list[str]) -> list[str]:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = [""] * len(texts)
    for start in range(0, len(order), FLAGS.hf_batch_sentences):
      chunk = order[start:start + FLAGS.hf_batch_sentences]
      batch = tokenizer([texts[i] for i in chunk], return_tensors="pt", padding=True,
                        truncation=True)
      with torch.inference_mode():
        ids = model.generate(**batch, **options)
      for i, text in zip(chunk, tokenizer.batch_decode(ids, skip_special_tokens=True)):
        out[i] = text
    return out

  translate(sentences[:FLAGS.hf_batch_sentences])  # warm-up
  t = time.perf_counter()
  hypotheses = translate(sentences)
  return time.perf_counter() - t, hypotheses


def score_difference(run, directory: str, sentences: list[str], references: list[str]) -> dict:
  """The largest and mean |difference| between Transformers' and our log-probabilities of the
  reference tokens (ours: translator.score, as transformer-translate --score gives them), over the
  pairs within the model's length limit."""
  import torch
  limit = run.config.data.max_len
  fits = [(s, r) for s, r in zip(sentences, references)
          if max(len(run.vocab.encode(s)), len(run.vocab.encode(r))) < limit]
  sentences, references = [s for s, _ in fits], [r for _, r in fits]
  ours = translator.score(run.model, run.params(True), run.vocab, sentences, references,
                          run.config.decode.tokens_per_batch, run.config.data.max_len)
  tokenizer, model = load_marian(directory)
  differences = []
  for start in range(0, len(sentences), 64):
    batch = tokenizer(sentences[start:start + 64], text_target=references[start:start + 64],
                      return_tensors="pt", padding=True)
    with torch.inference_mode():
      log_probs = torch.log_softmax(model(**batch).logits, -1)
    for row, scored in enumerate(ours[start:start + 64]):
      n = scored["tokens"]
      theirs = log_probs[row, torch.arange(n), batch["labels"][row, :n]].numpy()
      differences.extend(np.abs(theirs - np.asarray(scored["token_log_probs"])).tolist())
  return {"sentences": len(sentences), "tokens": len(differences), "max_abs_diff": float(np.max(differences)),
          "mean_abs_diff": float(np.mean(differences))}


def trained_seconds(directory: str) -> tuple[dict, dict]:
  """A trained run's validation sentences, text to text, each engine stopping at EOS."""
  run = load_run(FLAGS.workdir)
  export.export_ctranslate2(FLAGS.workdir, directory)
  marian_dir = directory + "_huggingface"
  if FLAGS.huggingface:
    export.export_huggingface(FLAGS.workdir, marian_dir)
  split = sources.load_split(run.config.data, run.config.data.eval_split)
  sentences = list(split.source)
  longest = run.config.data.max_len + run.config.decode.max_extra_len
  seconds, texts, caches = collections.defaultdict(list), {}, collections.defaultdict(dict)
  for _ in range(FLAGS.repeats):
    for beam in map(int, FLAGS.beams):
      for dtype in FLAGS.matmul_dtypes:
        took, texts[engine_name(dtype), beam] = ours_text(run, sentences, beam, dtype,
                                                          caches[beam, dtype])
        seconds[engine_name(dtype), beam].append(took)
      for name, ct, layout in ct2_engines():
        time.sleep(1)  # the last engine's idle threads stop spinning
        took, texts[name, beam] = theirs_text(directory, ct, layout, run.vocab, sentences, beam,
                                              longest)
        seconds[name, beam].append(took)
      if FLAGS.huggingface:
        took, texts["transformers float32", beam] = huggingface_text(marian_dir, sentences, beam,
                                                                      longest)
        seconds["transformers float32", beam].append(took)
  reference = lambda beam: texts[engine_name(FLAGS.matmul_dtypes[0]), beam]
  same = {f"{engine}, beam {beam}": float(np.mean([a == b for a, b in zip(hyps, reference(beam))]))
          for (engine, beam), hyps in texts.items()}
  print("translations identical to ours (" + FLAGS.matmul_dtypes[0] + "): "
        + ", ".join(f"{k}: {v:.1%}" for k, v in same.items()))
  work = {"workload": f"{split.name} sentences of {FLAGS.workdir}, text to text, EOS, alpha {FLAGS.alpha:g}",
          "sentences": len(sentences), "identical_to_ours": same,
          "layers": run.model.config.num_layers, "d_model": run.model.config.d_model}
  if FLAGS.huggingface:
    import torch
    import transformers
    work["transformers"], work["torch"] = transformers.__version__, torch.__version__
    work["torch_threads"] = torch.get_num_threads()
    work["huggingface_scores"] = score_difference(run, marian_dir, sentences, list(split.target))
    print(f"Transformers' log-probabilities of the references beside ours: "
          f"{work['huggingface_scores']}")
  return seconds, work


def main(argv):
  import ctranslate2
  partitioning.use_cpu_devices(FLAGS.cpu_devices)
  if FLAGS.workload == "trained" and not FLAGS.workdir:
    raise app.UsageError("--workload=trained needs --workdir=RUN (a training run's folder)")
  if FLAGS.huggingface and FLAGS.workload != "trained":
    raise app.UsageError("--huggingface times a trained run: add --workload=trained --workdir=RUN")
  for layout in FLAGS.ct2_layouts:
    if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", layout):
      raise app.UsageError(f"--ct2_layouts takes INTERxINTRA thread counts such as 1x2 or 2x1, "
                           f"got {layout!r}")
  directory = tempfile.mkdtemp()
  try:
    measure = trained_seconds if FLAGS.workload == "trained" else fixed_length_seconds
    seconds, work = measure(str(Path(directory) / "model"))
  finally:
    shutil.rmtree(directory)
  unit, key, amount = (("sentences/s", "sentences_per_sec", work["sentences"])
                       if FLAGS.workload == "trained" else
                       ("target tokens/s", "target_tokens_per_sec", work["target_tokens"]))
  rows = []
  for beam in map(int, FLAGS.beams):
    base = amount / np.median(seconds[(engine_name(FLAGS.matmul_dtypes[0]), beam)])
    for (engine, b), runs in seconds.items():
      if b == beam:
        rate = [amount / s for s in runs]
        rows.append({"engine": engine, "beam": beam, key: rate,
                     "ratio_to_ours": float(np.median(rate) / base)})
  result = {**work, "ctranslate2": ctranslate2.__version__, "jax": jax.__version__,
            "ct2_layouts": FLAGS.ct2_layouts,
            "ct2_batch_tokens": FLAGS.ct2_batch_tokens, "jax_devices": jax.device_count(),
            "cpu_count": os.cpu_count(), "cpu": cpu_id(), "commit": commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
  print(f"| engine | search | {unit} (runs) | ratio to ours |\n|---|---|---|---|")
  for r in rows:
    runs = " / ".join(f"{x:,.0f}" for x in r[key])
    search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
    print(f"| {r['engine']} | {search} | {runs} | {r['ratio_to_ours']:.2f} |")
  if FLAGS.output:
    Path(FLAGS.output).write_text(json.dumps(result, indent=2) + "\n")


def run() -> None:
  """The flags are defined here, not on import, so the module's functions import anywhere."""
  config_flags.DEFINE_config_file("config", "configs/multi30k.py", "The model and data to use.")
  flags.DEFINE_enum("workload", "synthetic", ["synthetic", "validation", "trained"],
                    "What to decode.")
  flags.DEFINE_string("workdir", None, "--workload=trained: the training run to translate with.")
  flags.DEFINE_integer("repeats", 2, "Runs of each engine, alternating.")
  flags.DEFINE_list("ct2_layouts", ["1x2"], "CTranslate2's threads as INTERxINTRA: inter_threads "
                    "workers (batches translated at once) of intra_threads threads each; 2x1 = a "
                    "worker per core. Several are timed side by side.")
  flags.DEFINE_integer("cpu_devices", 0, "Ours: JAX devices the CPU is split into, each decoding "
                       "its own share of the sentences (transformer-eval's --cpu_devices; 0 = one per "
                       "core).")
  flags.DEFINE_integer("ct2_batch_tokens", 8192, "CTranslate2's max_batch_size in tokens.")
  flags.DEFINE_integer("tokens_per_batch", None, "Ours: source tokens per batch (default: the "
                       "config's decode.tokens_per_batch).")
  flags.DEFINE_list("compute_types", ["float32", "int8"], "CTranslate2 compute types to time.")
  flags.DEFINE_list("beams", ["4", "1"], "Beam sizes (1 = greedy).")
  flags.DEFINE_list("matmul_dtypes", ["float32", "bfloat16"], "Our decode.matmul_dtype values to "
                    "time; ratios are to the first.")
  flags.DEFINE_float("alpha", 0.0, "--workload=trained: the length-penalty exponent of every "
                     "engine's beam search (ours: GNMT's ((5 + n) / 6)^alpha, CTranslate2's and "
                     "Transformers' n^alpha; 0 = none, where all find the same hypotheses).")
  flags.DEFINE_bool("huggingface", False, "--workload=trained: time Hugging Face Transformers' "
                    "MarianMTModel too, on the run exported with --format=huggingface.")
  flags.DEFINE_integer("hf_batch_sentences", 32, "Transformers: sentences per generate() call.")
  flags.DEFINE_string("output", None, "Write the figures as JSON here too.")
  app.run(main)


if __name__ == "__main__":
  run()
