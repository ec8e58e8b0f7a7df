"""Evaluation beside training: `transformer-eval --workdir=DIR --watch`.

A separate process that polls WORKDIR/checkpoints, evaluates every checkpoint it has not evaluated
yet on the validation split (beam search, both BLEUs, the usual report files and a `bleu` record in
metrics.jsonl), keeps WORKDIR/eval/best.json pointing at the best checkpoint by sacreBLEU, and stops
once it has evaluated the checkpoint of the config's last step (or after --idle_minutes without a new
checkpoint). It only reads the trainer's files (Orbax publishes a checkpoint atomically, so a
half-written one is never listed) and never signals the trainer; on accelerators give it its own
device (e.g. CUDA_VISIBLE_DEVICES) so it does not take the trainer's. A checkpoint deleted by the
trainer's keep-N before it is read is skipped with a warning. Compiled beam searches are reused from
one checkpoint to the next.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from transformer.metrics import read_metrics
from transformer.training import checkpoints

log = logging.getLogger("transformer")
BEST_FILE = "best.json"


def evaluated_steps(workdir: str | Path, test_set: str, search_tag: str = "", min_len: int = 0
                    ) -> set[int]:
  """Steps already evaluated on `test_set` (single checkpoints) with this search (its
  SearchSettings.tag and minimum length), from metrics.jsonl: a step scored with another search
  is not done."""
  return {r["step"] for r in read_metrics(workdir, "bleu")
          if r.get("test_set") == test_set and r.get("averaged", 1) == 1
          and r.get("search_tag", "") == search_tag and r.get("min_len", 0) == min_len}


def update_best(workdir: Path, report: dict) -> dict:
  """Records `report` in eval/best.json if its sacreBLEU beats the best so far; returns the best."""
  path = workdir / "eval" / BEST_FILE
  best = json.loads(path.read_text()) if path.is_file() else None
  score = report["sacrebleu"]["bleu"]
  if best is None or score > best["bleu"]:
    best = {"step": report["checkpoint_step"], "bleu": score, "test_set": report["test_set"],
            "tokenized_bleu": report["tokenized_bleu"]["bleu"], "report": report["files"][1]}
    path.write_text(json.dumps(best, indent=2) + "\n")
  return best


def watch(workdir: str, evaluate_step: Callable[[int], dict], poll_seconds: float = 60,
          idle_minutes: float = 0, search_tag: str = "", min_len: int = 0) -> list[int]:
  """Evaluates new checkpoints with `evaluate_step(step) -> report` (evaluate.evaluate with the
  program's flags: its search's `search_tag` and `min_len`) until training has finished; returns
  the steps evaluated."""
  workdir = Path(workdir)
  test_set = checkpoints.load_run_config(workdir).data.eval_split
  done = evaluated_steps(workdir, test_set, search_tag, min_len)
  evaluated, last_new = [], time.time()
  log.info("Watching %s for new checkpoints (every %.0fs)", workdir / checkpoints.CHECKPOINT_DIR,
           poll_seconds)
  with contextlib.ExitStack() as stack:
    mngr = None  # one manager for the whole watch, made once the trainer has made its directory
    while True:
      final_step = checkpoints.load_run_config(workdir).train.steps  # a resume may extend it
      if mngr is None and (workdir / checkpoints.CHECKPOINT_DIR).is_dir():
        mngr = stack.enter_context(contextlib.closing(checkpoints.manager(workdir, read_only=True)))
      if mngr is not None:
        mngr.reload()
      for step in sorted(mngr.all_steps() if mngr else []):
        if step in done:
          continue
        try:
          report = evaluate_step(step)
        except checkpoints.CheckpointError as e:
          log.warning("skipping checkpoint %d: %s", step, e)
          done.add(step)  # deleted by keep-N, or broken: not tried again
          continue
        done.add(step)
        evaluated.append(step)
        last_new = time.time()
        best = update_best(workdir, report)
        log.info("step %d: sacreBLEU %.2f (tokenized %.2f); best so far: step %d, %.2f", step,
                 report["sacrebleu"]["bleu"], report["tokenized_bleu"]["bleu"], best["step"],
                 best["bleu"])
      if done and max(done) >= final_step:
        log.info("Training has finished (step %d evaluated); stopping", max(done))
        return evaluated
      if idle_minutes and time.time() - last_new > idle_minutes * 60:
        log.info("No new checkpoint for %.0f minutes; stopping", idle_minutes)
        return evaluated
      time.sleep(poll_seconds)
