"""The training loop: setup, restore or init, steps, finish. Side effects live here and in the
modules it calls (files, console, checkpoints, signals); the steps themselves are pure.

Per optimizer step: `grad_accum` micro-batches through the compiled train step, each on a batch
already placed on the devices (loop/feed.py). Metrics stay on the device except on the steps
that log, and a logged step's are read once the next step is queued, so the device never waits.
Evaluation and checkpoints each say when they are due (evals/validation.py,
checkpoints/lifecycle.py); a time budget's plan gives the loop its end (loop/budget.py). Hooks
(trackers/) see every logged and evaluated record and can end a run, without changes to the loop.
"""

import time
from collections.abc import Collection
from pathlib import Path

import jax
import ml_collections

from jaxtrain.checkpoints import init_from
from jaxtrain.config import validate
from jaxtrain.core import cpu
from jaxtrain.core.steps import TrainState
from jaxtrain.loop import autosize, budget, ending, setup
from jaxtrain.loop.state import Progress, Run
from jaxtrain.measure import summary
from jaxtrain.system import runtime, signals
from jaxtrain.system.errors import UserError
from jaxtrain.system.lock import WorkdirLock
from jaxtrain.trackers.hooks import Hook, RunResult


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
  t_start = time.time() - (budget.process_age_s() if library_log else 0.0)
  workdir = Path(str(cfg.workdir)).expanduser()
  try:
    existed = workdir.exists()
    fresh = not existed or (workdir.is_dir() and not any(workdir.iterdir()))
  except (OSError, ValueError):  # a name the file system refuses: validation names it below
    existed, fresh = True, False
  r, lock, result, started = None, WorkdirLock(), None, False  # the lock: taken in setup
  try:
    validate.validate(cfg)
    cfg, taken = init_from.resolve(cfg, explicit)
    validate.validate(cfg)
    say = print if show_progress else lambda line: None
    cfg, chosen = autosize.resolve(cfg, explicit, say=say, t_start=t_start)  # before jax starts
    for line in chosen:
      say(line)
    split = cpu.split_cpu(cfg)  # before jax starts its backends
    platform = runtime.setup(cfg)
    r = setup.prepare(cfg, platform, show_progress, hooks, t_start, library_log, lock)
    if split:
      r.out.print(split)
    if taken:
      r.out.print(f"init_from: from {cfg.init_from}, {', '.join(taken)}")
    if cfg.train.time_budget and "train.max_steps" in explicit:
      r.out.print(f"note: train.time_budget={cfg.train.time_budget} sets the steps; the given "
                  "train.max_steps is not used (--config.train.time_budget=\"\" trains it)")
    if r.log is not None:
      r.log.start()
    try:
      state, elapsed_before = setup.start(r)
      started = True
      result = _train(r, state, elapsed_before)
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM (signals.Terminated) outside the loop
      result = ending.interrupted(e, r, r.workdir, t_start)
    finally:
      r.saving.close()  # a save that was going well still completes, also on error
      r.hooks.end(result)
      lock.release()  # after the run's last write
    if not started:
      ending.remove_stub(workdir, existed, fresh and lock.was_held, r)
    if r.log is not None and r.log.errors:
      r.out.print(f"note: the libraries logged {r.log.errors} error(s); see {r.log.path}")
    return result
  except KeyboardInterrupt as e:  # while setting up: before the run has a Run
    lock.release()
    ending.remove_stub(workdir, existed, fresh and lock.was_held, r)
    return ending.interrupted(e, None, workdir, t_start)
  except BaseException as e:
    lock.release()  # first: it removes its file, which the emptiness check below must not see
    if r is not None and r.log is not None and r.log.errors:
      e.add_note(f"the libraries' own messages are in {r.log.path}")
    if isinstance(e, UserError) and not started:
      ending.remove_stub(workdir, existed, fresh and lock.was_held, r)
    raise


def _train(r: Run, state: TrainState, elapsed_before: float) -> RunResult:
  """This leg, from `state` to the run's end (or a stop)."""
  if int(state.step) >= r.cfg.train.max_steps:
    return ending.already_done(r, int(state.step))
  signals.check()
  p = setup.progress(r, state, elapsed_before)
  r.hooks.start(r.view(), p.step)
  return _loop(r, p, state)


def _loop(r: Run, p: Progress, state: TrainState) -> RunResult:
  signal_stop = hook_stop = None
  with signals.GracefulStop() as stop, r.saving.peers_watched(lambda: p.step):
    _open(r, p, stop)
    while p.step < p.end:
      if r.plan is not None:  # the schedule's end from this step on
        state = _follow_plan(r, p, state)
      state = _step(r, p, state)
      r.hooks.step(p.step, state)
      if p.log_due is not None:  # the step before this one, now that this one is queued
        _log(r, p, p.log_due)
      signal_stop = _signalled(stop, p.step)
      evaluating = p.val.should_eval(p.step, p.end)
      if evaluating or r.saving.should_save(p.step, p.end, stopping=bool(signal_stop)):
        _log(r, p, p.step)
      elif p.step % r.cfg.train.log_every == 0:  # logged once the next step is queued
        p.log_due = p.step
      new_best = evaluating and r.saving.best.update(_evaluate(r, p, state))
      hook_stop = None if signal_stop else r.hooks.stop_reason()
      if hook_stop and p.pending.steps:  # the run's last step gets its line too
        _log(r, p, p.step)
      stopping = bool(signal_stop or hook_stop)
      saving = r.saving.should_save(p.step, p.end, new_best=new_best, stopping=stopping)
      if saving:
        _save(r, p, state, evaluating, stop, stopping)
      if stopping:
        break
      if evaluating or saving:
        p.meter.skip_time(time.perf_counter())  # eval and save time is not training time
    p.pending.read(r.out.print)
    r.out.close()
    with stop.saving_now(), p.timeline.timing("checkpoints"):
      r.saving.finish(p.step)
  return _end(r, p, state, signal_stop, hook_stop)


def _open(r: Run, p: Progress, stop: signals.GracefulStop) -> None:
  """The leg's training begins: a closed stdout (SIGPIPE) stops it as a signal would."""
  r.phase, r.out.on_closed = "training", lambda: stop.request("SIGPIPE")
  if r.out.closed:
    stop.request("SIGPIPE")
  r.out.start(p.end, p.step)


def _signalled(stop: signals.GracefulStop, step: int) -> str | None:
  """The signal every process stops on at this step: one the loop caught, or one jax's
  preemption notifier caught before the loop began (multi-process runs). A collective."""
  if runtime.any_process(stop.requested is not None) or runtime.preempted(step):
    return stop.requested or "SIGTERM"
  return None


def _follow_plan(r: Run, p: Progress, state: TrainState) -> TrainState:
  """train.time_budget: the loop's end is the plan's (the pace may move it), and the state follows
  the plan's schedule from this step on."""
  end = budget.moved_end(r.plan, p.step, r.workdir)
  if end is not None:
    p.end = p.meter.max_steps = end
    ending.record_end(r, end)
    r.out.print(f"time budget: train.max_steps={end} from step {p.step} (the loop's pace, "
                f"{r.plan.pace_s * 1e3:.1f} ms/step, moved the end; the schedule decays to it "
                "from where it is)")
  return budget.on_schedule(r.plan, p.step, state)


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
  p.pending.add(p.step, micro)
  return state


def _log(r: Run, p: Progress, step: int) -> None:
  """The line and records of step `step` (this step, or the one before it)."""
  stats = {}
  grad_norm = p.pending.read(r.out.print, step, stats)
  p.log_due = None
  speed = p.meter.read(step, time.perf_counter())
  if speed is not None and not p.speed_said:
    p.speed_said = True
    r.out.print(summary.speed_line(speed, r.programs.model_cfg.dtype, p.end - step))
  loss, lr, elapsed = p.pending.last_loss, p.pending.last_lr, p.elapsed()
  mem, mem_text, mem_warning = p.mem_watch.read()
  r.out.progress(step, p.end, loss, lr, speed.tokens_per_sec if speed else 0.0, elapsed,
                 speed.eta_s if speed else 0.0, mem_text, p.last_val)
  if mem_warning:
    r.out.print(mem_warning)
  r.saving.check(step)  # a background write that failed is reported now
  r.hooks.log(step, {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                     "tokens_per_sec": speed.tokens_per_sec if speed else None,
                     "mfu": speed.mfu if speed else None, "elapsed_s": round(elapsed, 3), **mem,
                     **stats})


def _evaluate(r: Run, p: Progress, state: TrainState) -> float:
  """The evaluation of this step, to its hooks; returns its val loss."""
  with p.timeline.timing("eval"):
    record = p.val.evaluate(r.programs, state, p.step, p.elapsed, r.out.print)
  p.last_val = record["val_loss"]
  r.hooks.eval(p.step, record)
  return p.last_val


def _save(r: Run, p: Progress, state: TrainState, evaluated: bool, stop: signals.GracefulStop,
          last: bool) -> None:
  """A checkpoint of this step (with its val loss where it was evaluated); waited for when it is
  the run's last."""
  with stop.saving_now(), p.timeline.timing("checkpoints"):
    r.saving.save(state, r.feed, p.last_val if evaluated else None, p.elapsed())
    if last:
      r.saving.finish(p.step)


def _end(r: Run, p: Progress, state: TrainState, signal_stop: str | None,
         hook_stop: str | None) -> RunResult:
  speed = p.meter.last.tokens_per_sec if p.meter.last else None
  if signal_stop:
    return ending.stopped(r, p, signal_stop, speed)
  if hook_stop:
    r.out.print(f"stopped at step {p.step}: {hook_stop}")
  return ending.finish(r, p, state, speed)
