"""What a person sees: a progress bar on a terminal, or plain lines (process 0 only); and the
libraries' own messages kept in a file, out of the way of those lines."""

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jaxtrain.system import exiting, fmt


class _QuietFileHandler(logging.FileHandler):
  """A log line that cannot be written (a full disk) is dropped: the run's own error says what
  failed, and logging's report of it would be a traceback on the terminal."""

  def handleError(self, record: logging.LogRecord) -> None:
    pass


class LibraryLog:
  """Sends what the libraries report (orbax, grain, jax: their logging, Python warnings, and the
  exceptions their background threads cannot raise) to a file instead of the terminal, and
  counts the errors among them, so that a failure can point at the file. A process that ends
  with its run (the CLI) keeps it to the end: orbax's threads can still report a failed write
  after the run has given up on it."""

  def __init__(self, path: Path):
    self.path, self.errors = path, 0
    self._saved = None

  def start(self) -> "LibraryLog":
    self.path.parent.mkdir(parents=True, exist_ok=True)
    handler = _QuietFileHandler(self.path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
    handler.addFilter(self._count)
    root = logging.getLogger()
    self._saved = (list(root.handlers), sys.unraisablehook, threading.excepthook, handler)
    for previous in self._saved[0]:  # absl's handler writes to the terminal
      root.removeHandler(previous)
    root.addHandler(handler)
    logging.captureWarnings(True)
    sys.unraisablehook = self._unraisable
    threading.excepthook = self._thread_exception
    return self

  def stop(self) -> None:
    handlers, sys.unraisablehook, threading.excepthook, handler = self._saved
    root = logging.getLogger()
    root.removeHandler(handler)
    handler.close()
    for previous in handlers:
      root.addHandler(previous)
    logging.captureWarnings(False)

  def _count(self, record: logging.LogRecord) -> bool:
    self.errors += record.levelno >= logging.ERROR
    return True

  def __enter__(self) -> "LibraryLog":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  def _thread_exception(self, args) -> None:
    logging.getLogger("thread").error(
        "uncaught in thread %s", args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

  def _unraisable(self, unraisable) -> None:
    logging.getLogger("unraisable").error(
        "%s %r", unraisable.err_msg or "Exception ignored in", unraisable.object,
        exc_info=(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))


class Console:
  """Prints on process 0 only; a tqdm bar on a terminal unless headless, plain lines otherwise."""

  def __init__(self, enabled: bool = True, headless: bool = False):
    self.enabled = enabled
    self.use_bar = enabled and not headless and sys.stderr.isatty()
    self.bar = None
    self.closed = False  # stdout's reader went away (`| head`)
    self.on_closed: Callable[[], None] | None = None  # the loop's stop request

  def print(self, line: str) -> None:
    if not self.enabled or self.closed:
      return
    try:
      if self.bar is not None:
        self.bar.write(line)
      else:
        print(line, flush=True)
    except BrokenPipeError:
      # SIGPIPE's convention: a command whose reader left stops. Training stops as after Ctrl-C
      # (with a checkpoint); stdout goes to /dev/null so no later write or flush fails.
      self.closed = True
      exiting.stdout_to_devnull()
      if self.on_closed is not None:
        self.on_closed()

  def start(self, total: int, initial: int) -> None:
    if self.use_bar:
      from tqdm.auto import tqdm

      self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

  def progress(self, step: int, total: int, loss: float, lr: float, tokens_per_sec: float | None,
               elapsed: float, eta: float | None, memory: str = "",
               val: float | None = None) -> None:
    """The progress line (or bar) of a logged step; `val`: the latest val loss, once there is
    one, beside the train loss, so that overfitting shows without scrolling back. No speed (None)
    before a step was timed: then no tok/s and no eta are shown, rather than 0."""
    loss_text = f"loss {loss:.4f}" + ("" if val is None else f" | val {val:.4f}")
    speed = "" if tokens_per_sec is None else f"{fmt.count(tokens_per_sec)} tok/s"
    if self.bar is not None:
      self.bar.total = total  # a time budget's plan may move the end
      self.bar.update(step - self.bar.n)
      self.bar.set_postfix_str(" ".join(filter(None, [loss_text.replace(" |", ""),
                                                      f"lr {lr:.2e}", speed, memory])),
                               refresh=False)
    else:
      parts = [f"step {step:>6}/{total}", loss_text, f"lr {lr:.2e}", speed,
               f"elapsed {fmt.duration(elapsed)}",
               "" if eta is None or step >= total else f"eta {fmt.duration(eta)}", memory]
      self.print(" | ".join(filter(None, parts)))

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


class Ticker:
  """Progress as plain lines, for work of more than a few seconds where no bar shows it (output
  to a file, `headless`): `update(n)` as a tqdm bar takes it; a line after FIRST_S seconds, then
  every EVERY_S, e.g. `data: tokenizing: 45.1 MB of 157.2 MB (29%), 12.0s`."""

  FIRST_S, EVERY_S = 5.0, 15.0

  def __init__(self, log: Callable[[str], None], what: str, total: int):
    self.log, self.what, self.total, self.done = log, what, total, 0
    self.t0 = time.monotonic()
    self.next = self.t0 + self.FIRST_S

  def update(self, n: int) -> None:
    self.done += n
    now = time.monotonic()
    if now >= self.next:
      self.next = now + self.EVERY_S
      share = f" ({self.done / self.total:.0%})" if self.total else ""
      self.log(f"{self.what}: {fmt.nbytes(self.done)} of {fmt.nbytes(self.total)}{share}, "
               f"{fmt.duration(now - self.t0)}")
