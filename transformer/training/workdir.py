"""One way to load a training workdir for use: config, vocabulary, model and parameters.

transformer-eval, -translate, -attention and -average (and the experiments' scripts) all start with
`load_run`, so a workdir is read the same way everywhere: config.json once (with defaults for keys
added since it was written), vocab.model checked against it, and the checkpoint restored into the
train state's shapes on this host's devices — or the mean of the last `average_last` checkpoints,
restored one at a time into a running sum, or the parameters a params-only workdir keeps
(params_file.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections
import sentencepiece as spm

from transformer import partitioning
from transformer.data import vocab as vocab_lib
from transformer.errors import ConfigError
from transformer.model.transformer import ModelConfig, Transformer
from transformer.training import checkpoints, params_file
from transformer.training.step import abstract_train_state

log = logging.getLogger("transformer")


@dataclasses.dataclass(frozen=True)
class LoadedRun:
  """A workdir's checkpoint (or the average of several) ready to decode, score or inspect."""
  workdir: Path
  config: ml_collections.ConfigDict
  vocab: spm.SentencePieceProcessor
  model: Transformer
  raw_params: Any          # the parameters as trained (averaged over `steps`)
  ema_params: Any | None   # their moving average, where the run keeps one (train.ema_decay > 0)
  steps: list[int]         # the checkpoint's step, or the averaged checkpoints' steps
  state: Any = None        # with_state: the last checkpoint's whole train state ...
  data_state: dict | None = None  # ... and its input position

  def params(self, ema: bool = True) -> Any:
    """The moving average where `ema` and the run keeps one, else the raw parameters."""
    return self.ema_params if ema and self.ema_params is not None else self.raw_params


def load_run(workdir: str | Path, step: int | None = None, average_last: int = 1,
             with_state: bool = False) -> LoadedRun:
  """The checkpoint of `workdir` at `step` (default: the latest readable), or the mean of its last
  `average_last` checkpoints up to it. `with_state` also keeps the last one's whole train state and
  input position (what transformer-average writes back)."""
  workdir = Path(workdir)
  cfg = checkpoints.load_run_config(workdir)
  vocab = vocab_lib.load_run_vocab(workdir, cfg.data)
  model = Transformer(ModelConfig.from_config(cfg.model, vocab.get_piece_size()))
  abstract = abstract_train_state(cfg, model, partitioning.replicated(partitioning.data_mesh()))
  if params_file.holds_params(workdir):
    raw, ema, steps = _kept_params(workdir, abstract.params, step, average_last, with_state)
    return LoadedRun(workdir, cfg, vocab, model, raw, ema, steps)
  pick = lambda state: (state.params, getattr(state, "ema_params", None))
  with contextlib.closing(checkpoints.manager(workdir, read_only=True)) as mngr:
    if average_last == 1:
      state, data_state = checkpoints.restore(mngr, abstract, step, with_data=True)
      steps = [int(state.step)]
      raw, ema = pick(state)
    else:
      steps = checkpoints.last_steps(mngr, average_last, up_to=step)
      log.info("Averaging the parameters of the checkpoints at steps %s",
               ", ".join(map(str, steps)))
      raw, ema = checkpoints.average_params(mngr, abstract, steps, pick)
      state, data_state = (checkpoints.restore(mngr, abstract, steps[-1], with_data=True)
                           if with_state else (None, None))
  return LoadedRun(workdir, cfg, vocab, model, raw, ema, steps,
                   state if with_state else None, data_state if with_state else None)


def _kept_params(workdir: Path, abstract_params: Any, step: int | None, average_last: int,
                 with_state: bool) -> tuple[Any, Any | None, list[int]]:
  """A params-only workdir's parameters, if they are what was asked for: its one step (or none
  named), and no averaging or the averaging they hold."""
  raw, ema, steps = params_file.read(workdir, abstract_params)
  held = (f"{workdir} keeps only the parameters of step {steps[-1]}"
          f"{f' (the mean of its last {len(steps)} checkpoints)' if len(steps) > 1 else ''}")
  if with_state:
    raise params_file.ParamsFileError(f"{held}, no optimizer state: it can be evaluated, "
                                      "translated with or exported, not trained or averaged again")
  if step is not None and step != steps[-1]:
    raise params_file.ParamsFileError(f"{held}, not of step {step}: drop --step")
  if average_last not in (1, len(steps)):
    raise params_file.ParamsFileError(f"{held}: it cannot average its last {average_last}; drop "
                                      "--average_last")
  return raw, ema, steps


def load_runs(workdirs: Sequence[str | Path], step: int | None = None,
              average_last: int = 1) -> list[LoadedRun]:
  """`load_run` for each workdir (same step and averaging): the members of an ensemble. They must
  share the vocabulary, or their log-probabilities could not be averaged."""
  runs = [load_run(w, step, average_last) for w in workdirs]
  first = runs[0]
  for member in runs[1:]:
    if not vocab_lib.same_vocabulary(member.vocab, first.vocab):
      raise ConfigError(f"--ensemble: {member.workdir} has a different vocabulary from "
                        f"{first.workdir} ({member.vocab.get_piece_size()} vs "
                        f"{first.vocab.get_piece_size()} pieces, or other pieces); an ensemble "
                        "needs runs trained with one shared vocabulary (copy one run's vocab.model "
                        "into the next run's new workdir before training it: training reuses it)")
  return runs
