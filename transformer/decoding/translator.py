"""Sentences in, translations (or scores) out: the host side of every program that decodes.

transformer-eval, transformer-translate, transformer-attention-maps and the benchmark all go through
`translate` (beam search, n-best lists, greedy search, sampling; one model or an ensemble) and
`score` (forced decoding). Both tokenize, sort the sentences by length and cut them into batches of one
length bucket each, so little compute goes to padding and every bucket compiles once; pass the same
`compiled_cache` dict to later calls (other checkpoints of the same model) to reuse the compiled
functions. The searches themselves are in decoding/.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import sentencepiece as spm
from absl import flags
from jax.sharding import Mesh, PartitionSpec

from transformer import cli, decoding, partitioning, progress
from transformer.data import batching, marian_vocab
from transformer.data.batching import pad_rows
from transformer.data.pretokenize import AS_GIVEN, TextForm
from transformer.data.sources import normalise_controls
from transformer.decoding import mbr, options
from transformer.errors import ConfigError
from transformer.model import positions
from transformer.model.transformer import EOS_ID, PAD_ID, Transformer
from transformer.model.vocab_projection import SEARCH_MATRIX

DECODE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024)  # coarse: few shapes, padding is cheap here
QUEUE_BATCHES = 16  # sentences per call, in batches: the queue drains (wastes) once per call

OPTIONS = options.all_options(decoding.SEARCHES)  # every search's options and the common ones


class _SettingsMethods:
  """What SearchSettings does; its fields follow from OPTIONS (below)."""

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict, **overrides: Any) -> SearchSettings:
    """The config's decode settings with the flags that were given (None = not given), checked."""
    settings = cls(**{name: cfg.decode[name] for name, (option, _) in OPTIONS.items()
                      if option.in_config})
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    settings.check()
    return settings

  def check(self) -> None:
    """One-line errors that name the flag to fix: each option's own check, then how they combine."""
    if self.search not in decoding.SEARCHES:
      raise ConfigError(f"--search must be one of {', '.join(decoding.SEARCHES)}, got "
                        f"{self.search!r}")
    for name, (option, _) in OPTIONS.items():
      option.check(getattr(self, name))
    if self.nbest > self.beam_size:
      raise ConfigError(f"--nbest must be between 1 and --beam_size ({self.beam_size}), got "
                        f"{self.nbest}: a beam of K keeps K hypotheses")
    if self.search != "beam" and self.nbest > 1:
      raise ConfigError(f"--nbest works with beam search, not with --search={self.search}: draw "
                        "several samples with different --seed values instead")
    if self.mbr and (self.search != "beam" or self.beam_size < 2):
      given = (f"--search={self.search}" if self.search != "beam" else
               f"--beam_size={self.beam_size} (greedy search)")
      raise ConfigError(f"--mbr reranks a beam's hypotheses: use beam search with --beam_size >= 2 "
                        f"(e.g. 8), not {given}")

  @property
  def candidates(self) -> int:
    """Hypotheses the search keeps per sentence: the n-best list, or the whole beam for MBR."""
    return self.beam_size if self.mbr else self.nbest

  @property
  def search_class(self) -> type[decoding.Search]:
    """The registered search these settings run (beam search of one hypothesis is greedy)."""
    name = "greedy" if self.search == "beam" and self.beam_size == 1 else self.search
    return decoding.SEARCHES[name]

  def tag(self, default: SearchSettings) -> str:
    """What names this search in report files beside `default` (the run config's): '' for the
    same search, else e.g. '_greedy', '_beam8_alpha1', '_sample_seed3', '_extra20', '_bfloat16',
    '_beam8_mbrchrf' (each option's `tag` prefix and value); so another search never overwrites
    the default's report. (A minimum length has its own '_min<L>'.) Of another search, its own
    options and the string-valued common ones are named."""
    mine, theirs = self.describe(), default.describe()
    mine.pop("min_len", None)
    theirs.pop("min_len", None)
    same = mine["search"] == theirs["search"]
    parts = [] if same else [mine["search"]]
    if "mbr" in theirs and "mbr" not in mine:
      parts.append("nombr")
    for key, value in mine.items():
      if key == "search" or (same and value == theirs.get(key)):
        continue
      option, owner = OPTIONS[key]
      if same or owner == mine["search"] or isinstance(option.default, str):
        parts.append(option.tagged(value))
    return "".join(f"_{p}" for p in parts)

  def describe(self) -> dict[str, Any]:
    """The settings that matter for this search (for reports and metrics)."""
    described = self.search_class.from_settings(self).describe()
    if described["search"] == "greedy":  # reports of greedy search have always named the alpha
      described["alpha"] = self.alpha
    described["max_extra_len"] = self.max_extra_len
    if self.min_len:  # reports of the default search keep their keys
      described["min_len"] = self.min_len
    if self.matmul_dtype != "float32":
      described["matmul_dtype"] = self.matmul_dtype
    if self.mbr:  # the beam keeps beam_size hypotheses for it; nbest stays what is written out
      described.update(nbest=self.nbest, mbr=self.mbr, mbr_temperature=self.mbr_temperature)
    return described


# How to decode: which search (decoding.SEARCHES; beam search with beam_size 1 is greedy search)
# and a field per option of OPTIONS, with its default. Frozen and hashable: jit may close over it.
SearchSettings = dataclasses.make_dataclass(
    "SearchSettings", [("search", str, "beam")] + [(name, type(option.default), option.default)
                                                   for name, (option, _) in OPTIONS.items()],
    bases=(_SettingsMethods,), namespace={"__module__": __name__}, frozen=True)


def define_search_flags(deprecated_sample_flag: bool = False) -> None:
  """The decoding flags of the programs that translate: --search, one per option (OPTIONS; a flag
  not given is None and the run config's decode.* applies), --ensemble and --cpu_devices.
  `deprecated_sample_flag`: also the old --sample (transformer-translate had it before --search)."""
  flags.DEFINE_enum("search", None, list(decoding.SEARCHES), "The search (default: beam; beam "
                    "search with --beam_size=1 is greedy search).")
  options.define_flags(decoding.SEARCHES)
  flags.DEFINE_list("ensemble", [], "More workdirs decoded together with --workdir (same "
                    "vocabulary): their log-probabilities are averaged at every step.")
  flags.DEFINE_integer("cpu_devices", 0, "On a CPU: decode with this many JAX devices, each "
                       "translating its own share of the sentences (0 = one per core; 1 = one "
                       "device). XLA runs the decoder's small matrix products on one core per "
                       "device, so one device per core keeps every core busy. Ignored on GPUs/TPUs.")
  if deprecated_sample_flag:
    flags.DEFINE_bool("sample", False, "Deprecated: use --search=sample.")


def search_overrides() -> dict[str, Any]:
  """The search flags that were given, as SearchSettings fields (absent where not given)."""
  f = flags.FLAGS
  search = f["search"].value if "search" in f else None
  if "sample" in f and f.sample:
    cli.deprecated("--sample", "--search=sample")
    search = "sample"
  overrides = options.given(decoding.SEARCHES, search)
  return {"search": search, **overrides}


@dataclasses.dataclass
class Translations:
  hypotheses: list[str]  # the best translation of each sentence ('' for empty sources)
  nbest: list[list[dict[str, Any]]]  # per sentence, best first: text, score, log_prob, tokens
  stats: dict[str, Any]  # sentences, truncated_sources, compile_sec, decode_sec, rates


def search_fn(models: Sequence[Transformer], settings: SearchSettings, decode_len: int,
              slots: int, forced_lengths: bool = False, mesh: Mesh | None = None) -> Callable:
  """(params, src, limits, index) -> decoding.Result [N, n, ...] for a queue of N sentences
  decoded `slots` at a time (`forced_lengths`: EOS forbidden before the limit, else before
  `settings.min_len` tokens where the limit leaves room).

  On a `mesh` of several devices each device decodes its own rows of the queue (`device_queues`)
  in a loop of its own, `slots` at a time: a sentence needs nothing from another, so the devices
  never wait for one another (no collective inside the loop) and each stops when its rows are done.
  """
  def fn(params, src, limits, index):
    min_len = (limits - 1 if forced_lengths else
               jnp.minimum(limits - 1, settings.min_len) if settings.min_len else None)
    search = settings.search_class.from_settings(settings, index)
    return decoding.decode(search, models, params, src, limits, decode_len, min_len, slots)
  if mesh is None or mesh.size == 1:
    return fn
  rows = PartitionSpec(partitioning.BATCH_AXES)
  return jax.shard_map(fn, mesh=mesh, in_specs=(PartitionSpec(), rows, rows, rows), out_specs=rows,
                       check_vma=False)


def device_queues(members: Sequence[int], devices: int, per_device: int) -> np.ndarray:
  """The sentence (from `members`, longest first) each row of a queue of `devices` * `per_device`
  rows holds, -1 for padding: device k's block of rows takes members k, k + devices, ..., so every
  device gets as many sentences of each length, and its padding comes last (loop.run needs it)."""
  rows = np.full((devices, per_device), -1, np.int64)
  for k in range(devices):
    share = members[k::devices]
    rows[k, :len(share)] = share
  return rows.reshape(-1)


def _source_ids(vocab: spm.SentencePieceProcessor, sentences: Sequence[str], max_source_len: int,
                text_form: TextForm = AS_GIVEN) -> tuple[list[list[int]], int]:
  """Token ids with EOS ([] for an empty line) and how many were truncated to max_source_len."""
  sentences = text_form.source(normalise_controls(sentences)[0])  # as training's cache encoded them
  encoded = [vocab.encode(s) if s.strip() else [] for s in sentences]
  truncated = sum(len(e) > max_source_len - 1 for e in encoded)
  return [e[:max_source_len - 1] + [EOS_ID] if e else [] for e in encoded], truncated


def _bucket(length: int, limit: int) -> int:
  """The padded length of a batch (never past `limit`, the limit of learned position tables)."""
  return min(next((b for b in DECODE_BUCKETS if b >= length), length), limit)


def _batches(lengths: Sequence[int], tokens_per_batch: int, limit: int, multiple: int,
             queue_batches: int = 1) -> list[tuple[int, int, list[int]]]:
  """(padded length, rows, member indices) for the non-empty items, shortest first.

  A batch holds about `tokens_per_batch` tokens; with `queue_batches` > 1 a queue of up to that
  many batches' worth of sentences goes to one call, decoded `rows` at a time (decoding/loop.py's slots).
  """
  order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: lengths[i])
  groups: dict[int, list[int]] = {}
  for i in order:
    groups.setdefault(_bucket(lengths[i], limit), []).append(i)
  batches = []
  for length, members in groups.items():
    rows = batching.rows_per_batch(tokens_per_batch, length, multiple)
    size = rows * queue_batches
    # Longest first within a queue: the sentences left when the queue runs dry are short ones, so
    # the slots idle for fewer steps at the end (the order of results is unaffected).
    batches += [(length, rows, members[s:s + size][::-1]) for s in range(0, len(members), size)]
  return batches


def _shape(count: int, rows: int) -> tuple[int, int]:
  """(slots, queue length) for `count` sentences of a bucket whose batches hold `rows`: never more
  slots than sentences (a power of two), and the queue padded to whole batches only."""
  slots = min(rows, 1 << (count - 1).bit_length())
  return slots, -(-count // slots) * slots


def decode_length(models: Sequence[Transformer], length: int, settings: SearchSettings) -> int:
  """Output positions the search of a length-`length` bucket runs to: input + max_extra_len, but no
  further than a learned position table reaches."""
  tables = [positions.get(m.config.positional).longest(m.config) for m in models]
  return min([length + settings.max_extra_len, *(n for n in tables if n is not None)])


def with_matmul_dtype(models: Sequence[Transformer], params: Any, dtype: str
                      ) -> tuple[tuple[Transformer, ...], Any]:
  """Quantised decoding: the models' weight matrices (dense kernels, token and output embeddings)
  stored in `dtype`, cast once here, and their products taking `dtype` operands (model.matmul);
  activations, sums, biases, LayerNorm and learned positions stay float32. 'bfloat16_vocab' rounds
  the operands of the projection onto the vocabulary only (the largest product of a small model's
  step) and keeps the stored matrix float32, so the token embeddings are looked up exactly; XLA
  casts the matrix once, outside the search's loop."""
  if dtype in ("float32", "bfloat16_vocab"):  # whatever the products were trained with
    vocab = jnp.dtype(jnp.bfloat16) if dtype == "bfloat16_vocab" else None
    return tuple(m.clone(config=dataclasses.replace(m.config, matmul_dtype=None,
                                                    vocab_matmul_dtype=vocab))
                 for m in models), params
  dtype = jnp.dtype(dtype)
  models = tuple(m.clone(config=dataclasses.replace(m.config, matmul_dtype=dtype)) for m in models)

  def cast(path: tuple, x: jax.Array) -> jax.Array:
    names = [str(getattr(k, "key", k)) for k in path]
    matrix = names[-1] in ("kernel", "output_embedding") or (
        names[-1] == "embedding" and names[-2].endswith("embed"))
    return x.astype(dtype) if matrix else x
  return models, jax.tree_util.tree_map_with_path(cast, params)


def search_params(models: Sequence[Transformer], params: Sequence[Any], mesh: Mesh
                  ) -> tuple[Any, ...]:
  """The members' params as a search on this backend reads them: on CPUs each decoder also gets its
  projection onto the vocabulary stored transposed, [D, V] (projection.search_logits: XLA's CPU
  product runs faster with the vocabulary the matrix's minor dimension at a step's few rows). The
  copy is made on the host and placed on every device of `mesh` once, so no program runs for it
  (profiles count the search's executions) and no call copies it again. Other backends get the
  params as they are."""
  if jax.default_backend() != "cpu":
    return tuple(params)
  def add(model: Transformer, p: Any) -> Any:
    matrix = (p["embed"]["embedding"] if model.config.share_embeddings
              else p["decoder"]["output_embedding"])
    transposed = jax.device_put(np.ascontiguousarray(np.asarray(matrix).T),
                                partitioning.replicated(mesh))
    return {**p, "decoder": {**p["decoder"], SEARCH_MATRIX: transposed}}
  return tuple(add(m, p) for m, p in zip(models, params))


def search_ids(models: Transformer | Sequence[Transformer], params: Any,
               ids: Sequence[Sequence[int]], settings: SearchSettings, max_source_len: int,
               compiled_cache: dict | None = None,
               output_lengths: Sequence[int] | None = None
               ) -> tuple[list[list[tuple[list[int], float, float]]], dict[str, Any]]:
  """The search on token ids (EOS-terminated; [] = nothing to translate): per sentence, its
  hypotheses best first as (tokens with EOS, score, log-probability), and timing figures.

  `output_lengths` makes every hypothesis exactly that long (EOS forbidden before, forced there):
  the benchmark's way to do realistic work with untrained parameters.
  """
  models, params = decoding.as_ensemble(models, params)
  models, params = with_matmul_dtype(models, params, settings.matmul_dtype)
  mesh = partitioning.data_mesh()
  params = search_params(models, params, mesh)
  compiled_cache = {} if compiled_cache is None else compiled_cache
  results: list[list[tuple[list[int], float, float]]] = [[] for _ in ids]
  compile_time, decode_time, generated = 0.0, 0.0, 0
  batches = _batches([len(i) for i in ids], settings.tokens_per_batch, max_source_len, mesh.size,
                     QUEUE_BATCHES)
  with progress.Progress("translating", sum(len(b[2]) for b in batches), "sentences",
                         line_seconds=10.0) as bar:
    for length, rows, chunk in batches:
      # Each device decodes its share of the queue, its share of a batch's rows at a time.
      slots, per_device = _shape(-(-len(chunk) // mesh.size), rows // mesh.size)
      sentence = device_queues(chunk, mesh.size, per_device)
      queue = len(sentence)
      decode_len = decode_length(models, length, settings)
      src = pad_rows([np.array(ids[i] if i >= 0 else [], np.int32) for i in sentence], length, queue)
      src_len = (src != PAD_ID).sum(1)
      limits = np.where(src_len > 0, np.minimum(src_len + settings.max_extra_len, decode_len), 0)
      if output_lengths is not None:
        real = sentence >= 0
        limits[real] = np.minimum(np.asarray(output_lengths)[sentence[real]], decode_len)
      index = np.maximum(sentence, 0).astype(np.int32)
      batch = partitioning.shard_batch({"src": src, "limits": limits.astype(np.int32),
                                        "index": index}, mesh)
      args = (params, batch["src"], batch["limits"], batch["index"])
      key = (length, queue, slots, decode_len, settings, output_lengths is not None)
      if key not in compiled_cache:
        t = time.time()
        fn = jax.jit(search_fn(models, settings, decode_len, slots, output_lengths is not None,
                                mesh))
        compiled_cache[key] = fn.lower(*args).compile()
        compile_time += time.time() - t
      t = time.time()
      result = jax.device_get(compiled_cache[key](*args))
      tokens, scores, log_probs = result.tokens, result.scores, result.log_probs
      decode_time += time.time() - t
      for row, i in enumerate(sentence):
        if i < 0:
          continue
        for out, score, log_prob in zip(tokens[row].tolist(), scores[row], log_probs[row]):
          out = out[:out.index(EOS_ID) + 1] if EOS_ID in out else out
          results[i].append((out, float(score), float(log_prob)))
        generated += len(results[i][0][0])
      bar.update(len(chunk), tokens=sum(len(results[i][0][0]) for i in chunk))
  stats = {"sentences": len(ids), "compile_sec": compile_time, "decode_sec": decode_time,
           "sentences_per_sec": len(ids) / decode_time if decode_time else float("nan"),
           "target_tokens": generated,
           "target_tokens_per_sec": generated / decode_time if decode_time else float("nan"),
           "models": len(models), "tokens_per_batch": settings.tokens_per_batch,
           "devices": mesh.size}
  return results, stats


def translate(models: Transformer | Sequence[Transformer], params: Any,
              vocab: spm.SentencePieceProcessor, sentences: Sequence[str],
              settings: SearchSettings, max_source_len: int,
              compiled_cache: dict | None = None, text_form: TextForm = AS_GIVEN) -> Translations:
  """Translates `sentences` (order kept) with one model or an ensemble (a sequence of models and
  one of their parameters, sharing `vocab`).

  Sources longer than `max_source_len` tokens are truncated (and counted). Empty sources give empty
  translations. beam_size 1 is greedy search; `settings.search` 'sample' samples (one key per
  sentence, from `settings.seed` and the sentence's index, so a sentence's sample does not depend
  on the batch it lands in). `text_form`: the run's (pretokenize.text_form(config.data)): sources
  are put in the form the run was trained on, translations taken out of it.
  """
  ids, truncated = _source_ids(vocab, sentences, max_source_len, text_form)
  results, stats = search_ids(models, params, ids, settings, max_source_len, compiled_cache)
  text = lambda tokens: text_form.output(vocab.decode(tokens))
  nbest = [[{"text": text(tokens[:-1] if tokens[-1:] == [EOS_ID] else tokens),
             "score": score, "log_prob": log_prob, "tokens": len(tokens)}
            for tokens, score, log_prob in hypotheses] for hypotheses in results]
  chosen = [0] * len(nbest)
  if settings.mbr:
    t = time.time()
    chosen = mbr.rerank(nbest, settings.mbr, settings.mbr_temperature)
    stats["mbr_sec"] = time.time() - t
  hypotheses = [n[c]["text"] if n else "" for n, c in zip(nbest, chosen)]
  nbest = [n[:settings.nbest] for n in nbest]
  return Translations(hypotheses, nbest, {**stats, "truncated_sources": truncated})


@functools.cache
def _scoring_fn(models: tuple[Transformer, ...]) -> Callable:
  return jax.jit(functools.partial(decoding.forced_log_probs, models))


def score(models: Transformer | Sequence[Transformer], params: Any,
          vocab: spm.SentencePieceProcessor, sources: Sequence[str], targets: Sequence[str],
          tokens_per_batch: int, max_len: int, text_form: TextForm = AS_GIVEN
          ) -> list[dict[str, Any]]:
  """Forced decoding: the log-probability of each target sentence given its source, and of each of
  its tokens (EOS included), as training computes them. Returns per pair: log_prob, tokens,
  token_log_probs, pieces. A side longer than `max_len` tokens or an empty target is an error (a
  truncated target would get the score of another sentence). `text_form`: as `translate`'s."""
  models, params = decoding.as_ensemble(models, params)
  if len(sources) != len(targets):
    raise ConfigError(f"{len(sources)} source lines but {len(targets)} target lines; give one "
                      "target per source")
  src_ids, tgt_ids = [], []
  sources = text_form.source(normalise_controls(sources)[0])
  targets = text_form.target(normalise_controls(targets)[0])
  for n, (s, t) in enumerate(zip(sources, targets), 1):
    src = marian_vocab.side(vocab, "source").encode(s) + [EOS_ID]
    tgt = marian_vocab.side(vocab, "target").encode(t) + [EOS_ID]
    if len(tgt) == 1:
      raise ConfigError(f"target line {n} is empty; every line needs a sentence to score")
    if max(len(src), len(tgt)) > max_len:
      raise ConfigError(f"line {n} is {max(len(src), len(tgt))} tokens long (with </s>); this "
                        f"model takes at most {max_len} (config.data.max_len)")
    src_ids.append(src)
    tgt_ids.append(tgt)
  mesh = partitioning.data_mesh()
  fn = _scoring_fn(models)
  lengths = [max(len(s), len(t)) for s, t in zip(src_ids, tgt_ids)]
  results: list[dict[str, Any]] = [{} for _ in sources]
  with progress.Progress("scoring", len(sources), "sentences", line_seconds=10.0) as bar:
    for length, rows, chunk in _batches(lengths, tokens_per_batch, max_len, mesh.size):
      batch = partitioning.shard_batch(
          {"src": pad_rows([np.array(src_ids[i], np.int32) for i in chunk], length, rows),
           "tgt": pad_rows([np.array(tgt_ids[i], np.int32) for i in chunk], length, rows)}, mesh)
      token_log_probs = np.asarray(jax.device_get(fn(params, batch["src"], batch["tgt"])))
      for row, i in enumerate(chunk):
        values = token_log_probs[row, :len(tgt_ids[i])].tolist()
        results[i] = {"log_prob": float(np.sum(values)), "tokens": len(values),
                      "token_log_probs": values,
                      "pieces": [vocab.id_to_piece(t) for t in tgt_ids[i][:-1]] + ["</s>"]}
      bar.update(len(chunk))
  return results
