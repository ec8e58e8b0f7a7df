"""Shared fixtures (helpers: tests/helpers.py)."""

import numpy as np
import pytest


@pytest.fixture
def rng():
  return np.random.default_rng(0)
