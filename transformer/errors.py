"""The one error type for mistakes a user can fix: a flag, a config value, a path, a file.

Every program runs through `cli.run_program`, which prints such an error as one line
(`transformer-eval: error: ...`) and exits with status 2; anything else is a bug of ours and keeps
its traceback (status 1). Each part raises its own subclass (ConfigError here, sources.DataError,
checkpoints.CheckpointError, distributed.DistributedError, nonfinite.NonFiniteError), so callers can
still tell them apart.
"""

EXIT_USER_ERROR = 2


class UserError(Exception):
  """Something wrong with what the user gave us; the message says what and how to fix it."""


class ConfigError(UserError, ValueError):
  """A config value or flag that cannot work; the message names the key and what to do."""
