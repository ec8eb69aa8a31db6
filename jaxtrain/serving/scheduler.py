"""The worker that decodes: rows of requests wait in a bounded queue; between two advances of the
engine, waiting rows take the free ones (each its own prefill) and finished or abandoned rows leave
theirs, so requests that arrive together, or while others are decoding, share every advance.

One thread owns the engine (JAX runs there); the HTTP side hands rows in with `submit` and gets
their tokens back through each row's `deliver`, called on that thread.
"""

import collections
import dataclasses
import threading
from collections.abc import Callable

import numpy as np

from jaxtrain.system.errors import first_line


class Full(Exception):
  """The queue holds as many waiting rows as it may."""


class Closed(Exception):
  """The server is stopping: it finishes what it holds and takes nothing new."""


@dataclasses.dataclass(eq=False)
class Row:
  """One completion of one prompt (a request with n=3 has three rows)."""
  prompt: np.ndarray  # the token ids the model reads, 1 to seq_len of them
  max_tokens: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  stop_ids: frozenset  # tokens that end it (not part of its text): end-of-text, a chat's <|end|>
  # (new tokens, None) as they come; then (the last ones, "stop" | "length" | "error: ...").
  deliver: Callable[[list[int], str | None], None]
  made: int = 0  # tokens drawn so far, an ending token included
  cancelled: bool = False  # the client left, or a stop string ended it: its row is freed


class Scheduler:
  def __init__(self, engine, queue_limit: int, say: Callable[[str], None]):
    self.engine, self.queue_limit, self.say = engine, queue_limit, say
    self._waiting: collections.deque[Row] = collections.deque()
    self._rows: list[Row | None] = [None] * engine.n_rows
    self._cv = threading.Condition()
    self._stopping = False
    self.finished = 0  # completions made to their end
    self._thread = threading.Thread(target=self._run, name="jaxtrain-serve-decode", daemon=True)

  def start(self) -> None:
    self._thread.start()

  def submit(self, rows: list[Row]) -> None:
    """Queues `rows` (all or none): Full where more than `queue_limit` rows would wait for a free
    one, Closed while the server stops."""
    with self._cv:
      if self._stopping:
        raise Closed()
      free = sum(row is None for row in self._rows)
      if len(self._waiting) + len(rows) > self.queue_limit + free:
        raise Full()
      self._waiting.extend(rows)
      self._cv.notify()

  def cancel(self, rows: list[Row]) -> None:
    """Ends `rows` early: a waiting one never starts, a decoding one leaves its row."""
    with self._cv:
      for row in rows:
        row.cancelled = True
      self._cv.notify()

  def load(self) -> dict:
    with self._cv:
      return {"decoding": sum(r is not None for r in self._rows), "waiting": len(self._waiting),
              "rows": len(self._rows), "queue_limit": self.queue_limit}

  def stop(self, timeout: float = 30.0) -> None:
    """Takes nothing new, ends every row still held (its client is gone by now), and waits for
    the worker to finish."""
    with self._cv:
      self._stopping = True
      for row in [*self._waiting, *filter(None, self._rows)]:
        row.cancelled = True
      self._cv.notify()
    if self._thread.is_alive():
      self._thread.join(timeout)

  def _run(self) -> None:
    while (admitted := self._next()) is not None:
      for i, row in admitted:
        try:
          self.engine.admit(i, row.prompt, temperature=row.temperature, top_k=row.top_k,
                            top_p=row.top_p, seed=row.seed)
          self._rows[i] = row
        except Exception as e:  # noqa: BLE001 - a failed call leaves the engine's buffers donated
          self._fail([row], e)
      live = [(i, row) for i, row in enumerate(self._rows) if row is not None]
      if not live:
        continue
      try:
        made_RS = self.engine.advance()
      except Exception as e:  # noqa: BLE001
        self._fail([row for _, row in live], e)
        continue
      for i, row in live:
        self._take(i, row, made_RS[i])

  def _next(self) -> list[tuple[int, Row]] | None:
    """The waiting rows that take free rows now, after the cancelled ones leave theirs; waits
    while there is nothing to do; None once the server stops and nothing is left."""
    with self._cv:
      while True:
        for i, row in enumerate(self._rows):
          if row is not None and row.cancelled:
            self._free(i)
        self._waiting = collections.deque(r for r in self._waiting if not r.cancelled)
        busy = any(r is not None for r in self._rows)
        if self._waiting or busy:
          break
        if self._stopping:
          return None
        self._cv.wait()
      free = [i for i, row in enumerate(self._rows) if row is None]
      return [(i, self._waiting.popleft()) for i in free[:len(self._waiting)]]

  def _take(self, i: int, row: Row, made_S: np.ndarray) -> None:
    """Row i's new tokens, up to its max_tokens and its first ending token, handed on."""
    new = made_S[:row.max_tokens - row.made].tolist()
    end = next((k for k, t in enumerate(new) if t in row.stop_ids), None)
    if end is not None:
      row.made += end + 1
      new, finish = new[:end], "stop"
    else:
      row.made += len(new)
      finish = "length" if row.made >= row.max_tokens else None
    if finish:
      with self._cv:
        self._free(i)
      self.finished += 1
    row.deliver(new, finish)

  def _free(self, i: int) -> None:
    self._rows[i] = None
    self.engine.release(i)

  def _fail(self, rows: list[Row], e: Exception) -> None:
    """A failed engine call: its rows end with the error, and every row starts afresh (the
    call's buffers are gone), so the others decoding end too."""
    self.say(f"error: decoding failed ({type(e).__name__}: {first_line(e)}); the requests it "
             "held end with that error, the server goes on")
    held = [r for r in self._rows if r is not None]
    with self._cv:
      self._rows = [None] * len(self._rows)
      self.engine.reset()
    for row in {id(r): r for r in [*rows, *held]}.values():
      row.deliver([], f"error: decoding failed ({type(e).__name__}: {first_line(e)})")
