"""host_memory: with glibc's malloc told to keep freed memory, a large block freed and allocated
again comes back without page faults (XLA's CPU runtime does this with each call's temporaries)."""

import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

from transformer.host_memory import reuse_freed_memory

# Allocates 256 MiB twice (one block, as XLA does), and prints how many pages the second
# allocation faulted in, out of how many it has.
FAULTS_OF_A_REUSED_BLOCK = """
import ctypes, resource, sys
from transformer.host_memory import reuse_freed_memory
if sys.argv[1] == "reuse":
  assert reuse_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size = 256 << 20
def allocate_and_touch():
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  return block
libc.free(ctypes.c_void_p(allocate_and_touch()))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
allocate_and_touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, size // 4096)
"""


def faults_of_a_reused_block(mode: str) -> tuple[int, int]:
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_MALLOC_DEFAULTS"}
  out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_REUSED_BLOCK, mode], check=True,
                       capture_output=True, text=True, env=env).stdout
  faults, pages = map(int, out.split())
  return faults, pages


def test_a_freed_large_block_is_reused_without_page_faults():
  if ctypes.util.find_library("c") is None or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"):
    pytest.skip("not glibc: malloc keeps its own policy")
  faults, pages = faults_of_a_reused_block("reuse")
  assert faults < pages // 20
  faults, pages = faults_of_a_reused_block("default")  # what glibc does unset: mmap, munmap, refault
  assert faults > pages // 2


def test_the_environment_variable_leaves_malloc_as_it_is(monkeypatch):
  monkeypatch.setenv("TRANSFORMER_MALLOC_DEFAULTS", "1")
  assert reuse_freed_memory() is False
