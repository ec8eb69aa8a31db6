"""`train.time_budget`: train for a given wall time rather than a step count.

A new run measures itself first: it compiles its train step and times a few steps on random
tokens (the speed does not depend on their values), then fixes its end (`fit`: the `Plan`) so
that the steps, their evaluations and the end of the run (a second compile, samples) fit the
budget, counted from the start of the process. The schedule (warmup, decay) then spans exactly
those steps, and the chosen number is the run's `train.max_steps` (`with_end`) in config.json.

A probe of a few seconds misjudges a loop that runs for minutes (evaluations, saves, logging, a
machine whose speed changes), so the run's first leg measures its own pace again at REFIT_AT of
its steps; when that moves the end by more than TOLERANCE, the loop takes the new end
(`moved_end`) and its train step is rebuilt for it (`rebuilt`). Each end and the step it took
over at are recorded in budget.json; a resumed leg follows them, so it trains exactly as the
uninterrupted run did.
"""

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import ml_collections

from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.core import programs as programs_lib
from jaxtrain.core.steps import TrainState
from jaxtrain.system import fmt, paths, runtime

PLAN_FILE = "budget.json"
REFIT_AT = (0.3, 0.7)  # fractions of the planned steps where the first leg measures its pace
TOLERANCE = 0.02  # a new end within 2% of the planned one is not worth a compile
EVAL_COST = 0.35  # a forward pass costs about a third of a forward and backward pass
END_S = 2.0  # closing work besides sampling: the loss plot, the last save's wait


def process_age_s() -> float:
  """Seconds since this process started (Linux), else 0: the budget covers the whole command."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError):
    return 0.0


def measure(programs, batches: Iterator[dict], grad_accum: int, min_s: float = 2.0,
            max_steps: int = 20) -> tuple[float, float, float]:
  """(seconds to compile the train step, seconds per optimizer step, seconds a checkpoint save
  holds the loop) of `programs` as the loop runs them: `batches` (host batches, an iterator of
  the run's own kind) read, placed and stepped, each step's metrics read back, and the state
  saved as the loop saves it. For a small model that host work is most of a step."""
  t0 = time.perf_counter()
  step = programs.compile_train()
  compile_s = time.perf_counter() - t0
  state = programs.init()

  def one(state):
    for _ in range(grad_accum):
      state, m = step(state, programs.place(next(batches)))
    jax.device_get(m)
    return state

  state = one(state)  # the first run of a compiled program pays extra
  times, t_end = [], time.perf_counter() + min_s
  while len(times) < 3 or (time.perf_counter() < t_end and len(times) < max_steps):
    t = time.perf_counter()
    state = one(state)
    times.append(time.perf_counter() - t)
  return compile_s, statistics.median(times), _save_s(state)


def _save_s(state) -> float:
  """What one checkpoint save costs the loop (the copy and checksums; the write is async): the
  second of two saves, the first having compiled the checksums."""
  with tempfile.TemporaryDirectory(prefix="jaxtrain-probe-") as tmp:
    ckpts = Checkpoints(tmp, keep=1)
    try:
      took = []
      for step in (1, 2):
        t = time.perf_counter()
        ckpts.save(state.replace(step=step))
        took.append(time.perf_counter() - t)
    finally:
      ckpts.close()
  return took[-1]


def fit_steps(budget_s: float, spent_s: float, compile_s: float, step_s: float, train,
              sample_s: float = 0.0, save_s: float = 0.0) -> int:
  """The optimizer steps that fit what is left of the budget: each step with its share of the
  evaluations (every `train.eval_every` steps, `eval_steps` forward passes of one micro-batch)
  and of the checkpoint saves, then the real train step's compile and the end of the run."""
  left = budget_s - spent_s - compile_s - END_S - sample_s
  eval_per_step = EVAL_COST * train.eval_steps * step_s / train.grad_accum / train.eval_every
  return max(1, int(left / (step_s + eval_per_step + save_s / train.checkpoint_every)))


@dataclasses.dataclass
class Plan:
  """The ends a time-budgeted run's schedule follows: from each step on, the `train.max_steps`
  its learning rate was built for. `spent` is set in the leg that may move the end (a new run's
  first); a resumed leg only follows the recorded ends."""

  budget_s: float
  ends: list[list[int]]  # [from_step, max_steps], ascending by step
  spent: Callable[[], float] | None = None  # seconds of the budget used so far
  close_s: float = 0.0  # after the last step: its evaluation, samples, the closing work
  compile_s: float = 0.0  # a switch's compile, as the leg's first compile took
  checked: int = 0  # how many of REFIT_AT this leg has measured at
  t_first: float | None = None  # when the leg's first step ended, and its number
  first_step: int = 0
  pace_s: float = 0.0  # seconds per step, as last measured

  @property
  def final(self) -> int:
    return self.ends[-1][1]

  def end_at(self, step: int) -> int:
    return [end for start, end in self.ends if start <= step][-1]

  def save(self, workdir: Path) -> None:
    if jax.process_index() == 0:
      paths.write_json(workdir / PLAN_FILE, {"budget_s": self.budget_s, "ends": self.ends})


def with_end(cfg: ml_collections.ConfigDict, max_steps: int) -> ml_collections.ConfigDict:
  """A copy of `cfg` that ends at `max_steps`."""
  cfg = cfg.copy_and_resolve_references()
  cfg.train.max_steps = max_steps
  return cfg


def fit(cfg: ml_collections.ConfigDict, programs: programs_lib.Programs, devices: list,
        workdir: Path, log: Callable[[str], None], spent: Callable[[], float],
        batches: Callable[[], Iterator[dict]]) -> tuple[programs_lib.Programs, Plan]:
  """`train.time_budget`: the plan of the steps that fit (measured by a new run; a resumed run
  keeps the ends its first leg chose), and the programs built for its end."""
  budget_s = fmt.parse_duration(cfg.train.time_budget)
  if paths.is_run(workdir):
    saved = paths.read_json(workdir / PLAN_FILE) if (workdir / PLAN_FILE).exists() else None
    max_steps = int(paths.read_json(workdir / "config.json")["train"]["max_steps"])
    plan = Plan(budget_s, saved["ends"] if saved else [[0, max_steps]])
  else:
    compile_s, step_s, save_s = measure(programs, batches(), cfg.train.grad_accum)
    sample_s = compile_s if cfg.sample.num_samples and cfg.sample.max_new_tokens else 0.0
    spent_s = spent()
    steps = fit_steps(budget_s, spent_s, compile_s, step_s, cfg.train, sample_s, save_s)
    eval_s = EVAL_COST * cfg.train.eval_steps * step_s / cfg.train.grad_accum
    plan = Plan(budget_s, [[0, steps]], spent, close_s=END_S + sample_s + eval_s,
                compile_s=compile_s)
    log(f"time budget {fmt.duration(budget_s)}: train.max_steps={steps} fit "
        f"({step_s * 1e3:.1f} ms/step, {save_s * 1e3:.0f} ms/save and a {compile_s:.1f}s compile "
        f"measured; {fmt.duration(spent_s)} spent so far)")
  m = programs.model_cfg
  return programs_lib.build(with_end(cfg, plan.final), m.vocab_size, devices,
                            eot_id=m.eot_id), plan


def new_end(plan: Plan, step: int, now: float) -> int | None:
  """At the leg's next REFIT_AT point: the end its measured pace (the steps since its first,
  evaluations, saves and logging included) gives, if it moves the end by more than TOLERANCE."""
  if plan.spent is None or plan.checked >= len(REFIT_AT):
    return None
  if plan.t_first is None:
    plan.t_first, plan.first_step = now, step
    return None
  if step < REFIT_AT[plan.checked] * plan.final or step <= plan.first_step:
    return None
  plan.checked += 1
  plan.pace_s = (now - plan.t_first) / (step - plan.first_step)
  left_s = plan.budget_s - plan.spent() - plan.close_s - plan.compile_s
  end = step + max(1, int(left_s / plan.pace_s))
  end = runtime.from_process_0(end)  # every process switches at the same step, to the same end
  return end if abs(end - plan.final) > TOLERANCE * plan.final else None


def moved_end(plan: Plan, step: int, workdir: Path) -> int | None:
  """After each step of the leg that may move the end: the new end its pace gives (`new_end`),
  recorded in the plan and budget.json; None where the end stays."""
  end = new_end(plan, step, time.perf_counter())
  if end is not None:
    plan.ends.append([step, end])
    plan.save(workdir)
  return end


def rebuilt(plan: Plan, step: int, cfg: ml_collections.ConfigDict,
            programs: programs_lib.Programs, state: TrainState,
            eval_batch: dict | None) -> tuple[programs_lib.Programs, TrainState] | None:
  """(programs with the train step compiled for the end the schedule follows from `step` on,
  `state` in their layout) where that end is not the one `programs` were built for (a recorded
  switch, or a new end); None otherwise. `eval_batch`: the eval step compiles now too, rather
  than in the steps whose pace is measured."""
  end = plan.end_at(step)
  if end == programs.optimizer.max_steps:
    return None
  m, t0 = programs.model_cfg, time.perf_counter()
  built = programs_lib.build(with_end(cfg, end), m.vocab_size, jax.devices(), eot_id=m.eot_id)
  built = dataclasses.replace(built, train_step=built.compile_train())
  state = built.abstract.with_arrays(state.arrays())
  if eval_batch is not None:
    jax.block_until_ready(built.eval_step(state, eval_batch))
  plan.compile_s = time.perf_counter() - t0
  if plan.t_first is not None:  # a one-off: the pace is the steps'
    plan.t_first += plan.compile_s
  return built, state
