"""SIGTERM and SIGINT become a request to stop after the current optimizer step and save.

Slurm sends SIGTERM before preemption; people press Ctrl-C. Either way the loop finishes its step,
writes a checkpoint and exits with 128 + the signal's number, as a shell reports a command a signal
ended (`EXIT_CODES`): a run stopped before its end is never status 0, so `train && export` does
not export a half-trained model, and a script can still tell "stopped, resumable" (130, 141, 143)
from an error (1-4). Signals that arrive while that checkpoint is being written are
acknowledged and ignored, so a second Ctrl-C cannot cut the save short (a SIGKILL still can,
and orbax's write-then-rename leaves the previous checkpoint as the latest complete one).

Outside the loop (reading data, compiling, sampling at the end) there is no step to finish: Ctrl-C
raises KeyboardInterrupt as usual, and the command makes SIGTERM raise `Terminated`, a kind of
KeyboardInterrupt, so both unwind through the same clean-up and end in one line. Python drops an
exception raised inside a finalizer or a gc callback (JAX registers one), so a signal that lands
there would be lost: the command's handlers also remember it, and `check()`, called where work
goes on in long stretches (tokenizing, before the loop, after generating samples), raises it
again.
"""

import contextlib
import signal
import sys
import threading

EXIT_CODES = {"SIGINT": 130, "SIGPIPE": 141, "SIGTERM": 143}  # 128 + the signal's number


class Terminated(KeyboardInterrupt):
  """SIGTERM outside the training loop (see `raise_on_signals`)."""


_pending: str | None = None  # a signal raised by `_raise` and not yet handled


def _exception(name: str) -> KeyboardInterrupt:
  return Terminated() if name == "SIGTERM" else KeyboardInterrupt()


def _raise(signum, frame) -> None:
  global _pending
  _pending = _pending or signal.Signals(signum).name
  raise _exception(_pending)


def _unraisable(u) -> None:
  if not isinstance(u.exc_value, KeyboardInterrupt):  # a lost signal: `check()` raises it again
    sys.__unraisablehook__(u)


def raise_on_signals() -> None:
  """For a command: SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` (instead of ending
  the process without a word), and one that Python drops is raised again by `check()`."""
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, _raise)
  sys.unraisablehook = _unraisable


def check() -> None:
  """Raises the signal that `raise_on_signals`' handler raised where Python dropped it."""
  if _pending is not None:
    raise _exception(_pending)


def handled() -> None:
  """The interrupt was caught and acted on: `check()` is quiet again."""
  global _pending
  _pending = None


def name_of(interrupt: KeyboardInterrupt) -> str:
  return "SIGTERM" if isinstance(interrupt, Terminated) else "SIGINT"


class GracefulStop:

  def __init__(self):
    self.requested: str | None = None  # "SIGTERM" or "SIGINT" once one arrives
    self.saving = False
    self._previous = {}

  def __enter__(self) -> "GracefulStop":
    if threading.current_thread() is threading.main_thread():  # handlers live on the main thread
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def _handle(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    first = self.requested is None
    self.requested = self.requested or name  # also during a routine save: stop right after it
    if self.saving:
      message = ("a checkpoint is being written; stopping as soon as it is complete" if first
                 else "still writing the checkpoint; it finishes in a moment")
    elif first:
      message = "finishing this step, then saving a checkpoint and stopping"
    else:
      message = "already stopping after this step"
    print(f"\n{name}: {message}", file=sys.stderr, flush=True)

  def request(self, name: str) -> None:
    """A stop asked for from inside the process (stdout closed: "SIGPIPE")."""
    self.requested = self.requested or name

  @contextlib.contextmanager
  def saving_now(self):
    """Signals that arrive in this block only ask to stop once the save is complete."""
    self.saving = True
    try:
      yield
    finally:
      self.saving = False

  @property
  def exit_code(self) -> int:
    """The stop's exit status: 128 + the signal's number; 0 where no signal asked."""
    return EXIT_CODES.get(self.requested, 0)
