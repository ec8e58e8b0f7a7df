"""The kernels behind two decoding choices, timed alone on this machine: matrix products in float32,
bf16 and int8 (why quantised decoding uses bf16 matrices), and XLA's top-k against the chunked one
(decoding.base.top_k), at the default model's decoding shapes.

    python experiments/analyses/cpu_kernels.py

Each line: milliseconds per call (best of 5 rounds of 50 calls, after a warm-up call).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformer.decoding import top_k  # noqa: E402


def ms_per_call(fn, *args, calls: int = 50, rounds: int = 5) -> float:
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / calls * 1e3)
  return best


def products() -> None:
  key = jax.random.key(0)
  product = lambda dtype, out: jax.jit(lambda x, w: jnp.einsum(
      "md,vd->mv", x.astype(dtype), w, preferred_element_type=out))
  for rows, width in ((64, 256), (256, 8000), (256, 1024), (1024, 8000)):
    x, w = jax.random.normal(key, (rows, 256)), jax.random.normal(key, (width, 256))
    f32 = ms_per_call(product(jnp.float32, jnp.float32), x, w)
    bf16 = ms_per_call(product(jnp.bfloat16, jnp.float32), x, w.astype(jnp.bfloat16))
    int8 = ms_per_call(product(jnp.int8, jnp.int32), x * 20, (w * 20).astype(jnp.int8))
    print(f"[{rows}, 256] x [256, {width}]: float32 {f32:.2f} ms ({2 * rows * 256 * width / f32 / 1e6:.0f}"
          f" GFLOP/s), bf16 {bf16:.2f} ms ({f32 / bf16:.2f}x), int8 {int8:.2f} ms ({f32 / int8:.2f}x)")


def top_ks() -> None:
  for rows, width, k in ((64, 4 * 8000, 8), (256, 8000, 8), (64, 8000, 1)):
    x = jax.random.normal(jax.random.key(1), (rows, width))
    xla = ms_per_call(jax.jit(lambda x, k=k: jax.lax.top_k(x, k)[1]), x)
    ours = ms_per_call(jax.jit(lambda x, k=k: top_k(x, k)[1]), x)
    print(f"top-{k} of [{rows}, {width}]: lax.top_k {xla:.3f} ms, chunked {ours:.3f} ms "
          f"({xla / ours:.1f}x)")


if __name__ == "__main__":
  print(f"JAX {jax.__version__}, {jax.devices()[0].device_kind}")
  products()
  top_ks()
