"""What a run says of itself at its end: the best val loss and its step, the tokens seen
(`closing`), and where the time of this start went (`Timeline`)."""

import contextlib
import math
import time

from jaxtrain.system import fmt


class Timeline:
  """Where a start of a run spends its wall time: seconds per phase, added as each ends. The
  training steps are the rest, so the parts add up to the wall time."""

  PHASES = ("start-up", "compile", "train", "eval", "checkpoints", "samples", "loss plot")

  def __init__(self):
    self.seconds = dict.fromkeys(self.PHASES, 0.0)

  def add(self, phase: str, seconds: float) -> None:
    self.seconds[phase] += seconds

  @contextlib.contextmanager
  def timing(self, phase: str):
    t = time.perf_counter()
    try:
      yield
    finally:
      self.add(phase, time.perf_counter() - t)

  def line(self, wall: float, resumed: bool) -> str:
    """`time: 1m05s = start-up 3.2s + compile 5.1s + train 50.0s + eval 4.0s + ...`: start-up is
    reading the data and building the programs; compile includes the first step (and init or
    restore); eval and checkpoints include their own compile and the wait for their writes;
    loss plot: what the plot, drawn beside the samples, took past them."""
    parts = dict(self.seconds, train=0.0)
    parts["train"] = max(wall - sum(parts.values()), 0.0)
    shown = " + ".join(f"{name} {fmt.duration(parts[name])}" for name in self.PHASES
                       if parts[name] >= 0.05 or name == "train")
    return f"time{' of this start' if resumed else ''}: {fmt.duration(wall)} = {shown}"


def closing(records: list[dict], step: int, tokens_per_step: int) -> str:
  """`summary: best val loss 2.1567 at step 300 | 614.40k tokens seen (300 steps x 2048)`, from
  metrics.jsonl's records (every start's), for the lines at a run's end."""
  evals = [(r["val_loss"], r["step"]) for r in records if isinstance(r.get("step"), int)
           and isinstance(r.get("val_loss"), int | float) and math.isfinite(r["val_loss"])]
  best = min(evals, default=None)
  return ((f"summary: best val loss {best[0]:.4f} at step {best[1]}" if best else
           "summary: no evaluation") +
          f" | {fmt.count(step * tokens_per_step)} tokens seen ({step} steps x {tokens_per_step})")
