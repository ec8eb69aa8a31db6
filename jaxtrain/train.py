"""The training loop: setup, restore or init, steps, finish. Side effects live here and in the
modules it calls (files, console, checkpoints, signals); the steps themselves are pure.

A run first resolves what it is (loop/resolution.py, as `--dry_run` does), holding its workdir
from the moment it is checked (loop/workdir.py); setup then makes the `Run` and the state to train
from (loop/setup.py). Evaluation and checkpoints each say when they are due (evals/validation.py,
checkpoints/lifecycle.py), and what else a step does is decided once (`_due`); a time budget's
plan gives the loop its end (loop/budget.py). Hooks (trackers/) see every logged and evaluated
record and can end a run, without changes to the loop.
"""

import dataclasses
import time
from collections.abc import Collection

import jax
import ml_collections

from jaxtrain.core.steps import TrainState
from jaxtrain.evals import validation
from jaxtrain.loop import budget, ending, resolution, setup
from jaxtrain.loop.state import Progress, Run
from jaxtrain.loop.workdir import claimed
from jaxtrain.measure import speed as speed_lib
from jaxtrain.system import machine, runtime, signals
from jaxtrain.system.console import Console
from jaxtrain.trackers.hooks import Hook, RunResult, RunView


def run(cfg: ml_collections.ConfigDict, *, show_progress: bool = True,
        hooks: tuple[Hook, ...] = (), library_log: bool = False,
        explicit: Collection[str] = ()) -> RunResult:
  """Trains `cfg` in `cfg.workdir`, resuming from its latest checkpoint if there is one.

  `library_log`: from setup on, the libraries' messages go to workdir/logs/ instead of the
  terminal, until the process exits (for a process that ends with the run: the CLI).
  `explicit`: dotted fields the user set (the CLI's overrides). With `init_from` a jaxtrain run,
  every model field neither in it nor changed from its default takes the source run's value.
  """
  # The CLI's run is its process: its wall time and start-up count from the process's start.
  t_start = time.time() - (machine.process_age_s() if library_log else 0.0)
  with claimed(cfg.workdir, library_log) as claim:
    r = result = None
    phase, max_steps = "preparing the run", None  # what an interrupt outside the loop stops
    try:
      settled = resolution.settle(cfg, explicit, say=print if show_progress else lambda line: None,
                                  t_start=t_start)
      out = Console(enabled=jax.process_index() == 0 and show_progress,
                    headless=settled.cfg.headless)
      r = setup.prepare(resolution.resolve(settled, out, claim.take), out, hooks, t_start)
      if claim.log is not None:
        claim.log.start()
      phase, max_steps = "compiling", r.plan.final
      r, state, elapsed_before, best = setup.start(r)
      claim.started = True
      if int(state.step) >= r.plan.final and not ending.end_left(r.workdir, int(state.step)):
        result = ending.already_done(r, int(state.step))
      else:
        signals.check()
        p = setup.progress(r, state, elapsed_before, best)
        r.hooks.start(RunView(r.cfg, r.workdir, r.out, r.programs, r.t_start), p.step)
        phase = "training"
        result = _loop(r, p, state)
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM (signals.Terminated) outside the loop
      result = ending.interrupted(e, phase, claim.workdir, t_start, max_steps)
    finally:
      if r is not None:
        r.ahead.close()
        r.saving.close()  # a save that was going well still completes, also on error
        r.hooks.end(result)
  return result


@dataclasses.dataclass(frozen=True)
class Due:
  """What a step does once it is trained and evaluated (`_due`); nothing, by default."""

  signal: str | None = None  # the signal every process stops on at this step
  hook: str | None = None  # a hook's reason to stop here
  save: bool = False
  read: bool = False  # its metrics read back and logged now
  log_next: bool = False  # its line once the next step is queued

  @property
  def stop(self) -> bool:
    return bool(self.signal or self.hook)


def _loop(r: Run, p: Progress, state: TrainState) -> RunResult:
  """The leg's steps, from `p.step` (before `p.end`: at least one) to its end or a stop: the result."""
  with signals.GracefulStop() as stop, r.saving.peers_watched(lambda: p.step):
    r.out.on_closed = lambda: stop.request("SIGPIPE")  # a closed stdout stops it as a signal would
    if r.out.closed:
      stop.request("SIGPIPE")
    r.out.start(p.end, p.step)
    due = Due()
    if p.step >= p.end:  # stopped in its last evaluation: this leg makes it, then the samples
      r.out.print(f"step {p.step} is the run's last; making its evaluation, then the samples")
      _validate(r, p, state, stop)
      due = Due(signal=_signalled(stop, p.step))
    while p.step < p.end and not due.stop:
      state, due = _train(r, p, state, stop)
    p.pending.read(r.out.print)
    r.out.close()
    with stop.saving_now(), p.timeline.timing("checkpoints"):
      r.saving.finish(p.step)  # the last checkpoint written whole
  speed = p.meter.last.tokens_per_sec if p.meter.last else None
  if due.signal:
    return ending.stopped(r, p, due.signal, speed)
  if due.hook:
    r.out.print(f"stopped at step {p.step}: {due.hook}")
  return ending.finish(r, p, state, speed)


def _train(r: Run, p: Progress, state: TrainState, stop: signals.GracefulStop
           ) -> tuple[TrainState, Due]:
  """One step of the leg, and what it does besides (`_due`): its log line, evaluation, save."""
  state = _step(r, p, _follow_plan(r, p, state))
  r.hooks.step(p.step, state)
  if p.log_due is not None:  # the step before this one, now that this one is queued
    _log(r, p, p.log_due)
  new_best = None
  if p.val.should_eval(p.step, p.end):
    _log(r, p, p.step)  # its line before its evaluation's, whose time its speed leaves out
    val = _validate(r, p, state, stop)  # None: a signal stopped it (`_due` stops the run)
    new_best = None if val is None else p.best.update(val)
  due = _due(r, p, stop, new_best)
  if due.read:
    _log(r, p, p.step)
  elif due.log_next:
    p.log_due = p.step
  if due.save:
    with stop.saving_now(), p.timeline.timing("checkpoints"):
      r.ahead.wait("checkpoints")
      r.saving.save(state, r.feed, None if new_best is None else p.last_val, p.elapsed(),
                    p.best.value, p.end)
  if not due.stop and (due.save or new_best is not None):
    p.meter.skip_time(time.perf_counter())  # eval and save time is not training time
  return state, due


def _due(r: Run, p: Progress, stop: signals.GracefulStop, new_best: bool | None) -> Due:
  """What step `p.step` does once it is trained and evaluated (`new_best`: None where it was not
  evaluated), decided here once:
  - stop: on a signal every process got, else on a hook's reason (asked after the evaluation,
    which early stopping reads); both are collectives, asked at every step;
  - save: when the checkpoints' timing says (`Saving.should_save`);
  - read: a step that saves reads its metrics first (as one that evaluates did before its
    evaluation), so that the non-finite guard stops the run before a checkpoint of a step whose
    loss was not finite is written, and its line (the run's last, where it stops) comes first;
  - log_next: a step to log that need not be read now is read once the next step is queued, so
    the device never waits for it.
  """
  signal = _signalled(stop, p.step)
  hook = None if signal else r.hooks.stop_reason()
  save = r.saving.should_save(p.step, p.end, new_best=bool(new_best),
                              stopping=bool(signal or hook))
  unread = bool(p.pending.steps)
  return Due(signal, hook, save, read=save and unread,
             log_next=unread and not save and p.step % r.cfg.train.log_every == 0)


def _signalled(stop: signals.GracefulStop, step: int) -> str | None:
  """The signal every process stops on at this step: one the loop caught, or one jax's
  preemption notifier caught before the loop began (multi-process runs). A collective."""
  if runtime.any_process(stop.requested is not None) or runtime.preempted(step):
    return stop.requested or "SIGTERM"
  return None


def _follow_plan(r: Run, p: Progress, state: TrainState) -> TrainState:
  """train.time_budget: the loop's pace may move the run's end (`p.plan`: recorded in budget.json
  and config.json, and in the checkpoints saved next), and the state follows the schedule of an
  end that takes over at this step."""
  end = budget.new_end(p.plan, p.pace, p.step, time.perf_counter(), time.time() - r.t_start)
  if end is not None:
    p.plan = p.plan.moved(p.step, end)
    budget.record(p.plan, r.workdir, r.cfg)
    r.out.print(f"time budget: train.max_steps={end} from step {p.step} (the loop's pace, "
                f"{p.pace.step_s * 1e3:.1f} ms/step, moved the end; the schedule decays to it "
                "from where it is)")
  takes_over = any(start == p.step for start, _ in p.plan.ends[1:])
  return budget.on_schedule(p.plan, p.step, state) if takes_over else state


def _step(r: Run, p: Progress, state: TrainState) -> TrainState:
  """One optimizer step: grad_accum micro-batches queued on the device, each on a batch placed
  ahead of it (the next ones are placed while it runs). Its metrics stay on the device until a
  log line reads them."""
  micro = []
  for _ in range(r.cfg.train.grad_accum):
    state, m = r.programs.train_step(state, next(r.feed))
    micro.append(m)
    r.feed.fill()
    p.pending.queued(m)
  p.step += 1
  if not p.meter.started:
    jax.block_until_ready(micro)
    r.out.print(f"compiled and ran the first step in {time.time() - r.t_compile:.1f}s")
    p.timeline.add("start-up", r.t_compile - r.t_start)
    p.timeline.add("compile", time.time() - r.t_compile)
    p.meter.start(p.step, time.perf_counter())
  p.pending.steps.append((p.step, micro))
  return state


def _log(r: Run, p: Progress, step: int) -> None:
  """The line and records of step `step` (this step, or the one before it)."""
  stats = {}
  grad_norm = p.pending.read(r.out.print, step, stats)
  p.log_due = None
  speed = p.meter.read(step, time.perf_counter())
  if speed is not None and not p.speed_said:
    p.speed_said = True
    r.out.print(speed_lib.first_line(speed, r.programs.model_cfg.dtype, p.end - step))
    r.ahead.start()  # what the run compiles for its end, now that its speed was read
  loss, lr, elapsed = p.pending.last_loss, p.pending.last_lr, p.elapsed()
  mem, mem_text, mem_warning = p.mem_watch.read()
  r.out.progress(step, p.end, loss, lr, speed.tokens_per_sec if speed else None, elapsed,
                 speed.eta_s(p.end - step) if speed else None, mem_text, p.last_val)
  if mem_warning:
    r.out.print(mem_warning)
  r.saving.check(step)  # a background write that failed is reported now
  r.hooks.log(step, {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                     "tokens_per_sec": speed.tokens_per_sec if speed else None,
                     "mfu": speed.mfu if speed else None, "elapsed_s": round(elapsed, 3), **mem,
                     **stats})


def _validate(r: Run, p: Progress, state: TrainState, stop: signals.GracefulStop) -> float | None:
  """The evaluation of this step, to its hooks; returns its val loss, or None where a signal
  stopped it part way (it then has no record)."""
  asked = lambda: runtime.any_process(stop.requested is not None)  # noqa: E731
  with p.timeline.timing("eval"), stop.evaluating_now():
    r.ahead.wait("eval")
    try:
      record = p.val.score(r.programs, state, p.step, p.elapsed, r.out.print, asked)
    except validation.Stopped:
      return None
  p.last_val = record["val_loss"]
  r.hooks.eval(p.step, record)
  return p.last_val
