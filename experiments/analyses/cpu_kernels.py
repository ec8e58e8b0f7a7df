"""The kernels behind three decoding choices, timed alone on this machine: matrix products in float32,
bf16 and int8 (why quantised decoding uses bf16 matrices), the projection onto the vocabulary with
the matrix stored [V, D] or [D, V] (why a search on CPUs stores it transposed:
translator.search_params), a decoder layer's product in XLA and in OpenBLAS (whether XLA's kernel is
what separates us from CTranslate2), and XLA's top-k against the chunked one (decoding.base.top_k),
at the default model's decoding shapes.

    python experiments/analyses/cpu_kernels.py

Each line: milliseconds per call (best of 5 rounds of 50 calls, after a warm-up call).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

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


def projection_layouts(steps: int = 200) -> None:
  """[rows, 256] x the [8,000, 256] matrix as stored for training, against its [256, 8,000] copy, at
  a decoding step's row counts; `steps` products per call in a loop, as a search runs them."""
  for rows in (8, 16, 32, 64, 128):
    x = jax.random.normal(jax.random.key(1), (rows, 256))
    matrix = jax.random.normal(jax.random.key(2), (8000, 256)) * 0.05
    def loop(x, w, spec):
      body = lambda i, c: c + jnp.einsum(spec, c, w)[:, :256] * 1e-3
      return jax.lax.fori_loop(0, steps, body, x)
    vd = ms_per_call(jax.jit(lambda x, w: loop(x, w, "md,vd->mv")), x, matrix, calls=5)
    dv = ms_per_call(jax.jit(lambda x, w: loop(x, w, "md,dv->mv")), x, jnp.transpose(matrix),
                     calls=5)
    gflop = 2 * rows * 256 * 8000 * steps / 1e6
    print(f"[{rows}, 256] x vocabulary: [V, D] {gflop / vd:.0f} GFLOP/s, [D, V] {gflop / dv:.0f} "
          f"GFLOP/s ({vd / dv:.2f}x)")


def versus_openblas(steps: int = 200) -> None:
  """A decoder layer's [rows, 256] x [256, 256] product, XLA's against numpy's (OpenBLAS), `steps`
  products a call as a search runs them. Run it on one core to compare the kernels alone:
  OPENBLAS_NUM_THREADS=1 XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 python ..."""
  def loop(x, w, fori):
    return fori(0, steps, lambda i, h: h + (h @ w) * 1e-3, x)
  def python_fori(start, stop, body, x):
    for i in range(start, stop):
      x = body(i, x)
    return x
  for rows in (32, 64, 256):
    x = np.random.default_rng(0).standard_normal((rows, 256), np.float32)
    w = np.random.default_rng(1).standard_normal((256, 256), np.float32) * 0.05
    xla = ms_per_call(jax.jit(lambda x, w: loop(x, w, jax.lax.fori_loop)), x, w, calls=5)
    blas = ms_per_call(lambda x, w: loop(x, w, python_fori), x, w, calls=5)
    gflop = 2 * rows * 256 * 256 * steps / 1e6
    print(f"[{rows}, 256] x [256, 256]: XLA {gflop / xla:.0f} GFLOP/s, OpenBLAS (numpy) "
          f"{gflop / blas:.0f} GFLOP/s")


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
  projection_layouts()
  versus_openblas()
  top_ks()
