"""What the programs say to a user: --help opens with what the program does and example commands,
and a mistake on a machine without accelerators is one line, with nothing of JAX's plugins before it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib

import pytest
from helpers import REPO

from transformer import hardware
from transformer.cli import usage

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
PROGRAMS = {name: target.split(":")[0] for name, target in SCRIPTS.items()
            if name != "transformer-attention"}  # the old name of transformer-attention-maps


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_help_opens_with_what_it_does_and_examples(program):
  text = usage(importlib.import_module(PROGRAMS[program]).__doc__)
  what, examples = text.strip().split("\n\n")
  assert ".py" not in what and "(" not in what.split()[0], what  # no module names up front
  lines = [line.strip() for line in examples.splitlines()]
  assert all(line.startswith("    ") for line in examples.splitlines()), examples
  assert any(program in line.split("|")[-1].split()[0:1] for line in lines), examples


def _without_jax_platforms() -> dict[str, str]:
  return {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}


@pytest.mark.skipif(any(hardware.accelerator_devices().values()), reason="an accelerator is present")
def test_a_mistake_is_one_line_with_nothing_before_it(tmp_path):
  out = subprocess.run([sys.executable, "-m", "transformer.evaluation.evaluate",
                        f"--workdir={tmp_path / 'absent'}", "--beam_size=0"],
                       cwd=REPO, env=_without_jax_platforms(), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      f"transformer-eval: error: {tmp_path / 'absent'}/config.json not found: {tmp_path / 'absent'} "
      "is not a training workdir (train first with transformer-train --workdir=...)"]


def test_help_of_a_program_as_run(tmp_path):
  out = subprocess.run([sys.executable, "-m", "transformer.training.train", "--help"], cwd=REPO,
                       env=_without_jax_platforms(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0
  assert out.stdout.startswith("Train a translation model from a config")
  assert "transformer-train --config=configs/multi30k.py --workdir=runs/m30k" in out.stdout
  assert "--config.train.steps" in out.stdout or "--config" in out.stdout


@pytest.mark.skipif(any(hardware.accelerator_devices().values()), reason="an accelerator is present")
def test_a_program_that_starts_jax_prints_only_its_own_words():
  out = subprocess.run([sys.executable, "-m", "transformer.accelerators.model_info",
                        "--config=configs/multi30k.py"], cwd=REPO, env=_without_jax_platforms(),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0
  assert out.stderr == ""
  assert out.stdout.startswith("module")
