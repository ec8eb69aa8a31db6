"""A request in flight: its rows handed to the scheduler, their tokens back on the event loop as
each choice's text, cut at a stop string, with the tokens counted for `usage`.

The scheduler's thread delivers tokens; `Flight.events` yields (choice, new text, finish reason)
on the asyncio side as they come. A stop string ends its choice there (its row is freed at the
next advance); so does a client that leaves (`cancel`).
"""

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from jaxtrain.serving.scheduler import Row, Scheduler


class Text:
  """A choice's text as its tokens come: a character whose bytes are not all there yet waits
  for them, and so does a tail that may be the start of a stop string; the text ends before the
  first stop string."""

  def __init__(self, tok, stops: tuple[str, ...]):
    self.tok, self.stops = tok, stops
    self.ids: list[int] = []
    self.shown = ""

  def add(self, ids: list[int], last: bool) -> tuple[str, bool]:
    """(the text to show now, after what was shown; whether a stop string ended it)."""
    self.ids += ids
    text = self.tok.decode(self.ids) if self.ids else ""
    hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
    stopped = bool(hits)
    if stopped:
      text = text[:min(hits)]
    elif not last:
      text = text.rstrip("\ufffd")
      held = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
      text = text[:len(text) - held]
    if not text.startswith(self.shown):  # a decode that changed what was shown: wait for more
      return "", stopped
    new, self.shown = text[len(self.shown):], text
    return new, stopped


@dataclasses.dataclass
class Choice:
  row: Row
  text: Text
  tokens: int = 0  # tokens made, an ending token included
  finish: str | None = None


class Flight:
  """The rows of one request (a choice each), queued with `start`."""

  def __init__(self, scheduler: Scheduler, tok, rows: list[Row], stops: tuple[str, ...]):
    self.scheduler = scheduler
    self.loop = asyncio.get_running_loop()
    self.queue: asyncio.Queue = asyncio.Queue()
    self.choices = []
    for i, row in enumerate(rows):
      row.deliver = self._deliverer(i)
      self.choices.append(Choice(row, Text(tok, stops)))

  def _deliverer(self, i: int):
    def deliver(tokens: list[int], finish: str | None) -> None:  # on the scheduler's thread
      try:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, tokens, finish))
      except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass
    return deliver

  def start(self) -> None:
    """Queues the rows (scheduler.Full or Closed where it cannot)."""
    self.scheduler.submit([c.row for c in self.choices])

  def cancel(self) -> None:
    self.scheduler.cancel([c.row for c in self.choices if c.finish is None])

  @property
  def done(self) -> bool:
    return all(c.finish is not None for c in self.choices)

  async def events(self, wait_s: float | None = None) -> AsyncIterator[tuple[int, str, str | None]]:
    """(choice, its new text, None or its finish reason: "stop", "length" or "error: ...") until
    every choice has finished; with `wait_s`, also (-1, "", None) after each `wait_s` without news
    (a moment to look whether the client is still there)."""
    while not self.done:
      try:
        i, tokens, finish = await asyncio.wait_for(self.queue.get(), wait_s)
      except TimeoutError:
        yield -1, "", None
        continue
      c = self.choices[i]
      if c.finish is not None:
        continue  # a row's last advance after a stop string ended it
      c.tokens += len(tokens) + (finish == "stop")
      new, stopped = c.text.add(tokens, last=finish is not None)
      if stopped:
        finish = "stop"
        self.scheduler.cancel([c.row])
      c.finish = finish
      yield i, new, finish
