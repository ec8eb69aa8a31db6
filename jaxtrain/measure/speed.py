"""How fast a run goes as it trains (`Throughput`: tokens/s, MFU against the devices' peak; the
time left to an end) and the first reading's line (`first_line`)."""

import dataclasses
from collections.abc import Callable

import jax

from jaxtrain.measure import estimate
from jaxtrain.system import fmt


@dataclasses.dataclass(frozen=True)
class Speed:
  sec_per_step: float
  tokens_per_sec: float
  flops_per_sec: float
  mfu: float | None  # of `peak`; None when no peak is known

  def eta_s(self, steps_left: int) -> float:
    return steps_left * self.sec_per_step


class Throughput:
  """Tokens/s and MFU over the steps since the last reading. Time spent between steps
  (evaluating, saving) is left out by `skip_time`."""

  def __init__(self, tokens_per_step: int, flops_per_token: float,
               peak: Callable[[float], float | None] = lambda achieved: None):
    self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
    self._peak, self._peak_value = peak, None
    self._t: float | None = None
    self._step = 0
    self.last: Speed | None = None

  @property
  def started(self) -> bool:
    return self._t is not None

  def start(self, step: int, now: float) -> None:
    self._t, self._step = now, step

  def skip_time(self, now: float) -> None:
    self._t = now

  def read(self, step: int, now: float) -> Speed | None:
    """The speed since the last reading (or start); None when no step was timed yet."""
    if self._t is None or step <= self._step:
      return self.last
    sec = (now - self._t) / (step - self._step)
    self._t, self._step = now, step
    tokens = self.tokens_per_step / sec
    flops = tokens * self.flops_per_token
    if self._peak_value is None:  # measured once, after the first steps, knowing what they ran at
      self._peak_value = self._peak(flops) or 0.0
    self.last = Speed(sec, tokens, flops, flops / self._peak_value if self._peak_value else None)
    return self.last


def first_line(speed: Speed, flops_dtype: str, steps_left: int) -> str:
  """The first speed reading, with the peak its MFU is measured against."""
  _, peak = estimate.peak_flops(jax.devices(), flops_dtype)
  return (f"speed: {fmt.count(speed.tokens_per_sec)} tokens/s, "
          f"{fmt.count(speed.flops_per_sec)}FLOP/s = {speed.mfu or 0:.1%} MFU (of {peak})"
          + (f"; ETA for the remaining {steps_left} steps: {fmt.duration(speed.eta_s(steps_left))}"
             if steps_left > 0 else ""))
