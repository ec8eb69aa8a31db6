"""What can watch a run from outside the loop: a `Hook` sees the run start (`RunView`), each record
the loop writes, and the run end (`RunResult`), and may ask it to stop. metrics.jsonl, TensorBoard
and the run's status file are hooks every run has (standard.py); `run(cfg, hooks=[...])` adds
more. The loop calls them through `Hooks`, in order."""

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from jaxtrain.core.programs import Programs
from jaxtrain.core.steps import TrainState
from jaxtrain.system import runtime
from jaxtrain.system.console import Console


@dataclasses.dataclass(frozen=True)
class RunView:
  """What a hook sees of the run it watches, as a leg starts."""

  cfg: ml_collections.ConfigDict  # the run's config (a time budget's steps: RunResult.max_steps)
  workdir: Path
  out: Console  # `out.print(line)`: a line on the run's console (process 0)
  programs: Programs  # what the run compiled: its model config, optimizer, abstract state
  t_start: float = 0.0  # when this leg's command started (time.time()): its start-up counts


@dataclasses.dataclass
class RunResult:
  """How a run ended (`jt.run`'s result)."""

  workdir: str
  step: int
  train_loss: float | None
  val_loss: float | None
  tokens_per_sec: float | None
  wall_s: float
  samples: list[str]
  stopped_by: str | None = None  # "SIGTERM", "SIGINT" or "SIGPIPE" when a signal ended it early
  exit_code: int = 0  # the command's: 128 + the signal's number where one stopped it (130, 141, 143)
  max_steps: int | None = None  # the run's last step: train.max_steps, or a time budget's end
  end_left: bool = False  # stopped at its last step before its last evaluation: a restart makes it
  # Seconds this leg spent compiling before its first step (with a time budget, measuring too):
  # time a budget does not train, which a compile cached by an earlier run saves.
  compile_s: float | None = None


class Hook:
  """Attach to a run (`run(cfg, hooks=[...])`): sees each record the loop writes, may stop it.

  Hooks run on every process; one that writes files checks `jax.process_index() == 0` itself.
  """

  def prepare(self) -> None:
    """Once, before `on_start`, in a thread beside the run's first compile: the place to import
    what the hook needs (some libraries take seconds), so the first step does not wait for it.
    An error here is ignored: `on_start` meets it again and reports it."""

  def on_start(self, run: RunView, step: int) -> None:
    """Before the first step of this leg: `run` is what setup prepared, `step` where training
    starts (0, or the step a resume restored)."""

  def on_step(self, step: int, state: TrainState) -> None:
    """After each optimizer step is queued (`step` steps done; its work may still be running on
    the device: `jax.block_until_ready(state)` waits for it)."""

  def on_log(self, step: int, record: dict) -> None:
    """A logged step's record (its metrics.jsonl line): loss, lr, grad_norm, speed, memory."""

  def on_eval(self, step: int, record: dict) -> None:
    """An evaluation's record: val_loss, val_ppl, val_bpb, per-source and task scores."""

  def stop_reason(self) -> str | None:
    """A reason to end the run after this step (it then saves and finishes), or None. Asked
    after each step; the processes of a multi-process run stop when any of theirs asks."""
    return None

  def on_end(self, result: RunResult | None) -> None:
    """When the run ends: `result` is how it ended, or None when it failed with an error. Also
    called for a run that failed before `on_start`."""


class Hooks:
  """A run's hooks, each called in turn: what the loop calls."""

  def __init__(self, hooks: Sequence[Hook]):
    self.hooks = list(hooks)

  def prepare(self) -> None:
    for hook in self.hooks:
      with contextlib.suppress(Exception):  # on_start, on the loop's thread, reports it
        hook.prepare()

  def start(self, run: RunView, step: int) -> None:
    for hook in self.hooks:
      hook.on_start(run, step)

  def step(self, step: int, state: TrainState) -> None:
    for hook in self.hooks:
      hook.on_step(step, state)

  def log(self, step: int, record: dict) -> None:
    for hook in self.hooks:
      hook.on_log(step, record)

  def eval(self, step: int, record: dict) -> None:
    for hook in self.hooks:
      hook.on_eval(step, record)

  def stop_reason(self) -> str | None:
    """The first hook's reason to stop; every process stops if any process's hooks ask (a
    collective: every process asks at the same step)."""
    reason = next((reason for h in self.hooks if (reason := h.stop_reason())), None)
    if runtime.any_process(reason is not None):
      return reason or "a hook on another process asked to stop"
    return None

  def end(self, result: RunResult | None) -> None:
    """Every hook's `on_end`. While an error is already on its way out (result None), a hook that
    fails too must not hide it."""
    for hook in self.hooks:
      try:
        hook.on_end(result)
      except Exception:
        if result is not None:
          raise
