"""Kinds of corpus behind one registry: a kind registered here (a toy: one file of tab-separated
pairs) is checked by the config, read by training's pipeline and named by its caches."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import tiny_run_config

from transformer.config import validate
from transformer.data import sources
from transformer.data.pipeline import training_inputs
from transformer.errors import ConfigError
from transformer.keys import Key
from transformer.training import checkpoints


class TabSeparated(sources.Source):
  """Pairs as 'source<TAB>target' lines of its own keys data.tsv_train (training) or data.tsv_eval."""
  name = "toy_tsv"
  keys = (Key("tsv_train", "", "for source='toy_tsv': the training pairs", fixed=True),
          Key("tsv_eval", "", "for source='toy_tsv': the evaluation pairs"))

  def check(self, data):
    if not data.tsv_train.endswith(".tsv"):
      raise ConfigError("config.data.tsv_train must be a .tsv file for config.data.source='toy_tsv'")

  def _lines(self, data, split):
    path = data.tsv_train if split == data.train_split else data.tsv_eval
    return [line.split("\t") for line in Path(path).read_text().splitlines()]

  def open(self, data, split):
    pairs = self._lines(data, split)
    source, target = [s for s, _ in pairs], [t for _, t in pairs]
    return _Pairs(source, target, f"toy {split}")

  def identity(self, data, split):
    path = data.tsv_train if split == data.train_split else data.tsv_eval
    return f"toy.{split}", f"toy {path} {Path(path).stat().st_mtime_ns} {split}"

  def vocabulary_key(self, data):
    return "toy"


class _Pairs:
  def __init__(self, source, target, name):
    self.source, self.target, self.name = source, target, name

  def __len__(self):
    return len(self.source)

  def read(self, indices):
    return [self.source[i] for i in indices], [self.target[i] for i in indices]


@pytest.fixture
def toy_config(tmp_path, monkeypatch):
  monkeypatch.setitem(sources.SOURCES, TabSeparated.name, TabSeparated())
  cfg = tiny_run_config(tmp_path)
  for split in ("train", "val"):
    en = (tmp_path / f"{split}.en").read_text().splitlines()
    de = (tmp_path / f"{split}.de").read_text().splitlines()
    (tmp_path / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(en, de)))
  cfg.data.source = TabSeparated.name
  cfg.data.tsv_train, cfg.data.tsv_eval = str(tmp_path / "train.tsv"), str(tmp_path / "val.tsv")
  return cfg


def test_a_registered_kind_trains_through_the_pipeline(toy_config, tmp_path):
  validate(toy_config)
  (tmp_path / "run").mkdir()
  vocab, loader, eval_batches = training_inputs(toy_config, tmp_path / "run", num_devices=1)
  assert vocab.get_piece_size() == 300
  batch, _ = next(loader.batches())
  sources_text = {line.split("\t")[0] for line in Path(toy_config.data.tsv_train).read_text().splitlines()}
  row = [int(i) for i in batch["src"][0] if i > 1]  # without padding and EOS
  assert vocab.decode(row) in sources_text  # the toy source's own sentences
  assert eval_batches
  caches = [c for c in (tmp_path / "token_cache").iterdir() if not c.name.startswith(".")]
  assert sorted(c.name.split(".")[0] for c in caches) == ["toy", "toy"]
  assert any(p.name.startswith("toy.train.en-de") for p in (tmp_path / "vocab_cache").iterdir())


def test_the_kind_checks_its_config_and_an_unknown_kind_is_an_error(toy_config):
  toy_config.data.tsv_train = "train.txt"
  with pytest.raises(ConfigError, match="must be a .tsv file"):
    validate(toy_config)
  toy_config.data.source = "parquet"
  known = ", ".join(map(repr, sources.SOURCES))
  assert known.endswith("'toy_tsv'")
  with pytest.raises(ConfigError, match=f"config.data.source must be one of {known}; got 'parquet'"):
    validate(toy_config)


def test_a_resume_keeps_the_kinds_fixed_keys_and_may_change_the_others(toy_config, tmp_path):
  """The run config holds the kind's own keys; the one it marks `fixed` (the training pairs) cannot
  change when a run resumes, the other (evaluation pairs) can."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  checkpoints.write_run_config(workdir, toy_config)
  toy_config.data.tsv_eval = str(tmp_path / "other.tsv")
  assert checkpoints.check_run_config(workdir, toy_config) == []
  toy_config.data.tsv_train = str(tmp_path / "other.tsv")
  with pytest.raises(ConfigError, match="data.tsv_train: .*train.tsv' -> .*other.tsv'"):
    checkpoints.check_run_config(workdir, toy_config)
