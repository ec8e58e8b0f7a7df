"""Tables of translation quality: the README's results, Table 3 row E and the positional study."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

from experiments.analyses.table3_lengths import SIGNIFICANT
from experiments.recipes.multi30k_levers import TEACHERS
from experiments.tables import REPO, RESULTS, markdown_rows, mean_sd, table

STUDY = RESULTS / "positional_full"  # the positional study: every kind, 3 seeds, the default run
HELD_OUT = {"test_2016_flickr": "test2016", "test_2017_flickr": "test2017", "test_2017_mscoco": "MSCOCO"}


def _study_runs(variant: str | None = None) -> list[dict[str, str]]:
  """The study's finished runs (results.csv rows), of one kind or all."""
  with open(STUDY / "results.csv") as f:
    return [r for r in csv.DictReader(f)
            if r["finished"] == "True" and variant in (None, r["variant"])]


def _floats(rows: list[dict[str, str]], key: str) -> list[float]:
  return [float(r[key]) for r in rows if r.get(key)]


def _cpu_name(machine: str) -> str:
  """'Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167), 1 cpu device(s), JAX 0.10.2'
  -> 'Intel Xeon (family 6 model 167)': a results.csv machine, short enough for a table cell."""
  cpu = machine.split("), ")[0] + ")" if "), " in machine else machine
  name, _, ids = cpu.partition(" (")
  name = name.replace("(R)", "").replace(" Processor", "").strip()
  ids = " ".join(word for word in ids.rstrip(")").split() if not word.startswith(("Genuine", "Authentic")))
  return f"{name} ({ids})" if ids else name


# ------------------------------------------------------------------------------------- README

# Runs of the README's default command, by the machine their record's README names.
DEFAULT_RUNS = {"2-core AMD EPYC VM (Zen 5)": "table3_multi30k_full/amd_base",
                "2-core AMD EPYC VM (Zen 3, AVX2 only)": "table3_multi30k_full/zen3_base"}


def _run_summary(workdir: Path) -> tuple[float, float, int]:
  """(training minutes, validation sacreBLEU of the moving average, last step) of a recorded run."""
  from transformer.metrics import read_metrics, training_clock
  records = read_metrics(workdir)
  train = [r for r in records if r["event"] == "train"]
  bleu = [r for r in records if r["event"] == "bleu" and r.get("ema") and r["step"] == train[-1]["step"]]
  return training_clock(train)[-1] / 60, bleu[-1]["bleu"], train[-1]["step"]


@table("default-run")
def default_run() -> str:
  """The README's first command, per machine: training time and validation sacreBLEU."""
  lines = ["| machine | seeds | training time | validation sacreBLEU (moving average) | record |",
           "|---|---|---|---|---|"]
  for machine, folder in DEFAULT_RUNS.items():
    runs = [_run_summary(w) for w in sorted((RESULTS / folder).glob("seed*"))]
    minutes = " / ".join(f"{m:.0f} min" for m, _, _ in runs)
    lines.append(f"| {machine} | {len(runs)} | {minutes} | {mean_sd([b for _, b, _ in runs])} | "
                 f"`{folder}` |")
  study = _study_runs("sinusoidal")  # the same command, each seed on a 2-core machine of its own
  if study:
    machines = " / ".join(_cpu_name(r["machine"]) for r in study)
    minutes = " / ".join(f"{float(r['train_sec']) / 60:.0f} min" for r in study)
    bleu = mean_sd(_floats(study, "dev_ema_bleu"))
    lines.append(f"| 2-core VMs: {machines} (the positional study's sinusoidal runs, beside "
                 f"other work) | {len(study)} | {minutes} | {bleu} | `positional_full` |")
  gpu_runs = [f for f in sorted((RESULTS / "gpu").glob("*-whole-program")) if (f / "metrics.jsonl").is_file()]
  for folder in gpu_runs:  # experiments/recipes/gpu_whole_program.sh: one seed, resumed half way
    minutes, bleu, _ = _run_summary(folder)
    gpu = (folder / "gpu.txt").read_text().split(",")[0].strip()
    lines.append(f"| one {gpu} | 1 | {minutes:.0f} min | {bleu:.2f} | `{folder.relative_to(RESULTS)}` |")
  if not gpu_runs:
    lines.append("| a GPU | | not measured yet | not measured yet | |")
  return "\n".join(lines)


@table("model-size")
def model_size() -> str:
  """The paper's two models as configured: exact parameters and training FLOPs per target token."""
  from configs import wmt14_ende
  from transformer.model.size import analytic_param_count, training_flops_per_target_token
  from transformer.model.transformer import ModelConfig
  lines = ["| config | parameters (shared 37k vocabulary) | the paper | training GFLOP per target "
           "token (rows of 32) |", "|---|---|---|---|"]
  for size, paper in (("base", "65M"), ("big", "213M")):
    cfg = wmt14_ende.get_config(size)
    model = ModelConfig.from_config(cfg.model, cfg.data.vocab_size)
    flops = training_flops_per_target_token(model, 32, 32)
    lines.append(f"| `wmt14_ende.py:{size}` | {analytic_param_count(model):,} | {paper} | "
                 f"{flops / 1e9:.3f} |")
  return "\n".join(lines)

@table("paper")
def paper() -> str:
  """The paper's Table 2 beside ours: a cell is filled only by a record under results/wmt14/."""
  ours = {}
  for path in sorted((RESULTS / "wmt14").glob("*/result.json")):
    record = json.loads(path.read_text())
    ours[(record["pair"], record["model"])] = (f"{record['tokenized_bleu']:.1f} "
                                               f"([record]({path.parent.relative_to(REPO)}))")
  rows = ["| newstest2014, tokenized BLEU (the paper's metric) | En→De base | En→De big | En→Fr base "
          "| En→Fr big |", "|---|---|---|---|---|",
          "| the paper (8 P100 GPUs; 12 hours base, 3.5 days big) | 27.3 | 28.4 | 38.1 | 41.8 |",
          "| this implementation | " + " | ".join(
              ours.get((pair, model), "not run yet") for pair in ("en-de", "en-fr")
              for model in ("base", "big")) + " |"]
  return "\n".join(rows)


LITERATURE = [  # published lc-tok BLEU on test2016 / test2017 / MSCOCO, En->De, text only at test time
    ("Wu et al. (ACL 2021), text-only Transformer-Tiny, their Table 1", ("41.02", "33.36", "29.88")),
    ("Guo et al. (EMNLP 2023), the best image-free system", ("42.50", "36.04", "31.95"))]
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
WU_TINY = RESULTS / "multi30k_wu_tiny"
WU_TINY_ENSEMBLE = "multi30k_wu_tiny_ensemble3/en-de"  # its 3 seeds decoded together
BF16_RUNS = RESULTS / "multi30k_test_sets/en-de/levers/bf16mm_drop02_seed"  # + the seed
LEVERS_RUNS = RESULTS / "multi30k_levers/runs"
# The levers grid's best ensemble on validation: its test-set record, its members, and the teacher
# of its distilled student (whose runs and translating its training counts too).
LEVERS_ENSEMBLE = ("multi30k_levers_ensemble/en-de", ("distilled", "word_dropout", "fairseq_init"),
                   "teacher")


def _default_hours() -> float:
  """Hours of one default run alone on a 2-core machine (the default-run table's Zen 5 seed 0)."""
  return _run_summary(RESULTS / DEFAULT_RUNS["2-core AMD EPYC VM (Zen 5)"] / "seed0")[0] / 60


def _hours(folders: list[Path]) -> float:
  """Mean training hours of recorded runs (their metrics.jsonl's clock)."""
  from transformer.metrics import read_metrics, training_clock
  return statistics.mean(training_clock(read_metrics(f, "train"))[-1] / 3600 for f in folders)


def _alone_hours(folder: Path) -> float:
  """Training hours of a recorded run at its pace alone: steps times the seconds a step of its
  fastest tenth of logged intervals (validations and checkpoints included; a process's first
  interval, which compiles, left out), so that the hours it shared the CPU with other work or
  was stopped do not count as the recipe's cost."""
  from transformer.metrics import read_metrics
  train = read_metrics(folder, "train")
  paces = [(b["elapsed"] - a["elapsed"]) / (b["step"] - a["step"]) for a, b in zip(train, train[1:])
           if b["elapsed"] > a["elapsed"]]
  return train[-1]["step"] * statistics.quantiles(paces, n=10)[0] / 3600


def _wu_tiny_rows() -> list[str]:
  """The literature's recipe reproduced (lc-tok BLEU of the mean of each seed's last 10
  checkpoints) and its three seeds ensembled, or how far its grid is."""
  label = "ours: Wu et al.'s recipe (`configs/multi30k_tiny.py`)"
  rows = []
  if (WU_TINY / "results.csv").is_file():
    with open(WU_TINY / "results.csv") as f:
      rows = [r for r in csv.DictReader(f) if r["finished"] == "True"]
  command = "`multi30k_wu_tiny` (its README has the command)"
  if not rows:
    return [f"| {label}: training, 0 of 3 seeds finished | – | – | – | – | {command} |"]
  cells = [mean_sd(_floats(rows, f"{name}_lc_tok_bleu")) for name in TEST_SETS]
  shared = statistics.mean(_floats(rows, "train_sec")) / 3600
  alone = statistics.mean(_alone_hours(WU_TINY / "runs" / r["variant"] / f"seed{r['seed']}")
                          for r in rows)
  seeds = "3 seeds" if len(rows) == 3 else f"{len(rows)} of 3 seeds"
  lines = [f"| {label}, {seeds} | {' | '.join(cells)} | {alone:.1f} a seed alone "
           f"({shared:.1f} as run, sharing the CPU) | {command} |"]
  if len(rows) == 3 and (RESULTS / WU_TINY_ENSEMBLE / "results.md").is_file():
    lines.append(_recipe_row("ours: the same 3 seeds ensembled (one beam search of 5)",
                             WU_TINY_ENSEMBLE, f"{3 * alone:.1f} (3 seeds)"))
  return lines


def _levers_ensemble_row() -> list[str]:
  """The levers' ensemble chosen on validation, with its training: each run at its pace alone plus
  the teacher's selection and translating (its record's wall time)."""
  folder, members, teacher = LEVERS_ENSEMBLE
  if not (RESULTS / folder / "results.md").is_file():
    return []
  trained = sorted({*members, *TEACHERS[teacher].pool})
  hours = sum(_alone_hours(LEVERS_RUNS / name / "seed0") for name in trained)
  readme = (RESULTS / "multi30k_levers" / teacher / "README.md").read_text()
  hours += float(re.search(r"wall time: ([\d.]+) min", readme).group(1)) / 60
  label = (f"ours: a distilled student and two levers ensembled ({', '.join(members)}; chosen on "
           "validation; `experiments/recipes/multi30k_best.sh`)")
  return [_recipe_row(label, folder, f"{hours:.1f} (its {len(trained)} runs and the teacher)")]


def _recipe_row(label: str, folder: str, cost: str) -> str:
  """A recipe's row: the mean over its seeds of each test set's lc-tok BLEU, from its
  multi30k_test_sets record."""
  rows = markdown_rows(RESULTS / folder / "results.md")
  mean = rows["set"].index("**mean**")
  return f"| {label} | {' | '.join(rows[s][mean] for s in TEST_SETS)} | {cost} | `{folder}` |"


@table("multi30k")
def multi30k() -> str:
  """Multi30k against the literature: published text-only rows and ours, lowercased tokenized BLEU
  on the three test sets (mean over seeds), with each recipe's training hours on a 2-core CPU."""
  default = _study_runs("sinusoidal")
  seeds = f"{len(default)} seed{'s' if len(default) > 1 else ''}"
  hours = _default_hours()
  lines = [f"Default run (`configs/multi30k.py`), {seeds}: validation "
           f"sacreBLEU **{mean_sd(_floats(default, 'dev_ema_bleu'))}** (the sinusoidal runs of the "
           "positional study; record, with each run's machine: `experiments/results/positional_full/`).",
           "", "| En→De, lowercased tokenized BLEU | test2016 | test2017 | MSCOCO | training, "
           "hours of the record's 2-core machine | record |", "|---|---|---|---|---|---|"]
  lines += [f"| {label} | {' | '.join(scores)} | – | |" for label, scores in LITERATURE]
  recipes = [("ours: the default, 2 seeds", "multi30k_test_sets/en-de",
              f"{hours:.1f} a seed"),
             ("ours: bf16 products, dropout 0.2, 8,000 steps (`configs/multi30k_bf16.py`), 2 seeds",
              "multi30k_bf16_test_sets/en-de",
              f"{_hours([BF16_RUNS.with_name(f'{BF16_RUNS.name}{s}') for s in (0, 1)]):.1f} a seed"),
             ("ours: ensemble of 2 + MBR (`configs/multi30k_ensemble.py`), 2 pairs (a laptop's "
              "evening: float32, under 2 hours)",
              "multi30k_mbr_test_sets/en-de", f"{2 * hours * 4250 / 4800:.1f} a pair")]
  lines += [_recipe_row(label, folder, cost) for label, folder, cost in recipes]
  lines += _wu_tiny_rows() + _levers_ensemble_row()
  fr = [markdown_rows(RESULTS / f / "results.md") for f in ("multi30k_test_sets/en-fr",
                                                           "multi30k_mbr_test_sets/en-fr")]
  lines += ["", "En→Fr (no published text-only row reproduced here yet): the default "
            + " / ".join(fr[0][s][3] for s in TEST_SETS) + ", the ensemble of 2 + MBR "
            + " / ".join(fr[1][s][3] for s in TEST_SETS) + " (`multi30k_test_sets/en-fr`, "
            "`multi30k_mbr_test_sets/en-fr`)."]
  return "\n".join(lines)


@table("positional")
def positional() -> str:
  """Table 3 row E on Multi30k: sinusoidal against learned positions over seeds."""
  lines = ["| positions | seeds | validation sacreBLEU | long sentences (50–82 tokens) | test2016 | "
           "Δ validation | paired bootstrap p (each seed) | parameters |", "|---|---|---|---|---|---|---|---|"]
  for variant in ("sinusoidal", "learned"):
    rows = _study_runs(variant)
    deltas = _floats(rows, "dev_delta")
    ps = " / ".join(f"{p:.3f}" for p in _floats(rows, "dev_p"))
    lines.append(
        f"| {variant} | {len(rows)} | {mean_sd(_floats(rows, 'dev_ema_bleu'))} | "
        f"{mean_sd(_floats(rows, 'long_ema_bleu'))} | "
        f"{mean_sd(_floats(rows, 'test_2016_flickr_ema_bleu'))} | "
        f"{mean_sd(deltas, sign='+') if deltas else '–'} | {ps or '–'} | {int(rows[0]['params']) / 1e6:.2f}M |")
  return "\n".join(lines)


@table("positional-study")
def positional_study() -> str:
  """Every positional kind at the full default recipe: BLEU on each set (the moving average's),
  the difference from the sinusoids of the same seed and its paired bootstrap p, the machines."""
  with open(STUDY / "results.csv") as f:
    kinds = list(dict.fromkeys(r["variant"] for r in csv.DictReader(f)))
  sets = {"dev": "validation", "long": "long", **HELD_OUT}
  lines = ["| kind | seeds | " + " | ".join(sets.values()) + " | Δ validation (p) | Δ long (p) | "
           "trained on |", "|---|---|" + "---|" * len(sets) + "---|---|---|"]
  for kind in kinds:
    rows = _study_runs(kind)
    if not rows:
      lines.append(f"| {kind} | 0 | " + " | ".join("–" for _ in sets) + " | – | – | |")
      continue
    cells = [mean_sd(_floats(rows, f"{name}_ema_bleu")) for name in sets]
    differences = []
    for name in ("dev", "long"):
      deltas, ps = _floats(rows, f"{name}_delta"), _floats(rows, f"{name}_p")
      p_values = " / ".join(f"{p:.3f}" for p in ps)
      differences.append(f"{mean_sd(deltas, sign='+')} ({p_values})" if deltas else "–")
    machines = ", ".join(sorted({_cpu_name(r["machine"]) for r in rows if r["machine"]}))
    lines.append(f"| {kind} | {len(rows)} | {' | '.join(cells)} | {' | '.join(differences)} | "
                 f"{machines} |")
  return "\n".join(lines)


@table("positional-verdict")
def positional_verdict() -> str:
  """Each kind's difference from the sinusoids on every set, with the seeds in which it is
  significant in the mean's direction, the p of all seeds pooled (sentences resampled) and of the
  two-level bootstrap (trainings and sentences resampled), beside the sinusoids' own seed-to-seed
  spread."""
  sets = {"dev": "validation", **HELD_OUT, "long": "long (past the training lengths)"}
  sinusoids = _study_runs("sinusoidal")
  lines = ["| kind | " + " | ".join(f"Δ {label}" for label in sets.values()) + " |",
           "|---|" + "---|" * len(sets),
           f"| seed-to-seed spread: the sinusoids' std over {len(sinusoids)} seeds | "
           + " | ".join(f"± {statistics.stdev(_floats(sinusoids, f'{name}_ema_bleu')):.2f}"
                        for name in sets) + " |"]
  for kind in dict.fromkeys(r["variant"] for r in _study_runs()):
    rows = [r for r in _study_runs(kind) if r.get("dev_delta")]
    if not rows:
      continue
    cells = []
    for name in sets:
      deltas, ps = _floats(rows, f"{name}_delta"), _floats(rows, f"{name}_p")
      mean = statistics.mean(deltas)
      agree = sum(p < SIGNIFICANT and d * mean > 0 for d, p in zip(deltas, ps))
      pooled = _floats(rows[:1], f"{name}_pooled_p")
      seeds = _floats(rows[:1], f"{name}_seeds_p")
      cells.append(f"{mean_sd(deltas, sign='+')} ({agree}/{len(deltas)}"
                   + (f"; pooled {pooled[0]:.3f}" if pooled else "")
                   + (f"; seeds {seeds[0]:.3f}" if seeds else "") + ")")
    lines.append(f"| {kind} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
