"""train.init_from's config side: the new run takes RUN's architecture and vocabulary size, and its
log names the keys that change what the model computes (the whole path, trained from an import, is
in test_import.py)."""

import logging

import pytest

from configs import multi30k
from transformer.errors import ConfigError
from transformer.training import checkpoints, init_from


def _run_written_with(tmp_path, **model):
  """A run folder whose config.json is the default run's with `model` keys changed."""
  cfg = multi30k.get_config()
  cfg.model.update(model)
  cfg.data.vocab_size = 6000
  tmp_path.mkdir(exist_ok=True)
  checkpoints.write_run_config(tmp_path, cfg)
  return tmp_path


def _fine_tune_config(run):
  cfg = multi30k.get_config()
  cfg.train.init_from = str(run)
  return cfg


def test_the_architecture_comes_from_the_run_and_the_log_names_real_changes(tmp_path, caplog):
  run = _run_written_with(tmp_path, d_ff=512, dropout=0.3)
  with caplog.at_level(logging.INFO, logger="transformer"):
    cfg = init_from.with_architecture(_fine_tune_config(run))
  assert (cfg.model.d_ff, cfg.data.vocab_size) == (512, 6000)
  assert cfg.model.dropout == multi30k.get_config().model.dropout  # how it trains stays its own
  assert "model.d_ff=512" in caplog.text and "data.vocab_size=6000" in caplog.text
  assert "dropout" not in caplog.text


def test_keys_that_resolve_to_the_same_model_are_copied_but_not_reported(tmp_path, caplog):
  # decoder_layers=2 is the default run's 0 (= num_layers, 2); d_k=d_v=64 its 0 (= 256 / 4 heads).
  run = _run_written_with(tmp_path, decoder_layers=2, d_k=64, d_v=64, d_ff=512)
  with caplog.at_level(logging.INFO, logger="transformer"):
    cfg = init_from.with_architecture(_fine_tune_config(run))
  assert (cfg.model.decoder_layers, cfg.model.d_k, cfg.model.d_v) == (2, 64, 64)
  assert "model.d_ff=512" in caplog.text
  assert not any(key in caplog.text for key in ("decoder_layers", "d_k", "d_v"))
  caplog.clear()
  run3 = _run_written_with(tmp_path / "three", decoder_layers=3)
  with caplog.at_level(logging.INFO, logger="transformer"):
    init_from.with_architecture(_fine_tune_config(run3))
  assert "model.decoder_layers=3" in caplog.text


def test_a_folder_without_a_run_config_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="is not a run folder .no config.json."):
    init_from.with_architecture(_fine_tune_config(tmp_path))
