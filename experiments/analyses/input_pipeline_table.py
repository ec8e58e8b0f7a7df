"""docs/data.md's table of input-side figures, from the record's JSON files (the `input-pipeline`
table of experiments/tables.py, which writes it into the page)."""

from __future__ import annotations

import json
from pathlib import Path


def _load(record: Path, name: str) -> dict | None:
  path = record / f"{name}.json"
  return json.loads(path.read_text()) if path.is_file() else None


def _rate(x: float) -> str:
  return f"{x / 1e6:.2f}M"


def table(record: str | Path) -> str:
  """The markdown of the record's figures."""
  record = Path(record)
  lines = []
  prep, standin = _load(record, "prepare_4.5m"), _load(record, "standin")
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
                      ("pack_40.8m", "packed, 40.8M (synthetic ids)")):
    result = _load(record, name)
    if not result:
      continue
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
