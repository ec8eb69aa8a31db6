"""The train steps' metrics: left on the device as the steps are queued, and copied back only for
the steps that log, where each step's loss and gradient norm are checked for non-finite values."""

import collections
import math
from collections.abc import Callable

import jax
import numpy as np

from jaxtrain.core import stats as stats_lib
from jaxtrain.system import runtime
from jaxtrain.system.errors import NonFiniteLoss


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


class Pending:
  """The metrics of the steps not read back yet, oldest first, and those of micro-batches still
  queued on the device (at most MAX_IN_FLIGHT: `queued` waits for the oldest). `read` copies them
  back, checks each step with the guard, and keeps the last step's loss and learning rate."""

  def __init__(self, guard: NonFiniteGuard):
    self.guard = guard
    self.steps: list[tuple[int, list[dict]]] = []  # (step, its micro-batches' metrics)
    self.in_flight = collections.deque(maxlen=runtime.MAX_IN_FLIGHT + 1)
    self.last_loss: float | None = None
    self.last_lr: float | None = None

  def queued(self, metrics: dict) -> None:  # a micro-batch's step was just dispatched
    self.in_flight.append(metrics)
    runtime.throttle(self.in_flight)

  def read(self, say: Callable[[str], None], upto: int | None = None,
           stats: dict | None = None) -> float | None:
    """Reads the steps up to `upto` (default: all), waiting for them, and checks each for
    non-finite values (a note goes to `say`); returns the last one's gradient norm. Its per-group
    statistics are copied from the device only when asked (into `stats`)."""
    n = sum(1 for step, _ in self.steps if upto is None or step <= upto)
    if n == 0:
      return None
    due, self.steps = self.steps[:n], self.steps[n:]
    keep = lambda k, last: not stats_lib.is_stat(k) or (last and stats is not None)  # noqa: E731
    host = jax.device_get([[{k: v for k, v in m.items() if keep(k, i == n - 1)} for m in micro]
                           for i, (_, micro) in enumerate(due)])
    for (step, _), micro_host in zip(due, host):
      loss, grad_norm, note = self.guard.check(step, micro_host)
      if note:
        say(note)
    if stats is not None:
      stats.update(stats_lib.combine(host[-1]))
    self.last_loss, self.last_lr = loss, float(host[-1][-1]["lr"])
    return grad_norm
