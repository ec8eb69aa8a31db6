"""SIGTERM and SIGINT become a request to stop after the current optimizer step and save.

Slurm sends SIGTERM before preemption; people press Ctrl-C. Either way the loop finishes its step
(or gives up an evaluation between two batches), writes a checkpoint and exits with 128 + the
signal's number (`EXIT_CODES`): a stopped run is never status 0, so `train && export` does not
export a half-trained model. Signals during that checkpoint's write are acknowledged and ignored,
so a second Ctrl-C cannot cut the save short.

Outside the loop there is no step to finish: both raise (`raise_on_signals`) and unwind through
the same clean-up; `check()` raises again one that Python dropped in a gc callback (JAX registers
one), and `interruptible` keeps the main thread, where handlers run, free of long native calls.
"""

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable

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


def interruptible(fn: Callable, *args, waiting: Callable[[float], None] | None = None,
                  every_s: float = 15.0):
  """`fn(*args)`, run in a daemon thread while this thread (the main one) waits for it, so a signal
  is raised here at once however long `fn` stays in native code; the process then ends without
  waiting for `fn`. `waiting(seconds so far)` is called every `every_s` seconds meanwhile (a
  progress line). Elsewhere than on the main thread, `fn(*args)` as it is."""
  if threading.current_thread() is not threading.main_thread():
    return fn(*args)
  outcome = {}

  def run() -> None:
    try:
      outcome["value"] = fn(*args)
    except BaseException as e:  # raised again on the main thread
      outcome["error"] = e

  worker = threading.Thread(target=run, name="jaxtrain-interruptible", daemon=True)
  t0 = time.monotonic()
  worker.start()
  said = 0
  while worker.is_alive():
    worker.join(0.1)  # a signal's handler runs (and raises) while this waits
    check()
    if waiting is not None and (time.monotonic() - t0) // every_s > said:
      said += 1
      waiting(time.monotonic() - t0)
  if "error" in outcome:
    raise outcome["error"]
  return outcome["value"]


def name_of(interrupt: KeyboardInterrupt) -> str:
  return "SIGTERM" if isinstance(interrupt, Terminated) else "SIGINT"


class GracefulStop:

  def __init__(self):
    self.requested: str | None = None  # "SIGTERM" or "SIGINT" once one arrives
    self.saving = False
    self.evaluating = False  # an evaluation asks `requested` between its batches and gives up
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
    elif first and self.evaluating:
      message = "stopping the evaluation, then saving a checkpoint and stopping"
    elif first:
      message = "finishing this step, then saving a checkpoint and stopping"
    else:
      message = "already stopping after this step"
    print(f"\n{name}: {message}", file=sys.stderr, flush=True)

  def request(self, name: str) -> None:
    """A stop asked for from inside the process (stdout closed: "SIGPIPE")."""
    self.requested = self.requested or name

  @contextlib.contextmanager
  def _while(self, flag: str):
    setattr(self, flag, True)
    try:
      yield
    finally:
      setattr(self, flag, False)

  def saving_now(self):
    """Signals that arrive in this block only ask to stop once the save is complete."""
    return self._while("saving")

  def evaluating_now(self):
    """An evaluation runs in this block: a signal gives it up (it has no record)."""
    return self._while("evaluating")

  @property
  def exit_code(self) -> int:
    """The stop's exit status: 128 + the signal's number; 0 where no signal asked."""
    return EXIT_CODES.get(self.requested, 0)
