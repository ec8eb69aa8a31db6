"""The training batches, already on the devices: while the device runs one step, the next
micro-batches are read and copied over, so a step never waits for its input. A checkpoint saves
the position of the batches the loop took, not of those read ahead, so a resumed run sees
exactly the batches an uninterrupted one would."""

import collections
from collections.abc import Callable

import grain


class DeviceFeed(grain.DatasetIterator):
  """Micro-batches placed on the devices `depth` ahead of the loop (`next(feed)` takes one,
  `fill()` reads and places the next ones: call it once the step that uses one is queued).
  A grain iterator itself, so checkpoints save its position as they save any grain iterator's."""

  def __init__(self, iterator: grain.DatasetIterator, place: Callable[[dict], dict],
               depth: int = 2):
    super().__init__(iterator)
    self.iterator, self.place, self.depth = iterator, place, depth
    self._ahead: collections.deque[tuple[dict, dict]] = collections.deque()  # (position, batch)

  def __next__(self) -> dict:
    if not self._ahead:
      self._read_one()
    return self._ahead.popleft()[1]

  def fill(self) -> None:
    while len(self._ahead) < self.depth:
      self._read_one()

  def _read_one(self) -> None:
    position = self.iterator.get_state()
    self._ahead.append((position, self.place(next(self.iterator))))

  def get_state(self) -> dict:
    """The data position of the next batch the loop takes (what a checkpoint saves)."""
    return self._ahead[0][0] if self._ahead else self.iterator.get_state()

  def set_state(self, state: dict) -> None:
    self._ahead.clear()
    self.iterator.set_state(state)
