"""`train.profile_steps`: a jax.profiler trace of that many steps into workdir/profile/.

The trace starts once the first step of the run (or of a resumed leg) has compiled and run, so it
shows steady-state steps, and stops after the last traced step's work is done on the device, or
after the run's last step where that comes first (the end's evaluation, samples and saves would
fill the trace, and the profiler's Python tracer takes seconds to write them). It
holds an XSpace file (`plugins/profile/<time>/<host>.xplane.pb`, for TensorBoard's profile plugin:
`tensorboard --logdir workdir/profile`) and a Perfetto trace (`perfetto_trace.json.gz`, for
https://ui.perfetto.dev). Only process 0 traces.
"""

from pathlib import Path

import jax

from jaxtrain.core.steps import TrainState
from jaxtrain.trackers.hooks import Hook, RunResult, RunView


class Profile(Hook):

  def __init__(self, steps: int, directory: Path):
    self.steps, self.directory = steps, directory
    self.start_after = -1
    self.last: int | None = None  # the run's last step, where known before it ends
    self.tracing = False
    self.say = print

  def on_start(self, run: RunView, step: int) -> None:
    self.start_after = step + 1  # the leg's first step, which compiled
    t = run.cfg.train
    self.last = None if t.time_budget else int(t.max_steps)  # a budget moves its last step
    self.say = run.out.print

  def on_step(self, step: int, state: TrainState) -> None:
    if step == self.start_after:
      jax.block_until_ready(state)
      jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
      self.tracing = True
    elif self.tracing and step in (self.start_after + self.steps, self.last):
      jax.block_until_ready(state)
      self._stop(f"steps {self.start_after + 1}-{step}")

  def on_end(self, result: RunResult | None) -> None:
    if self.tracing:  # the run ended before the last step to trace
      self._stop("the steps before the run ended")

  def _stop(self, what: str) -> None:
    jax.profiler.stop_trace()
    self.tracing = False
    self.say(f"profile of {what}: {self.directory} (tensorboard --logdir {self.directory}, or "
             "perfetto_trace.json.gz in https://ui.perfetto.dev)")
