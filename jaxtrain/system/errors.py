"""User-facing errors: one line that names the problem and the fix, exit status 2."""


def first_line(e: BaseException) -> str:
  """What an error says, in the one line a message can quote (its type where it says nothing)."""
  return str(e).splitlines()[0] if str(e) else type(e).__name__


class UserError(Exception):
  """Bad input from the user (config, data, workdir). Printed as one line, never a traceback."""

  exit_code = 2


class ConfigError(UserError):
  """A config field with a bad value. The message starts with the field's full name."""

  def __init__(self, field: str, problem: str, fix: str):
    self.field = field
    super().__init__(f"config.{field}: {problem}; {fix}")


class NonFiniteLoss(UserError):
  """The loss, the gradients or the params stopped being finite numbers."""

  exit_code = 3


class PeerLost(UserError):
  """Another process of a multi-process run died or stopped answering: every process has to be
  restarted. Exit status 4, so that a launcher can tell it apart and restart the job."""

  exit_code = 4
