"""The run's state as the loop sees it: what setup prepares (`Run`, fixed: nothing in it changes
after), and what the loop carries from step to step of a leg (`Progress`, changed by the loop
alone: the run's end, its `Plan`, among it)."""

import dataclasses
import time
from pathlib import Path

import ml_collections

from jaxtrain.checkpoints.lifecycle import BestVal, Saving
from jaxtrain.core.programs import Programs
from jaxtrain.data.corpus import Corpus
from jaxtrain.evals.tasks import Task
from jaxtrain.evals.validation import Validation
from jaxtrain.loop.budget import Pace, Plan
from jaxtrain.loop.feed import DeviceFeed
from jaxtrain.loop.step_metrics import Pending
from jaxtrain.loop.warmup import Ahead
from jaxtrain.measure.memory import Watch
from jaxtrain.measure.speed import Throughput
from jaxtrain.measure.summary import Timeline
from jaxtrain.system.console import Console
from jaxtrain.trackers.hooks import Hooks


@dataclasses.dataclass(frozen=True)
class Run:
  """What setup prepares for the loop (loop/setup.py: `prepare`, then `start` with the train step
  compiled); each part gets its own config section from here."""

  cfg: ml_collections.ConfigDict  # as the leg started (its train.max_steps: plan.final)
  out: Console
  workdir: Path
  corpus: Corpus
  programs: Programs
  saving: Saving  # the checkpoints, and when they are written
  feed: DeviceFeed  # this process's rows of each micro-batch, placed ahead
  hooks: Hooks
  t_start: float
  plan: Plan  # the run's end as the leg started (the loop's own: Progress.plan)
  tasks: list[Task] = dataclasses.field(default_factory=list)  # train.eval_tasks' records
  t_compile: float = 0.0  # when compiling began: the first step's line counts from it
  ahead: Ahead = dataclasses.field(default_factory=Ahead)  # compiles once training runs (CPU)


@dataclasses.dataclass
class Progress:
  """What the loop carries from step to step of a leg."""

  step: int
  plan: Plan  # the run's end (the one place it is kept): a time budget's pace may move it
  elapsed_before: float  # training seconds of earlier legs of this run
  t_run: float  # when this leg's training began
  meter: Throughput
  pending: Pending  # metrics of the steps not read back yet
  val: Validation  # what each evaluation scores, and when
  best: BestVal  # the best val loss so far
  pace: Pace = dataclasses.field(default_factory=Pace)  # a time budget's, as the loop measures it
  log_due: int | None = None  # a step whose log line waits for the next step to be queued
  last_val: float | None = None
  speed_said: bool = False  # the first speed reading gets a line of its own
  mem_watch: Watch = dataclasses.field(default_factory=Watch)
  timeline: Timeline = dataclasses.field(default_factory=Timeline)  # where this leg's time goes

  @property
  def end(self) -> int:
    """The loop's train.max_steps."""
    return self.plan.final

  def elapsed(self) -> float:
    return self.elapsed_before + time.time() - self.t_run
