"""What was measured on this machine, kept between runs (a matmul peak, a probe's timings): each
figure in the cache dir's measured.json under this machine's `key`, with when it was taken and how
busy other processes kept the cores meanwhile (`Measured.load`; docs/cpu-speed.md)."""

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxtrain.system import fmt, machine, paths, stack

FILE = "measured.json"  # in the cache dir
BUSY = 0.25  # other processes' share of this process's cores above which a figure is not reused
AGAIN = "JAXTRAIN_MEASURE_AGAIN"  # =1: every cached figure is measured again (once a process)


def key(*parts) -> str:
  """What a measurement here depends on: the CPU's model, the cores this process may use of
  all, jax and jaxlib (XLA's kernels) and XLA_FLAGS, then the measurement's own `parts`."""
  vendor, family, model, name = machine.cpu_id()
  versions = stack.versions()
  flags = hashlib.sha256(os.environ.get("XLA_FLAGS", "").encode()).hexdigest()[:8]
  base = [vendor, family, model, name, f"{machine.cores()}of{os.cpu_count()}",
          f"jax{versions.get('jax')}", f"jaxlib{versions.get('jaxlib')}", f"xla{flags}"]
  return re.sub(r"\s+", "_", "-".join(map(str, [*base, *parts])))


@dataclasses.dataclass(frozen=True)
class Measured:
  """A figure measured on this machine: by this process (`here`), or read from the cache."""

  value: Any
  time: float  # when it was measured
  load: float | None  # the share of the cores other processes kept busy meanwhile
  here: bool

  def said(self) -> str:
    """Its age, for the line that uses it."""
    if not self.here:
      return f"{fmt.duration(time.time() - self.time)} ago, reused from the cache"
    busy = self.load is not None and self.load > BUSY
    return "just now" + (f", while other processes kept {self.load:.0%} of the cores busy (the "
                         "next run measures again)" if busy else "")


_here: dict[str, Measured] = {}  # what this process measured, by cache key


def measured(what: str, parts: Sequence, measure: Callable[[Any], Any], max_age_s: float = math.inf,
             enough: Callable[[Any], bool] = lambda value: True) -> Measured:
  """The figure for `what` on this machine (`key(*parts)`): this process's, else the cache's
  where it was taken on quiet cores less than `max_age_s` ago, $JAXTRAIN_MEASURE_AGAIN is unset,
  and `enough(value)` holds (a peak no lower than what was just reached); else `measure(that
  cached figure, where it holds but for `enough`, else None)`, with its load, and cached."""
  name = f"{what}:{key(*parts)}"
  mine = _here.get(name)
  if mine is not None and enough(mine.value):
    return mine
  found = cached(what, parts, max_age_s)
  if found is not None and enough(found.value):
    return found
  value, load = machine.with_load(lambda: measure(found.value if found else None))
  _here[name] = found = Measured(value, time.time(), load, here=True)
  file = Path(paths.cache_dir()) / FILE
  cache = paths.read_dict(file)  # read again: another process may have written
  cache[name] = {"value": value, "time": found.time, "load": load}
  with contextlib.suppress(OSError):  # a read-only cache dir only costs the measurement again
    file.parent.mkdir(parents=True, exist_ok=True)
    paths.write_json(file, cache)
  return found


def cached(what: str, parts: Sequence, max_age_s: float = math.inf) -> Measured | None:
  """The figure for `what` as the cache dir holds it, where usable (taken on quiet cores less
  than `max_age_s` ago, $JAXTRAIN_MEASURE_AGAIN unset); else None. Measures nothing."""
  name = f"{what}:{key(*parts)}"
  entry = paths.read_dict(Path(paths.cache_dir()) / FILE).get(name)
  usable = os.environ.get(AGAIN) != "1" and isinstance(entry, dict) and \
      {"value", "time"} <= set(entry) and (entry.get("load") or 0.0) <= BUSY and \
      0 <= time.time() - entry["time"] < max_age_s
  return Measured(entry["value"], entry["time"], entry.get("load"), here=False) if usable else None
