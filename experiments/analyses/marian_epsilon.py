"""Marian's LayerNorm epsilon (1e-5) against ours (1e-6), measured on trained runs: Transformers'
log-probabilities of validation references under the exported model beside ours, with the residual
stream scaled from each stack's first LayerNorm on by sqrt(10) (every LayerNorm but those two then
computes ours exactly) or by 4 (what transformer-export writes: exact to scale, so an import gives
the run back; the LayerNorms then compute epsilon 6.25e-7), and unscaled (every LayerNorm at
Marian's epsilon).

    python -m experiments.analyses.marian_epsilon RUN [RUN ...] --pairs=300 \
      --out=experiments/results/marian_epsilon/RECORD.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from transformer import decoding, hardware, version
from transformer.data import sources
from transformer.evaluation import export, marian
from transformer.model.transformer import shift_right
from transformer.tokens import EOS_ID, PAD_ID
from transformer.training.workdir import load_run


def padded(rows: list[list[int]]) -> np.ndarray:
  out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def differences(workdir: Path, pairs: int, batch: int = 50) -> dict:
  """Largest and mean |log p| difference over the first `pairs` validation references' tokens, for
  the stream scaled by sqrt(10) and unscaled."""
  import torch
  from safetensors.numpy import save_file
  from transformers import MarianConfig, MarianMTModel
  run = load_run(workdir)
  cfg, config, params = run.config, run.model.config, run.params(True)
  split = sources.load_split(cfg.data, cfg.data.eval_split)
  limit = cfg.data.max_len
  src, tgt = [], []
  for s, t in zip(split.source, split.target):
    a, b = run.vocab.encode(s) + [EOS_ID], run.vocab.encode(t) + [EOS_ID]
    if max(len(a), len(b)) <= limit:
      src.append(a)
      tgt.append(b)
  src, tgt = src[:pairs], tgt[:pairs]
  rows = export.default_max_positions(cfg)
  result = {"workdir": str(workdir), "step": run.steps[-1], "pairs": len(src),
            "tokens": sum(map(len, tgt))}
  for name, scale in (("scaled", float(np.sqrt(10.0))), ("power_of_two", marian.stream_scale(config)),
                      ("unscaled", 1.0)):
    with tempfile.TemporaryDirectory() as folder:
      save_file(marian.marian_tensors(config, params, rows, scale), f"{folder}/model.safetensors",
                metadata={"format": "pt"})
      MarianConfig(**marian.marian_settings(config, rows)).save_pretrained(folder)
      engine = MarianMTModel.from_pretrained(folder).eval()
    gaps = []
    for i in range(0, len(src), batch):
      s, t = padded(src[i:i + batch]), padded(tgt[i:i + batch])
      ours = np.asarray(decoding.forced_log_probs(run.model, params, jnp.asarray(s), jnp.asarray(t)))
      with torch.no_grad():
        logits = engine(input_ids=torch.tensor(s), attention_mask=torch.tensor(s != PAD_ID),
                        decoder_input_ids=torch.tensor(np.asarray(shift_right(jnp.asarray(t))))).logits
      theirs = np.take_along_axis(torch.log_softmax(logits, -1).numpy(),
                                  t[..., None].astype(np.int64), -1)[..., 0]
      gaps.append(np.abs(theirs - ours)[t != PAD_ID])
    gaps = np.concatenate(gaps)
    result[name] = {"max": float(gaps.max()), "mean": float(gaps.mean()),
                    "p99": float(np.quantile(gaps, 0.99))}
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdirs", nargs="+", type=Path)
  parser.add_argument("--pairs", type=int, default=300)
  parser.add_argument("--out", type=Path, required=True)
  args = parser.parse_args()
  runs = [differences(w, args.pairs) for w in args.workdirs]
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps({
      "command": "python -m experiments.analyses.marian_epsilon " + " ".join(
          [*map(str, args.workdirs), f"--pairs={args.pairs}", f"--out={args.out}"]),
      "machine": hardware.describe()["machine"], "commit": version.commit(),
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}, indent=1) + "\n")
  for r in runs:
    print(f"{r['workdir']} (step {r['step']}, {r['tokens']} tokens): scaled max {r['scaled']['max']:.2e}, "
          f"power of two max {r['power_of_two']['max']:.2e}, "
          f"unscaled max {r['unscaled']['max']:.2e} (mean {r['unscaled']['mean']:.2e})")


if __name__ == "__main__":
  main()
