"""A shim for tools that still look for setup.py: everything (metadata, dependencies, extras,
console scripts) is in pyproject.toml, which pip reads directly."""

from setuptools import setup

setup()
