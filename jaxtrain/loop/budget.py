"""`train.time_budget`: train for a given wall time rather than a step count.

A new run measures itself (`fit`) once its programs are compiled as the run runs them
(loop/warmup.py): a few steps on random tokens (their values do not change the speed), an
evaluation and a save. It then fixes its end (the `Plan`, every run's one owner of its end) so
that the budget, counted from the start of the process, holds the steps, their evaluations and
saves, and the run's end. The train step reads the schedule's end as an input
(`TrainState.schedule`), so the compile measured is the run's own and nothing compiles after the
plan is made.

A probe of seconds misjudges a loop of minutes (evaluations, saves, a machine whose speed
changes), so the first leg measures its pace again (`Pace`, the loop's) at REFIT_AT of its steps
and takes the new end where it moves by more than TOLERANCE (`new_end`): what is left of the
schedule is warped onto the steps now left (`schedule_at`), so the learning rate decays smoothly
instead of jumping. The ends are recorded in budget.json; a resumed leg follows them, as the
uninterrupted run did.
"""

import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.config import extensions
from jaxtrain.core import optim
from jaxtrain.core.steps import TrainState
from jaxtrain.system import fmt, machine, paths, runtime
from jaxtrain.system.errors import ConfigError

PLAN_FILE = "budget.json"
REFIT_AT = (0.3, 0.5, 0.7, 0.85, 0.95)  # fractions of the steps where the first leg re-plans
TOLERANCE = 0.02  # a new end within 2% of the planned one is not worth a change of schedule
END_S = 0.7  # after the last evaluation, save and samples: files, the loss plot, the exit


@dataclasses.dataclass
class Costs:
  """What a run's parts cost, measured on its compiled programs."""

  step_s: float  # one optimizer step, its batches read and placed, its metrics read back
  eval_s: float  # one evaluation: train.eval_steps batches of the eval step
  save_s: float  # what a checkpoint save holds the loop (the write goes on in the background)
  last_save_s: float  # the last save, waited for until it is written
  sample_s: float = 0.0  # the samples at the end

  def close_s(self) -> float:
    """After the last step: its evaluation, its save written, the samples, the closing work."""
    return self.eval_s + self.last_save_s + self.sample_s + END_S


def measure(programs, state: TrainState, batches: Iterator[dict], grad_accum: int, eval_steps: int
            ) -> Costs:
  """The `Costs` of `programs` (compiled) as the loop runs them, from `state` (a new one, used
  up): host batches read, placed and stepped, metrics read back, an evaluation and saves. For a
  small model that host work is most of a step."""
  def one() -> None:
    nonlocal state
    for _ in range(grad_accum):
      state, m = programs.train_step(state, programs.place(next(batches)))
    jax.device_get(m)

  step_s = machine.seconds(one, for_s=1.0, at_most=20)
  batch = programs.place(next(batches))
  eval_s = machine.seconds(lambda: jax.device_get(programs.eval_step(state, batch)), untimed=0,
                           pick=min)
  # What a save holds the loop (the copy and checksums, the write being async) and what it takes
  # until written: the second of two saves, the first having compiled the checksums.
  with tempfile.TemporaryDirectory(prefix="jaxtrain-probe-") as tmp:
    ckpts = Checkpoints(tmp, keep=1)
    try:
      for step in (1, 2):
        t = time.perf_counter()
        ckpts.save(state.replace(step=step))
        held = time.perf_counter() - t
    finally:
      ckpts.close()
      written = time.perf_counter() - t
  return Costs(step_s, eval_steps * eval_s, held, written)


def fit_steps(left_s: float, costs: Costs, train) -> int:
  """The optimizer steps that `left_s` seconds hold after the end of the run, each with its
  share of the evaluations (every `train.eval_every` steps) and of the saves; 0 if none does."""
  per_step = (costs.step_s + costs.eval_s / train.eval_every
              + costs.save_s / train.checkpoint_every)
  return max(0, int((left_s - costs.close_s()) / per_step))


def check_left(cfg: ml_collections.ConfigDict, budget_s: float, spent_s: float,
               compiled: bool = False) -> None:
  """Before anything is compiled, and again once it is: a budget used up already is an error
  (the compiles, cached, make a rerun start faster)."""
  if spent_s >= budget_s:
    what = "starting up and compiling" if compiled else "starting up, before any compile,"
    raise ConfigError("train.time_budget", f"{cfg.train.time_budget} is too short: {what} took "
                      f"{fmt.duration(spent_s)} already",
                      "pass a longer one" + (" (a rerun starts faster: the compiles are cached)"
                                             if compiled else ""))


@dataclasses.dataclass(frozen=True)
class Plan:
  """The run's end, its one owner: from each step on, the `train.max_steps` the schedule decays
  to (`ends`, ascending by step). With a time budget (`budget_s`), the leg that measured the run
  (`moves`) may move it as the loop's pace shows (`new_end`); a resumed leg follows the recorded
  ends."""

  ends: tuple[tuple[int, int], ...]  # (from_step, max_steps)
  budget_s: float | None = None
  close_s: float = 0.0  # after the last step: its evaluation and save, samples, closing work
  moves: bool = False

  @property
  def final(self) -> int:
    return self.ends[-1][1]

  def moved(self, step: int, end: int) -> "Plan":
    return dataclasses.replace(self, ends=(*self.ends, (step, end)))


@dataclasses.dataclass
class Pace:
  """The loop's own measure of its pace, in the leg that may move the end (Progress.pace)."""

  checked: int = 0  # how many of REFIT_AT it has measured at
  t_first: float | None = None  # when the leg's first step ended, and its number
  first_step: int = 0
  step_s: float = 0.0  # seconds per step, as last measured


def with_end(cfg: ml_collections.ConfigDict, max_steps: int) -> ml_collections.ConfigDict:
  cfg = cfg.copy_and_resolve_references()
  cfg.train.max_steps = max_steps
  return cfg


def record(plan: Plan, workdir: Path, cfg: ml_collections.ConfigDict) -> None:
  """A moved end on disk (process 0): budget.json's ends, config.json's train.max_steps."""
  if jax.process_index() == 0:
    paths.write_json(workdir / PLAN_FILE, {"budget_s": plan.budget_s, "ends": plan.ends})
    paths.write_json(workdir / "config.json", extensions.saved_config(with_end(cfg, plan.final)))


def recorded(budget_s: float, workdir: Path) -> Plan:
  """A resumed run's plan: the ends its first leg chose."""
  saved = paths.read_json(workdir / PLAN_FILE) if (workdir / PLAN_FILE).exists() else None
  max_steps = int(paths.read_json(workdir / "config.json")["train"]["max_steps"])
  ends = saved["ends"] if saved else [[0, max_steps]]
  return Plan(tuple((int(start), int(end)) for start, end in ends), budget_s)


def fit(cfg: ml_collections.ConfigDict, budget_s: float, ready, log: Callable[[str], None],
        spent: Callable[[], float], batches: Callable[[], Iterator[dict]]) -> Plan:
  """A new run's plan: the steps that fit, measured on `ready` (warmup.Ready: the programs
  compiled, a new state beside them, the samples' cost). Every process takes process 0's."""
  t = cfg.train
  costs = measure(ready.programs, ready.beside, batches(), t.grad_accum, t.eval_steps)
  costs.sample_s = ready.sample_s
  spent_s = spent()
  steps = runtime.from_process_0(fit_steps(budget_s - spent_s, costs, t))
  if steps < 1:  # what the budget would take, in one line
    need = spent_s + costs.step_s + costs.close_s()
    raise ConfigError(
        "train.time_budget", f"{cfg.train.time_budget} is too short for this run: it needs at "
        f"least {fmt.duration(need)} ({fmt.duration(spent_s)} to start and compile, "
        f"{costs.step_s * 1e3:.0f} ms a step, {fmt.duration(costs.close_s())} to evaluate, save "
        f"and sample at the end)", f"pass --config.train.time_budget={int(need * 1.2) + 1}s or "
        "more (a rerun starts faster: the compiles are cached)")
  log(f"time budget {fmt.duration(budget_s)}: train.max_steps={steps} fit "
      f"({costs.step_s * 1e3:.1f} ms/step, {costs.eval_s:.2f}s/eval, {costs.save_s * 1e3:.0f} "
      f"ms/save measured; {fmt.duration(costs.close_s())} to end the run; "
      f"{fmt.duration(spent_s)} spent so far, compiles included)")
  return Plan(((0, steps),), budget_s, costs.close_s(), moves=True)


def new_end(plan: Plan, pace: Pace, step: int, now: float, spent_s: float) -> int | None:
  """At the leg's next REFIT_AT point: the end its measured pace (the steps since its first,
  evaluations, saves and logging included) gives, if it moves the end by more than TOLERANCE.
  `spent_s`: seconds of the budget used so far."""
  if not plan.moves or pace.checked >= len(REFIT_AT):
    return None
  if pace.t_first is None:
    pace.t_first, pace.first_step = now, step
    return None
  if step < REFIT_AT[pace.checked] * plan.final or step <= pace.first_step:
    return None
  pace.checked += 1
  pace.step_s = (now - pace.t_first) / (step - pace.first_step)
  left_s = plan.budget_s - spent_s - plan.close_s
  end = step + max(1, int(left_s / pace.step_s))
  end = runtime.from_process_0(end)  # every process switches at the same step, to the same end
  return end if abs(end - plan.final) > TOLERANCE * plan.final else None


def schedule_at(ends: Sequence[Sequence[int]], step: int, optimizer: optim.Optimizer) -> np.ndarray:
  """The schedule's numbers (optim.schedule_args) at `step`: the first end's schedule, with each
  later end that took over by `step` warping the step onto it. An end that takes over at step s
  maps its steps s..end onto s..(the end before it), so the schedule goes on from where it was
  and reaches its own end (fully decayed) at the new end; each warp is a straight line, and so is
  every composition of them: offset + rate * step."""
  offset, rate, before = 0.0, 1.0, ends[0][1]
  for start, end in ends[1:]:
    if start > step:
      break
    at = offset + rate * start  # where on the first end's schedule the new end takes over
    rate *= (before - start) / (end - start)
    offset, before = at - rate * start, end
  return optim.schedule_args(optimizer, ends[0][1], offset, rate)


def on_schedule(plan: Plan, step: int, state: TrainState) -> TrainState:
  """`state` following the plan's schedule at `step`: where a leg starts, and where an end takes
  over."""
  return state.replace(schedule=schedule_at(plan.ends, step, state.optimizer))
