"""Compile a run's programs for a TPU slice or GPU cluster this machine does not have, and say whether
they fit, how they shard and how fast they could run.

    transformer-compile --config=configs/wmt14_ende.py:big --topology=v5p-32
    transformer-compile --config=configs/wmt14_ende.py:base --topology=8xH100 --mesh=8,1,1
    transformer-compile --config=configs/wmt14_ende.py:big --topology=v5e-8 --search_mesh
    transformer-compile --config=configs/wmt14_ende.py:big --topology=v5p-8 --max_batch

Builds the programs exactly as training and evaluation do (step.jit_train_fns: the config's token
budget, gradient accumulation, remat, scanned layers, mesh rules and donation; the validation loss
step; beam search at decode.tokens_per_batch as transformer-eval runs it) for the devices of
`--topology` (topologies.py), lowers them with abstract inputs and compiles them ahead of time:
nothing is allocated or run, so no accelerator is needed. Per device it reports the parameter,
optimizer and temporary bytes and the peak against the chip's HBM, FLOPs per step (counted in the
compiled program, hlo.py, beside the analytic count of model/size.py and XLA's own cost analysis), HBM
traffic, the collectives (kind, count, bytes) and a roofline bound on the step (roofline.py) with the
tokens/s, MFU and hours to `train.steps` it implies. A program that does not fit ends the command
with an error naming what would make it fit. `--output` writes everything as JSON.

The train step is compiled at one length bucket (`--seq_len` tokens a side; training compiles one
program per bucket, data.max_len the longest). On GPU topologies attention is XLA's: the cuDNN flash
kernel, which `model.attention=auto` picks on a real GPU, cannot be compiled without cuDNN.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiled for the topology, run nowhere: no device

import dataclasses
import functools
import json
import logging
import math
import time
from typing import Any

import jax

# The programs import JAX before this module (transformer/__init__.py), so the choice is made here too.
jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])

import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache
from ml_collections import config_flags

from transformer import decoding, partitioning
from transformer.accelerators import hlo, roofline, topologies
from transformer.accelerators.compile_report import (
  fit_advice,
  format_report,
  oom_advice,
  public,
  size,
)
from transformer.cli import run_program
from transformer.config import ConfigError, validate
from transformer.data import batching
from transformer.data.pipeline import BatchSpec
from transformer.decoding import translator
from transformer.errors import UserError
from transformer.files import writable_file
from transformer.model.size import training_flops_per_target_token
from transformer.model.transformer import ModelConfig, Transformer, initial_params
from transformer.training.step import PACKING_KEYS, dropout_key, jit_eval_step, jit_train_fns

FLAGS = flags.FLAGS
log = logging.getLogger("transformer")
GIB = topologies.GIB
PROGRAMS = ("train", "eval", "beam")


class DoesNotFit(UserError):
  """A program needs more memory per device than the chip has; the message says what would help."""


@dataclasses.dataclass
class Target:
  """What is compiled for: the topology, its devices and the mesh over them."""
  topology: topologies.Topology
  devices: list
  mesh: jax.sharding.Mesh
  chip: topologies.Chip  # per JAX device

  @property
  def devices_per_host(self) -> int:
    return topologies.devices_per_host(self.devices)


def _abstract(shape: tuple[int, ...], dtype: Any, sharding: jax.sharding.Sharding
              ) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _bytes_per_device(tree: Any) -> float:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
  return float(sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))


def _memory(compiled: jax.stages.Compiled) -> dict[str, float]:
  stats = compiled.memory_analysis()
  memory = {k: float(getattr(stats, f"{k}_size_in_bytes")) for k in
            ("argument", "output", "alias", "temp", "generated_code")}
  memory["peak"] = (memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
                    + memory["generated_code"])
  return memory


def _compiled_report(name: str, compiled: jax.stages.Compiled, seconds: float, target: Target
                     ) -> dict[str, Any]:
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, list) else cost
  stats = hlo.analyze(compiled.as_text(), len(target.devices), target.devices_per_host)
  return {"program": name, "compile_sec": seconds, "memory": _memory(compiled),
          "matmul_flops": stats.matmul_flops, "hbm_bytes": stats.hbm_bytes,
          "kernels": stats.kernels, "loops": stats.loops, "collectives": stats.collectives,
          "top_kernels": stats.top_kernels,
          "xla_cost_analysis": {"flops": cost.get("flops"), "bytes_accessed": cost.get("bytes accessed")},
          "_stats": stats}


def _timed_compile(lowered: jax.stages.Lowered, name: str, cfg: ml_collections.ConfigDict
                   ) -> tuple[jax.stages.Compiled, float]:
  """Compiles, bypassing JAX's persistent cache: an executable for devices this machine does not
  have can be neither stored nor loaded. The TPU compiler refuses a program far too big for the
  chip: that is DoesNotFit, with what would help."""
  cached = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()  # JAX decides whether to use the cache once, then remembers
  t = time.time()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    raise DoesNotFit(oom_advice(name, str(e), cfg)) from None
  finally:
    jax.config.update("jax_enable_compilation_cache", cached)
    compilation_cache.reset_cache()
  return compiled, time.time() - t


def train_rows(cfg: ml_collections.ConfigDict, devices: int, seq_len: int) -> int:
  """Rows of the training batch at `seq_len` tokens, as the input pipeline would make them."""
  return BatchSpec.for_training(cfg, devices).global_rows(seq_len)


def compile_train(cfg: ml_collections.ConfigDict, model: Transformer, target: Target, rows: int,
                  seq_len: int) -> tuple[dict[str, Any], Any]:
  """The train step (and the abstract state, for the eval step's parameters)."""
  mesh = target.mesh
  fns = jit_train_fns(cfg, model, mesh)
  batch = {k: _abstract((rows, seq_len), jnp.int32, partitioning.batch_sharding(mesh))
           for k in ("src", "tgt")}
  if cfg.data.batching == "pack":
    batch.update({k: _abstract((rows, seq_len), jnp.int32, partitioning.batch_sharding(mesh))
                  for k in PACKING_KEYS})
  replicated = partitioning.replicated(mesh)
  rng = partitioning.with_sharding(jax.eval_shape(lambda: dropout_key(cfg)), replicated)
  healthy = _abstract((), jnp.bool_, replicated)
  compiled, seconds = _timed_compile(fns.step.lower(fns.abstract_state, batch, rng, healthy),
                                     "train", cfg)
  report = _compiled_report("train", compiled, seconds, target)
  state = fns.abstract_state
  report["memory"]["params"] = _bytes_per_device(state.params)
  report["memory"]["optimizer"] = _bytes_per_device(state.opt_state)
  report["memory"]["ema"] = _bytes_per_device(getattr(state, "ema_params", None))
  return report, state


def compile_eval(cfg: ml_collections.ConfigDict, model: Transformer, target: Target, params: Any,
                 rows: int, seq_len: int) -> dict[str, Any]:
  """The validation loss step, on the training layout of the parameters."""
  mesh = target.mesh
  step = jit_eval_step(model, mesh, cfg.train.label_smoothing)
  batch = {k: _abstract((rows, seq_len), jnp.int32, partitioning.batch_sharding(mesh))
           for k in ("src", "tgt")}
  compiled, seconds = _timed_compile(step.lower(params, batch), "eval", cfg)
  return _compiled_report("eval", compiled, seconds, target)


def compile_beam(cfg: ml_collections.ConfigDict, model: Transformer, target: Target, params: Any,
                 length: int) -> dict[str, Any]:
  """Beam search as transformer-eval runs it: parameters replicated, one length bucket's queue,
  each device decoding its share in a loop of its own."""
  mesh = partitioning.data_mesh(target.devices)
  settings = translator.SearchSettings.from_config(cfg)
  slots = batching.rows_per_batch(settings.tokens_per_batch, length, mesh.size)
  queue = slots * translator.QUEUE_BATCHES
  models, replicated = decoding.as_ensemble(
      model, partitioning.with_sharding(params, partitioning.replicated(mesh)))
  decode_len = translator.decode_length(models, length, settings)
  fn = jax.jit(translator.search_fn(models, settings, decode_len, slots // mesh.size, mesh=mesh))
  rows = partitioning.batch_sharding(mesh)
  lowered = fn.lower(replicated, _abstract((queue, length), jnp.int32, rows),
                     _abstract((queue,), jnp.int32, rows), _abstract((queue,), jnp.int32, rows))
  compiled, seconds = _timed_compile(lowered, "beam", cfg)
  report = _compiled_report("beam", compiled, seconds, target)
  report["shape"] = {"sentences": queue, "slots": slots, "devices": mesh.size, "source_len": length,
                     "decode_len": decode_len, "beam_size": settings.beam_size}
  return report


def make_target(cfg: ml_collections.ConfigDict, topology: topologies.Topology, devices: list
                ) -> Target:
  mesh = partitioning.make_mesh(cfg, cfg.data.vocab_size, devices=devices)
  return Target(topology, devices, mesh, topologies.per_device(topology, len(devices)))


def check(cfg: ml_collections.ConfigDict, topology: topologies.Topology, devices: list,
          seq_len: int, programs: tuple[str, ...] = PROGRAMS) -> dict[str, Any]:
  """Compiles `programs` of the run `cfg` describes for `devices`; returns the report."""
  validate(cfg)
  if topology.platform == "cuda" and cfg.model.attention == "cudnn":
    raise ConfigError("config.model.attention='cudnn' cannot be compiled without cuDNN; use 'auto' "
                      "or 'xla' (the prediction then assumes XLA's attention)")
  target = make_target(cfg, topology, devices)
  model = Transformer(ModelConfig.from_config(cfg.model, cfg.data.vocab_size))
  rows = train_rows(cfg, len(devices), seq_len)
  report: dict[str, Any] = {
      "config": cfg.get("config_file", None), "topology": topology.name,
      "jax_topology": topology.jax_name, "devices": len(devices),
      "hosts": len(devices) // target.devices_per_host, "device_kind": devices[0].device_kind,
      "mesh": dict(target.mesh.shape), "chip": dataclasses.asdict(target.chip),
      "batch": {"rows": rows, "seq_len": seq_len, "target_tokens": rows * seq_len,
                "grad_accum_steps": cfg.train.grad_accum_steps},
      "model": {k: cfg.model[k] for k in ("num_layers", "decoder_layers", "d_model", "d_ff",
                                          "num_heads", "dtype", "remat", "scan_layers")},
      "attention": "xla" if topology.platform == "cuda" else "xla (TPU)", "programs": {},
  }
  log.info("Compiling for %s (%d devices, mesh %s): %d rows x %d tokens", topology.name,
           len(devices), report["mesh"], rows, seq_len)
  state = None
  if "train" in programs or "eval" in programs:
    train, state = compile_train(cfg, model, target, rows, seq_len)
    if "train" in programs:
      report["programs"]["train"] = train
      _add_bound(report, train, cfg, model.config, target, rows, seq_len)
  if "eval" in programs:
    report["programs"]["eval"] = compile_eval(cfg, model, target, state.params, rows,
                                               seq_len)
  if "beam" in programs:
    params = state.params if state is not None else jax.eval_shape(
        lambda: initial_params(model, jax.random.key(0)))
    report["programs"]["beam"] = compile_beam(cfg, model, target, params, min(seq_len, 64))
  hbm = target.chip.hbm_gib * GIB
  for program in report["programs"].values():
    program["fits"] = program["memory"]["peak"] <= hbm
    program["headroom_bytes"] = hbm - program["memory"]["peak"]
  return report


def _add_bound(report: dict[str, Any], train: dict[str, Any], cfg: ml_collections.ConfigDict,
               config: ModelConfig, target: Target, rows: int, seq_len: int) -> None:
  flops = training_flops_per_target_token(config, seq_len, seq_len) * rows * seq_len
  train["analytic_flops"] = flops / len(target.devices)
  state = train["memory"]["params"] + train["memory"]["optimizer"] + train["memory"]["ema"]
  train["bound"] = roofline.bound(train["_stats"], target.chip, train["analytic_flops"],
                                  rows * seq_len, cfg.train.steps, state).as_dict()


# ------------------------------------------------------------------------------ searches over runs

def mesh_candidates(cfg: ml_collections.ConfigDict, devices: int, per_host: int
                    ) -> list[tuple[int, int, int]]:
  """(data, fsdp, tensor) splits worth compiling: tensor parallelism within a host only (its
  collectives are per layer), fsdp over all or none of the rest or half of it, the divisibility
  rules of partitioning.check_divisible met."""
  found = []
  for tensor in (t for t in (1, 2, 4, 8) if t <= per_host and devices % t == 0):
    rest = devices // tensor
    for fsdp in sorted({1, rest, max(rest // 2, 1)}):
      shape = (rest // fsdp, fsdp, tensor)
      try:
        partitioning.check_divisible(cfg, shape, cfg.data.vocab_size)
      except ConfigError:
        continue
      found.append(shape)
  return found


def with_mesh_shape(cfg: ml_collections.ConfigDict, shape: tuple[int, int, int]
                    ) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict(cfg.to_dict())
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = shape
  return cfg


def search_mesh(cfg: ml_collections.ConfigDict, topology: topologies.Topology, devices: list,
                seq_len: int) -> list[dict[str, Any]]:
  """The train step compiled on every candidate mesh; fitting ones first, fastest bound first."""
  rows = []
  for shape in mesh_candidates(cfg, len(devices), topologies.devices_per_host(devices)):
    try:
      train = check(with_mesh_shape(cfg, shape), topology, devices, seq_len,
                    ("train",))["programs"]["train"]
      row = {"mesh": shape, "fits": train["fits"], "peak_bytes": train["memory"]["peak"],
             "bound": train["bound"], "collectives": train["collectives"]}
    except DoesNotFit as e:  # refused by the compiler
      row = {"mesh": shape, "fits": False, "peak_bytes": None, "bound": None, "refused": str(e)}
    log.info("mesh %s: %s", shape, "refused by the compiler" if row["bound"] is None else
             f"peak {size(row['peak_bytes'])}, step >= {1e3 * row['bound']['step_s']:.1f} ms "
             f"({row['bound']['binding']}){'' if row['fits'] else ', does not fit'}")
    rows.append(row)
  rows.sort(key=lambda r: (not r["fits"], r["bound"]["step_s"] if r["bound"] else float("inf")))
  return rows


def _fitting_peak(cfg: ml_collections.ConfigDict, tokens: int, topology: topologies.Topology,
                  devices: list, seq_len: int) -> float | None:
  """The train step's peak bytes per device at `tokens` per batch, None if it does not fit."""
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.data.tokens_per_batch = tokens
  try:
    train = check(c, topology, devices, seq_len, ("train",))["programs"]["train"]
  except DoesNotFit:
    return None
  return train["memory"]["peak"] if train["fits"] else None


def max_batch(cfg: ml_collections.ConfigDict, topology: topologies.Topology, devices: list,
              seq_len: int) -> dict[str, Any]:
  """The largest token budget whose train step fits: the peak at the config's budget (halved until
  it fits) and at half of that, the line through them solved for the chip's HBM, and that budget
  compiled to confirm (moved back towards the known fit until it does, four tries)."""
  hbm = topologies.per_device(topology, len(devices)).hbm_gib * GIB
  peak = functools.partial(_fitting_peak, cfg, topology=topology, devices=devices, seq_len=seq_len)
  t1 = cfg.data.tokens_per_batch
  p1 = peak(t1)
  while p1 is None:
    t1 //= 2
    if t1 < seq_len * len(devices):
      raise DoesNotFit(f"not even one row of {seq_len} tokens per device fits on {topology.name}")
    p1 = peak(t1)
  t0 = t1 // 2
  p0 = peak(t0) or 0.0
  slope = (p1 - p0) / (t1 - t0)
  best, best_peak = t1, p1
  guess = int(t1 + (hbm - p1) / slope) if slope > 0 else 2 * t1
  for _ in range(4):
    found = peak(guess)
    if found is not None:
      best, best_peak = guess, found
      break
    guess = int(best + 0.7 * (guess - best))
  return {"tokens_per_batch": best, "tokens_per_device": best / len(devices),
          "peak_bytes": best_peak, "hbm_bytes": hbm, "bytes_per_token": slope}


# ---------------------------------------------------------------------------------- command line

def with_mesh_flag(cfg: ml_collections.ConfigDict, value: str | None) -> ml_collections.ConfigDict:
  if not value:
    return cfg
  try:
    shape = tuple(int(v) for v in value.split(","))
    assert len(shape) == 3
  except (ValueError, AssertionError):
    raise UserError(f"--mesh={value}: give data,fsdp,tensor sizes, e.g. --mesh=2,4,1 "
                    "(-1 for one axis = the devices left)") from None
  return with_mesh_shape(cfg, shape)


def main(argv: list[str]) -> None:
  if FLAGS.config is None or FLAGS.topology is None:
    raise app.UsageError("pass --config=configs/wmt14_ende.py:big (or another config) and "
                         f"--topology=NAME, one of {', '.join(topologies.TOPOLOGIES)}")
  topology = topologies.lookup(FLAGS.topology)
  if FLAGS.output:  # before minutes of compiling
    writable_file(FLAGS.output, "--output")
  cfg = with_mesh_flag(FLAGS.config, FLAGS.mesh)
  validate(cfg)
  devices = topologies.devices(topology)
  seq_len = FLAGS.seq_len
  if seq_len < 1 or seq_len > cfg.data.max_len:
    raise UserError(f"--seq_len must be between 1 and config.data.max_len ({cfg.data.max_len})")
  result: dict[str, Any]
  if FLAGS.max_batch:
    result = max_batch(cfg, topology, devices, seq_len)
    print(f"largest batch that fits on {topology.name}: {result['tokens_per_batch']:,} target "
          f"tokens per step ({result['tokens_per_device']:,.0f} per device, peak "
          f"{size(result['peak_bytes'])} of {size(result['hbm_bytes'])})")
  else:
    if FLAGS.search_mesh:
      ranked = search_mesh(cfg, topology, devices, seq_len)
      print("| mesh (data, fsdp, tensor) | fits | peak per device | step bound | binding |")
      print("|---|---|---|---|---|")
      for r in ranked:
        b = r["bound"]
        print(f"| {r['mesh']} | {'yes' if r['fits'] else 'no'} | "
              + (f"{size(r['peak_bytes'])} | {1e3 * b['step_s']:.2f} ms | {b['binding']} |" if b
                 else "refused by the compiler | | |"))
      if not ranked[0]["fits"]:
        raise DoesNotFit(f"no mesh fits on {topology.name}; see the table above")
      cfg = with_mesh_shape(cfg, ranked[0]["mesh"])
    result = check(cfg, topology, devices, seq_len, tuple(FLAGS.programs))
    result["steps"] = cfg.train.steps
    result["config"] = config_flags.get_config_filename(FLAGS["config"])
    result["overrides"] = config_flags.get_override_values(FLAGS["config"])
    if FLAGS.search_mesh:
      result["mesh_search"] = ranked
    print(format_report(result))
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      json.dump(public(result), f, indent=1, default=float)
  if not FLAGS.max_batch and not all(p["fits"] for p in result["programs"].values()):
    raise DoesNotFit("does not fit on " + topology.name + ":\n" + fit_advice(result, cfg))


def run() -> None:
  """Console-script entry point."""
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file, e.g. "
                                  "configs/wmt14_ende.py:big.")
  flags.DEFINE_string("topology", None, "The slice or cluster to compile for: "
                      + ", ".join(topologies.TOPOLOGIES) + ".")
  flags.DEFINE_string("mesh", None, "data,fsdp,tensor devices (e.g. 1,8,1); default: config.mesh.")
  flags.DEFINE_integer("seq_len", 64, "Tokens per row (source and target) of the compiled train "
                       "and eval batches: one length bucket.")
  flags.DEFINE_multi_enum("programs", list(PROGRAMS), PROGRAMS, "Programs to compile.")
  flags.DEFINE_bool("search_mesh", False, "Compile the train step on every sensible (data, fsdp, "
                    "tensor) split and rank them by the predicted step time; report the best.")
  flags.DEFINE_bool("max_batch", False, "Find the largest token budget whose train step fits.")
  flags.DEFINE_string("output", None, "Also write the report as JSON to this file.")
  run_program("transformer-compile", main, compilation_cache=False)


if __name__ == "__main__":
  run()
