"""Tables of measured speed: CPU and GPU steps, searches, start-up, the loop, peers side by side."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from experiments.tables import RESULTS, table

DATA_SHEET_BF16_TFLOPS = {"NVIDIA H200": 989.0, "NVIDIA H100": 989.0}  # dense, no sparsity


@table("positional-speed")
def positional_speed() -> str:
  """Every positional encoding's train step and searches beside the sinusoids' on the default
  config, as ratios within each round (side by side), and base's step compiled for 8 H100s
  (`bash experiments/recipes/positional_speed.sh`)."""
  folder = RESULTS / "positional_speed"
  machine = json.loads((folder / "machine.json").read_text())
  rounds = range(1, machine["rounds"] + 1)
  bench = {kind: [json.loads((folder / "benchmark" / f"{kind}-round{r}.json").read_text())
                  for r in rounds] for kind in machine["kinds"]}
  compiled = {kind: json.loads((folder / "compile" / f"{kind}.json").read_text())["programs"]["train"]
              for kind in machine["kinds"]}
  base, base_compiled = bench["sinusoidal"], compiled["sinusoidal"]

  def ratio(kind: str, key: str) -> str:
    """Mean of the per-round ratios (time / the sinusoids' time in the same round), their range."""
    values = [mine[key] / theirs[key] for mine, theirs in zip(bench[kind], base)]
    spread = f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""
    return f"{statistics.mean(values):.2f}×{spread}"

  lines = [f"{machine['cpu']}, {machine['cores']} cores, JAX {machine['jax']}, commit "
           f"{machine['commit']}, {machine['date']}, {machine['rounds']} rounds (record: "
           f"`experiments/results/positional_speed`):", "",
           "| kind | parameters (default config) | train step, default config (sinusoidal: "
           f"{1e3 * statistics.mean(r['step_sec_median'] for r in base):.0f} ms) | greedy search "
           "(1,014 sentences) | beam 4 | base, 8×H100 (compiled): FLOPs / step | HBM bytes / step "
           "| step bound |", "|---|---|---|---|---|---|---|---|"]
  for kind in machine["kinds"]:
    mine = compiled[kind]
    step_bound = mine["bound"]["step_s"] / base_compiled["bound"]["step_s"]
    lines.append(
        f"| {kind} | {bench[kind][0]['parameters'] / 1e6:.3f}M | {ratio(kind, 'step_sec_median')} | "
        f"{ratio(kind, 'decode_beam1_sec')} | {ratio(kind, 'decode_beam4_sec')} | "
        f"{mine['matmul_flops'] / base_compiled['matmul_flops']:.3f}× | "
        f"{mine['hbm_bytes'] / base_compiled['hbm_bytes']:.3f}× | {step_bound:.3f}× |")
  return "\n".join(lines)


def _gpu_step_records() -> list[tuple[Path, dict]]:
  folder = max((RESULTS / "gpu").glob("h200-*-train-step"))
  return [(folder / f"{size}.json", json.loads((folder / f"{size}.json").read_text()))
          for size in ("base", "big")]


@table("gpu-train-step")
def gpu_train_step() -> str:
  """The train step alone on one GPU, bf16, the paper's 25k target tokens per step."""
  lines = ["| model | GPU | target tokens / step | step (median, p10–p90) | target tokens/s | "
           "MFU (of the data sheet's dense bf16) | peak memory | record |",
           "|---|---|---|---|---|---|---|---|"]
  for path, r in _gpu_step_records():
    sheet = DATA_SHEET_BF16_TFLOPS[r["device"]]
    lines.append(
        f"| {path.stem} | {r['device']} | {r['target_tokens_per_step']:,} in rows of "
        f"{r['seq_len']} | {1e3 * r['step_sec_median']:.1f} ms ({1e3 * r['step_sec_p10']:.1f}–"
        f"{1e3 * r['step_sec_p90']:.1f}) | {r['target_tokens_per_sec'] / 1e3:,.0f}k | "
        f"{r['analytic_tflops_per_sec'] / sheet:.0%} | {r['peak_memory_bytes'] / 2**30:.1f} GiB | "
        f"`{path.parent.relative_to(RESULTS)}` |")
  return "\n".join(lines)


@table("gpu-whole-program")
def gpu_whole_program() -> str:
  """The default run on one GPU, where its wall time went per process (gpu_whole_program.sh: half
  the steps, then resumed to the end), and the train step alone with XLA's autotuning on and off."""
  from transformer.metrics import read_metrics
  lines = ["| record | process | steps | start-up (data, model) | training loop | of it: compiling | "
           "the steps | checkpoints, validation | target tokens/s of the steps |",
           "|---|---|---|---|---|---|---|---|---|"]
  probes = ["| record | XLA autotuning | compile (one shape) | step (median, p10–p90) | target tokens/s |",
            "|---|---|---|---|---|"]
  for folder in sorted((RESULTS / "gpu").glob("*-whole-program")):
    name = f"`{folder.relative_to(RESULTS)}`"
    for s in read_metrics(folder, "summary"):
      lines.append(f"| {name} | {'resumed' if s['resumed_from'] else 'first'} | {s['resumed_from']}–"
                   f"{s['steps']} | {s['startup_sec']:.0f} s | {s['train_time_sec']:.0f} s | "
                   f"{s['compile_sec']:.0f} s | {s['steps_sec']:.0f} s | "
                   f"{s['checkpoint_sec'] + s['validation_sec']:.0f} s | "
                   f"{s['tokens_per_sec'] * s['train_time_sec'] / s['steps_sec'] / 1e3:,.0f}k |")
    for level in ("default", "0"):
      path = folder / f"autotune_{level}.json"
      if path.is_file():
        r = json.loads(path.read_text())
        probes.append(f"| {name} | {'on (default)' if level == 'default' else 'off (level 0)'} | "
                      f"{r['compile_sec']:.0f} s | {1e3 * r['step_sec_median']:.1f} ms "
                      f"({1e3 * r['step_sec_p10']:.1f}–{1e3 * r['step_sec_p90']:.1f}) | "
                      f"{r['target_tokens_per_sec'] / 1e3:,.0f}k |")
  return "\n".join(lines + [""] + probes)


@table("wmt-hours")
def wmt_hours() -> str:
  """Hours to the paper's steps: measured on one H200 (the step alone), the rest arithmetic."""
  from configs import wmt14_ende
  from transformer.model.size import training_flops_per_target_token
  from transformer.model.transformer import ModelConfig
  tokens = {}
  for size in ("base", "big"):
    cfg = wmt14_ende.get_config(size)
    per_token = training_flops_per_target_token(
        ModelConfig.from_config(cfg.model, cfg.data.vocab_size), 28, 28)
    tokens[size] = (cfg.train.steps * cfg.data.tokens_per_batch, per_token)
  lines = ["| hardware | dense bf16 peak | base (100k steps) | big (300k steps) | how |",
           "|---|---|---|---|---|"]
  for name, peak in (("8 × A100", 8 * 312), ("TPU v3-8 (4 chips)", 4 * 123), ("1 × H100 SXM", 989)):
    hours = [n * f / (peak * 1e12 * 0.40) / 3600 for n, f in tokens.values()]
    lines.append(f"| {name} | {peak:,} TFLOP/s | {hours[0]:.1f} h | {hours[1]:.1f} h | "
                 "arithmetic at 40% MFU |")
  measured = {path.stem: r for path, r in _gpu_step_records()}
  hours = [tokens[s][0] / measured[s]["target_tokens_per_sec"] / 3600 for s in ("base", "big")]
  lines.append(f"| 1 × H200 | 989 TFLOP/s | **{hours[0]:.1f} h** | **{hours[1]:.1f} h** | the "
               "measured step alone (table above), no input or evaluation |")
  lines.append("| the paper: 8 × P100 | | 12 h | 3.5 days | the paper |")
  return "\n".join(lines)


def _cpu_record() -> tuple[Path, dict]:
  folder = max((f for f in (RESULTS / "cpu").iterdir() if (f / "multi30k.json").is_file()),
               key=lambda f: json.loads((f / "machine.json").read_text())["date"])
  return folder, json.loads((folder / "machine.json").read_text())


def _cpu_benchmarks() -> list[tuple[str, dict]]:
  folder, _ = _cpu_record()
  return [(name, json.loads((folder / f"{name}.json").read_text()))
          for name in ("multi30k", "wmt14_ende_base")]


@table("cpu-train-step")
def cpu_train_step() -> str:
  """The train step and the searches on a CPU (`bash experiments/recipes/cpu_benchmark.sh`)."""
  folder, machine = _cpu_record()
  lines = [f"{machine['cpu']}, {machine['cores']} cores, JAX {machine['jax']}, float32, commit "
           f"{machine['commit']}, {machine['date']} (record: `experiments/results/"
           f"{folder.relative_to(RESULTS)}`):", "",
           "| config | target tokens / step | step (median, p10–p90) | target tokens/s | MFU (of a "
           "measured float32 matmul) | greedy / beam 4 sentences/s |", "|---|---|---|---|---|---|"]
  labels = {"multi30k": "`multi30k.py` (the default, 5.7M parameters)",
            "wmt14_ende_base": "`wmt14_ende.py:base` in float32 (63M parameters)"}
  for name, r in _cpu_benchmarks():
    lines.append(
        f"| {labels[name]} | {r['target_tokens_per_step']:,} | {r['step_sec_median']:.3f} s "
        f"({r['step_sec_p10']:.3f}–{r['step_sec_p90']:.3f}) | {r['target_tokens_per_sec']:,.0f} | "
        f"{r['mfu']:.0%} | {r['decode_beam1_sentences_per_sec']:.1f} / "
        f"{r['decode_beam4_sentences_per_sec']:.1f} |")
  return "\n".join(lines)


@table("checkpoint-stalls")
def checkpoint_stalls() -> str:
  """What an asynchronous checkpoint save costs training (the same CPU record)."""
  folder, _ = _cpu_record()
  lines = ["| model (parameters + 2 Adam moments, float32) | checkpoint | training paused (median, "
           "max) | whole write | a step during the write | record |", "|---|---|---|---|---|---|"]
  for name, r in _cpu_benchmarks():
    lines.append(
        f"| `{name}` | {r['checkpoint_bytes'] / 1e6:,.0f} MB | {r['checkpoint_blocking_sec_median']:.3f} s, "
        f"{r['checkpoint_blocking_sec_max']:.3f} s | {r['checkpoint_write_sec_median']:.2f} s | "
        f"{r['step_sec_during_checkpoint_write_median']:.2f} s (alone {r['step_sec_median']:.2f} s) | "
        f"`cpu/{folder.name}` |")
  return "\n".join(lines)


@table("smoke-run")
def smoke_run() -> str:
  """The README's smoke command, timed on a fresh machine's caches."""
  folder, machine = _cpu_record()
  r = json.loads((folder / "smoke.json").read_text())
  return (f"A smoke run: 150 steps and one validation, {r['wall_sec'] / 60:.1f} minutes on a "
          f"{machine['cores']}-core {machine['cpu']} from empty caches (vocabulary, token cache and "
          f"compilation included; record `cpu/{folder.name}`); its BLEU is near zero by design.\n\n"
          f"```bash\n{r['command']}\n```")


@table("versus-ctranslate2")
def versus_ctranslate2() -> str:
  """Our searches beside CTranslate2's on the trained default model, the same 2-core CPU."""
  path = RESULTS / "versus_ctranslate2" / "trained_zen5.json"
  r = json.loads(path.read_text())
  lines = ["| engine | beam | sentences/s (median of runs) | × ours float32 | translations identical to "
           "ours float32 |", "|---|---|---|---|---|"]
  for row in r["rows"]:
    name = f"{row['engine']}, beam {row['beam']}"
    lines.append(f"| {row['engine']} | {row['beam']} | {statistics.median(row['sentences_per_sec']):.0f} "
                 f"| {row['ratio_to_ours']:.2f} | {r['identical_to_ours'].get(name, 1.0):.1%} |")
  return "\n".join(lines)


@table("versus-huggingface")
def versus_huggingface() -> str:
  """Transformers' Marian beside ours and CTranslate2 on the exported default model, one CPU."""
  path = RESULTS / "versus_huggingface" / "trained_xeon_model207.json"
  r = json.loads(path.read_text())
  scores = r["huggingface_scores"]
  lines = [f"{r['cpu_count']}-core {r['cpu']}, JAX {r['jax']} on {r['jax_devices']} devices, "
           f"CTranslate2 {r['ctranslate2']} (a worker per core), Transformers {r['transformers']} "
           f"on torch {r['torch']} ({r['torch_threads']} threads), commit {r['commit']}, "
           f"{r['date']} (record: `experiments/results/{path.relative_to(RESULTS)}`). "
           f"Transformers' log-probabilities of the references' {scores['tokens']:,} tokens differ "
           f"from ours by at most {scores['max_abs_diff']:.1e} (mean {scores['mean_abs_diff']:.1e}).",
           "",
           "| engine | beam | sentences/s (runs) | × ours | translations identical to ours |",
           "|---|---|---|---|---|"]
  for row in r["rows"]:
    name = f"{row['engine']}, beam {row['beam']}"
    runs = " / ".join(f"{x:.0f}" for x in row["sentences_per_sec"])
    lines.append(f"| {row['engine']} | {row['beam']} | {runs} | {row['ratio_to_ours']:.2f} "
                 f"| {r['identical_to_ours'].get(name, 1.0):.1%} |")
  return "\n".join(lines) + "\n"


def _shape_records() -> list[Path]:
  return sorted(p for p in RESULTS.glob("*/*/shapes_*.json"))


@table("step-shapes")
def step_shapes() -> str:
  """The train step on the row lengths WMT's batches have, weighted by the stand-in's length mix."""
  lines = ["| record | machine | model, tokens / step | `loss_chunks` | per row length: target tokens/s "
           "(MFU) | the stand-in's mix: real target tokens/s, MFU, positions real |",
           "|---|---|---|---|---|---|"]
  for path in _shape_records():
    r = json.loads(path.read_text())
    machine = json.loads((path.parent / "machine.json").read_text())
    per = "; ".join(f"{s['seq_len']}: {s['target_tokens_per_sec']:,.0f}"
                    + (f" ({s['mfu']:.0%})" if s["mfu"] else "") for s in r["shapes"])
    mix = r.get("mix")
    mixed = (f"{mix['real_target_tokens_per_sec']:,.0f}, "
             f"{mix['mfu']:.0%}, {mix['target_positions_real']:.1%}" if mix and mix["mfu"] else
             f"{mix['real_target_tokens_per_sec']:,.0f}" if mix else "–")
    device = machine["cpu"] if r["backend"] == "cpu" else r["device"]
    lines.append(f"| `{path.parent.relative_to(RESULTS)}` | {device} | {r['dtype']}, "
                 f"{r['target_tokens_per_step']:,} | {path.stem.rsplit('chunks', 1)[-1]} | {per} | "
                 f"{mixed} |")
  return "\n".join(lines)


@table("input-pipeline")
def input_pipeline() -> str:
  """docs/data.md: preparing the WMT-sized stand-in and loading it (bash
  experiments/recipes/input_pipeline.sh)."""
  return _input_pipeline_table(RESULTS / "input_pipeline")


def _input_json(record: Path, name: str) -> dict | None:
  path = record / f"{name}.json"
  return json.loads(path.read_text()) if path.is_file() else None


def _rate(x: float) -> str:
  return f"{x / 1e6:.2f}M"


def _input_pipeline_table(record: Path) -> str:
  """The input side's figures from the record's JSON files."""
  record = Path(record)
  lines = []
  prep, standin = _input_json(record, "prepare_4.5m"), _input_json(record, "standin")
  if prep:
    train = prep["train"]
    total = prep["vocabulary"]["seconds"] + train["seconds"]
    lines += [
        "| preparing the stand-in corpus (4.5M pairs) | figure |", "|---|---|",
        f"| 37k BPE vocabulary on a 1M-pair sample | {prep['vocabulary']['seconds']:.0f} s |",
        f"| token cache, {train['pairs_read']:,} pairs, {train['workers']} worker processes "
        f"| {train['seconds']:.0f} s |",
        f"| both | **{total / 60:.1f} min** |",
        f"| peak memory: the program / its largest worker | {prep['peak_rss_gib']['this_process']:.1f}"
        f" / {prep['peak_rss_gib']['largest_worker']:.2f} GiB |",
        f"| dropped: empty / over-long / length ratio > 9 | {train['dropped']['empty']:,} / "
        f"{train['dropped']['too_long']:,} / {train['dropped']['length_ratio']:,} |"]
    if standin:
      injected = standin["injected"]
      lines.append(f"| injected by the generator | {injected['empty']:,} / {injected['too_long']:,}"
                   f" / {injected['length_ratio']:,} |")
    lines.append("")
  rows = []
  for name, label in (("bucket_4.5m", "buckets, 4.5M"), ("pack_4.5m", "packed, 4.5M"),
                      ("bpe_dropout_4.5m", "buckets + BPE-dropout 0.1, 4.5M"),
                      ("bucket_40.8m", "buckets, 40.8M (synthetic ids)"),
                      ("pack_40.8m", "packed, 40.8M (synthetic ids)"),
                      ("bucket_4.5m_busy", "buckets, 4.5M, both cores kept busy"),
                      ("pack_4.5m_busy", "packed, 4.5M, both cores kept busy")):
    result = _input_json(record, name)
    if not result:
      continue
    if result.get("busy_processes"):
      label += f" (load {result['load_average_1min']:.1f})"
    runs = result.get("subword_dropout") or result["throughput"]
    rates = " / ".join(_rate(r["target_tokens_per_sec"]) for r in runs)
    workers = "/".join(str(r["workers"]) for r in runs)
    best = max(runs, key=lambda r: r["target_tokens_per_sec"])
    memory = best["rss_mib"]
    stubs = {}
    for stub in result.get("stub_training", []):
      stubs.setdefault(stub["step_ms"], []).append(f"{stub['steps_waiting_share']:.1%}")
    stubs = "; ".join(f"{ms:g} ms: {' / '.join(shares)}" for ms, shares in stubs.items())
    alone = None if result.get("subword_dropout") else result.get("without_grain")
    alone = f"{_rate(alone['target_tokens_per_sec'])} ({alone['ms_per_batch']:.1f} ms)" if alone else ""
    rows.append(
        f"| {label} | {rates} ({workers} workers) | {alone} | "
        f"{result['epoch_real_share']['target']:.1%} | "
        f"{best['real_target_tokens_per_batch']['mean']:,.0f} | {result['first_batch_sec']:.1f} / "
        f"{result['resume_sec']:.1f} s | {memory['anon']:,} + {memory['workers_anon']:,} / "
        f"{memory['file']:,} MiB | {stubs} |")
  if rows:
    lines += ["| loader (one process) | real target tokens/s | the batch function alone, no Grain "
              "| target positions real (epoch) | real target tokens a batch (of 25k) | first batch "
              "/ resume | memory: the process's private + its workers' / mapped files | steps waiting on "
              "data (stub step: 0 / 1 / 2 workers) |",
              "|---|---|---|---|---|---|---|---|", *rows]
  return "\n".join(lines)



@table("start-times")
def start_times() -> str:
  """docs/data.md: launch to first step of transformer-train on the stand-in, fresh and resumed
  (bash experiments/recipes/start_times.sh)."""
  record = RESULTS / "input_pipeline"
  lines = ["| corpus | start | inputs ready (vocabulary, caches, loader, validation batches) | "
           "state made or restored | first step done | peak memory: private / mapped files |",
           "|---|---|---|---|---|---|"]
  for size, corpus in (("4.5m", "4.5M pairs (En→De's size)"),
                       ("40.8m", "40.8M pairs (En→Fr's size)")):
    for start in ("fresh", "resumed"):
      r = _input_json(record, f"start_{size}_{start}")
      if r:
        lines.append(f"| {corpus} | {start} | {r['inputs_ready_sec']:.1f} s | "
                     f"{r['state_ready_sec']:.1f} s | {r['first_step_sec']:.1f} s | "
                     f"{r['peak_private_gib']:.1f} / {r['peak_mapped_files_gib']:.1f} GiB |")
  return "\n".join(lines)


@table("compile-ahead")
def compile_ahead() -> str:
  """docs/performance.md: the default run's start with the steps compiled ahead and when met
  (bash experiments/recipes/compile_ahead.sh)."""
  lines = ["| record | machine | steps compiled | runs | launch to first step | launch to step 60 "
           "(the run) | programs compiled before the loop / in it |", "|---|---|---|---|---|---|---|"]
  for folder in sorted((RESULTS / "compile_ahead").glob("*/")):
    machine = json.loads((folder / "machine.json").read_text())
    name = f"`compile_ahead/{folder.name}` | {machine['cores']}-core {machine['cpu']}"
    for ahead, how in (("True", "ahead, all at once"), ("False", "when met (jit)")):
      runs = [json.loads(f.read_text()) for f in sorted(folder.glob(f"ahead_{ahead}_*.json"))]
      if runs:
        first = [r["first_step_sec"] for r in runs]
        wall = [r["wall_sec"] for r in runs]
        lines.append(f"| {name} | {how} | {len(runs)} | {' / '.join(f'{x:.0f} s' for x in first)} "
                     f"| {' / '.join(f'{x:.0f} s' for x in wall)} | {runs[0]['shapes_compiled']} / "
                     f"{runs[0]['compiled_in_loop']} |")
  return "\n".join(lines)


@table("loop-speed")
def loop_speed() -> str:
  """docs/performance.md: the training loop beside its step alone, batches placed ahead and not
  (bash experiments/recipes/loop_speed.sh); one value a repeat, in the order run."""
  lines = ["| record | machine | model | batches placed | repeats | the loop (target tokens/s) | "
           "the step alone | loop / step |", "|---|---|---|---|---|---|---|---|"]
  for folder in sorted((RESULTS / "loop").glob("*/")):
    machine = json.loads((folder / "machine.json").read_text())
    name = f"`loop/{folder.name}` | {machine['cores']}-core {machine['cpu']}"
    for model, label in (("tiny", "1 layer, d_model 32, 64 tokens a step"),
                         ("default", "the default (2 + 2 layers, 256; 2,048 tokens)")):
      for depth, how in (("2", "2 ahead (thread)"), ("0", "when its step comes")):
        runs = [json.loads(f.read_text())
                for f in sorted(folder.glob(f"{model}_prefetch{depth}_*.json"))]
        if runs:
          cells = [" / ".join(format(r[key], form) for r in runs)
                   for key, form in (("loop_target_tokens_per_sec", ",.0f"),
                                     ("step_target_tokens_per_sec", ",.0f"),
                                     ("loop_over_step", ".2f"))]
          lines.append(f"| {name} | {label} | {how} | {len(runs)} | {' | '.join(cells)} |")
  return "\n".join(lines)


@table("quality-per-minute")
def quality_per_minute() -> str:
  text = (RESULTS / "default_multi30k" / "quality_per_minute.md").read_text()
  return "\n".join(line for line in text.splitlines() if line.startswith("|"))
