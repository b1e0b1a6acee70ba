"""The errors a user can cause, raised with a message that names the problem and its fix.

They live in `rlkit.core` so that any module (a component validating its own config section, a stage, the
launcher) can raise or catch them without importing the trainer: the config module imports no component,
and no component imports the config module for its error type.
"""


class ConfigError(ValueError):
  """A user mistake in the config; the message names the key and the fix."""


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. too many non-finite updates in a row); the message says why and what to do."""
