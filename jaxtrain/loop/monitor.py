"""The small pieces of state a training loop keeps: speed and ETA, the non-finite guard, the best
validation loss. Each is a plain object the loop updates; tests drive them directly."""

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from jaxtrain.system.errors import NonFiniteLoss


@dataclasses.dataclass(frozen=True)
class Speed:
  sec_per_step: float
  tokens_per_sec: float
  flops_per_sec: float
  mfu: float | None  # of `peak`; None when no peak is known
  eta_s: float


class Throughput:
  """Tokens/s, MFU and ETA over the steps since the last reading. Time spent between steps
  (evaluating, saving) is left out by `skip_time`."""

  def __init__(self, tokens_per_step: int, flops_per_token: float, max_steps: int,
               peak: Callable[[float], float | None] = lambda achieved: None):
    self.tokens_per_step, self.flops_per_token, self.max_steps = (tokens_per_step,
                                                                  flops_per_token, max_steps)
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
    self.last = Speed(sec, tokens, flops, flops / self._peak_value if self._peak_value else None,
                      (self.max_steps - step) * sec)
    return self.last


class NonFiniteGuard:
  """Reads a step's micro-batch metrics; a non-finite loss or gradient stops the run unless it
  is dropped (train.skip_nonfinite, or a loss-scaling overflow), and too many dropped in a row
  stop it too."""

  def __init__(self, skip_nonfinite: bool, loss_scaling: bool, max_in_a_row: int = 10):
    self.skip, self.loss_scaling, self.max_in_a_row = skip_nonfinite, loss_scaling, max_in_a_row
    self.in_a_row = 0

  def check(self, step: int, micro: list[dict]) -> tuple[float, float, str | None]:
    """(mean loss, mean gradient norm, a line to print or None) of the step's host metrics."""
    loss = float(np.mean([m["loss"] for m in micro]))
    grad_norm = float(np.mean([m["grad_norm"] for m in micro]))
    if math.isfinite(loss) and math.isfinite(grad_norm):
      self.in_a_row = 0
      return loss, grad_norm, None
    what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}"
    overflow = self.loss_scaling and math.isfinite(loss)  # loss scaling handles it
    if not self.skip and not overflow:
      raise NonFiniteLoss(
          f"{what} at step {step}: stopped, and the last good checkpoint is kept. Likely causes: "
          "too high a learning rate (lower --config.optim.lr or raise optim.warmup_steps) or bad "
          "data; --config.train.skip_nonfinite=True drops such steps instead")
    self.in_a_row += 1
    if overflow:
      note = (f"step {step}: gradients overflowed; step dropped, loss scale now "
              f"{float(micro[-1]['loss_scale']):g}")
    else:
      note = f"step {step}: {what}, update dropped ({int(micro[-1]['skipped'])} dropped so far)"
    if self.in_a_row >= self.max_in_a_row:
      raise NonFiniteLoss(f"{self.in_a_row} steps in a row up to step {step} were non-finite "
                          f"and dropped (the last: {note}); stopped. Lower --config.optim.lr or "
                          "check the data")
    return loss, grad_norm, note


class BestVal:
  """The lowest validation loss so far, and how many evaluations ago it was reached."""

  def __init__(self, best: float = math.inf):
    self.best = best
    self.since = 0

  def update(self, val: float) -> bool:
    """True when `val` is a new best."""
    if val < self.best:
      self.best, self.since = val, 0
      return True
    self.since += 1
    return False

  @property
  def value(self) -> float | None:
    return self.best if self.best < math.inf else None
