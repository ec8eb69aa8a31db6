"""A multi-process run whose process dies: the survivors stop at once, with one line that
names the lost process and the checkpoint a restart resumes from, instead of waiting in
barriers for a process that will not come back.

A survivor's next collective fails (gloo: its connection to the dead process breaks, or a CPU
collective waits `distributed.timeout_s` in vain: startup.COLLECTIVE_TIMEOUT); after it,
orbax's commits and jax's exit handler would wait for the dead process until the heartbeat
timeout, so the survivor ends itself with os._exit. One that blocks without an error (an NCCL
collective, a barrier) is ended by jax itself, with jax's report, 30 s after that.
The state here is the process's, like jax.distributed's own: one multi-process run per process.
"""

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable

import jax

from jaxtrain.system.errors import PeerLost, UserError

# Only the words of a broken connection to another process (gloo's TCP transport, the system's
# errors): nothing else that fails in a collective means that a process is gone.
_LOST_WORDS = re.compile(r"connection (closed|reset) by peer|broken pipe|read error|write error|"
                         r"socket closed|timed out waiting", re.IGNORECASE)


# While `watch_peers` runs: the step the loop is at, and what a restart does ("resume from the
# checkpoint of step 50").
_watched: tuple[Callable[[], int], Callable[[], str]] | None = None
_leaving = threading.Lock()  # held by the thread that prints the line and ends the process


@contextlib.contextmanager
def watch_peers(step: Callable[[], int], restart: Callable[[], str]):
  """While the block runs, a collective that fails because another process is gone ends this one
  with a line that names `step()` and `restart()`."""
  global _watched
  _watched = step, restart
  try:
    with ends_if_lost():
      yield
  finally:
    _watched = None


@contextlib.contextmanager
def ends_if_lost():
  """Around a collective: if it fails because another process is gone, this one ends."""
  try:
    yield
  except Exception as e:
    end_if_lost(e)
    raise


def end_if_lost(e: BaseException) -> None:
  """Ends this process with one line if `e` shows a broken connection to another process of the
  run; returns otherwise."""
  if isinstance(e, UserError) or not isinstance(e, Exception) or jax.process_count() == 1:
    return
  reason = _reason(e)
  if reason is None:
    return
  _leaving.acquire()  # never released: the process ends holding it (a second thread waits here)
  logging.getLogger("jaxtrain").error("a collective failed: %s", e)
  n = jax.process_count()
  # With two processes the connection that broke was to the other one; with more, the error
  # text's peer address (in the reason) is all that tells which.
  who = f"process {1 - jax.process_index()} of {n}" if n == 2 else "another process"
  watched = _watched
  message = f"lost contact with {who}"
  if watched is not None:
    step, restart = watched
    message += f" at step {step()} ({reason}); restart every process to {restart()}"
  else:
    message += f" ({reason}); restart every process"
  error = PeerLost(message)
  logging.getLogger("jaxtrain").error("%s", error)
  sys.stdout.flush()
  print(f"error: {error}", file=sys.stderr, flush=True)
  os._exit(error.exit_code)  # past jax's and orbax's waits for the lost process (see above)


def _reason(e: BaseException) -> str | None:
  """The line of `e` that shows a broken connection, in a few words ('Gloo AllGather failed:
  Connection closed by peer [10.0.0.3]:49583'); None if no line does."""
  for line in str(e).splitlines():
    if _LOST_WORDS.search(line):
      line = re.sub(r"^\s*[A-Z_]+: ", "", line)  # the status code (UNKNOWN, INTERNAL)
      line = re.sub(r"\[[^\]\s]+\.(cc|h|cpp):\d+\] ", "", line)  # the C++ source location
      return line.strip()[:160]
  return None
