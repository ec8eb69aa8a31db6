"""The training command ends once its work is done: after every exit handler (JAX's, orbax's,
the log files'), but without the interpreter's teardown of XLA's clients and thread pools, which
takes about a second of a CPU run's wall time and writes nothing."""

import atexit
import logging
import os
import sys
from typing import NoReturn

_code: int | None = None


def install() -> None:
  """Call before JAX is imported: exit handlers run last-registered first, so this one runs
  after those of every library imported later."""
  atexit.register(_end)


def stdout_to_devnull() -> None:
  """Once stdout's reader has left: later writes and the final flush go nowhere, without error."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())
  os.close(devnull)


def quiet_broken_pipe() -> None:
  """For a command: output into a pipe whose reader left (`| head`) ends the process with 141
  (128 + SIGPIPE), as a shell tool does, instead of a BrokenPipeError traceback."""
  previous = sys.excepthook

  def hook(kind, value, tb) -> None:
    if not issubclass(kind, BrokenPipeError):
      previous(kind, value, tb)
      return
    stdout_to_devnull()  # the interpreter's last flush has nowhere to fail
    os._exit(141)

  sys.excepthook = hook


def exit_now(code: int) -> NoReturn:
  """`sys.exit(code)`, and the handler from `install` then ends the process at once. Only for
  an orderly end: every file closed and every checkpoint write finished."""
  global _code
  _code = code
  sys.exit(code)


def _end() -> None:
  if _code is None:  # an unexpected exception: the usual teardown, traceback and all
    return
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(_code)
