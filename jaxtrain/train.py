"""The training loop: setup, restore or init, steps, finish. Side effects live here and in the
modules it calls (files, console, checkpoints, signals); the steps themselves are pure.

Per optimizer step: `grad_accum` micro-batches through the compiled train step, each on a batch
already placed on the devices (`loop/feed.py`). Metrics stay on the device except on the steps
that log, and a logged step's are read once the next step is queued, so the device never waits. Hooks (`Hook`)
see every logged and evaluated record and can end a run, without changes to the loop.
"""

import collections
import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Collection
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxtrain import __version__
from jaxtrain.checkpoints import init_from
from jaxtrain.checkpoints import lifecycle as saving_lib
from jaxtrain.checkpoints import store as checkpoint
from jaxtrain.config import validate as validation
from jaxtrain.core import cpu, mesh
from jaxtrain.core import programs as programs_lib
from jaxtrain.core.steps import TrainState
from jaxtrain.data import corpus as data
from jaxtrain.data import mixture, tokenfiles
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.loop import (
  budget,
  early_stop,
  ending,
  feed,
  metrics,
  profile,
  progress,
  sources,
  status,
  summary,
  tasks,
  tblog,
  wandb_log,
)
from jaxtrain.loop import hooks as hooks_lib
from jaxtrain.loop.console import Console, LibraryLog
from jaxtrain.loop.ending import RunResult  # noqa: F401 - jt.RunResult lives here too
from jaxtrain.loop.hooks import Hook
from jaxtrain.system import allocator, paths, runtime, signals
from jaxtrain.system.errors import UserError
from jaxtrain.system.lock import WorkdirLock, in_use_error

# Dispatches queued ahead of the device within one step (micro-batches, eval batches). XLA:CPU
# deadlocked in a cross-device all-reduce with 50-100 two-device steps queued; a few ahead
# already keep the device busy.
MAX_IN_FLIGHT = 4


def _throttle(results: list) -> None:
  """Waits for the dispatch MAX_IN_FLIGHT back, so no more than that many are queued."""
  if len(results) > MAX_IN_FLIGHT:
    jax.block_until_ready(results[-MAX_IN_FLIGHT - 1])


def _keep_up(in_flight: collections.deque) -> None:
  """Waits (without copying anything back) until at most MAX_IN_FLIGHT train-step dispatches
  are queued ahead of the device."""
  while len(in_flight) > MAX_IN_FLIGHT:
    jax.block_until_ready(in_flight.popleft())


@dataclasses.dataclass
class Run:
  """What setup prepares for the loop; each part gets its own config section from here."""

  cfg: ml_collections.ConfigDict
  out: Console
  workdir: Path
  corpus: data.Corpus
  programs: programs_lib.Programs
  ckpts: checkpoint.Checkpoints
  train_iter: feed.DeviceFeed  # this process's rows of each micro-batch, placed ahead
  metrics_file: metrics.MetricsFile
  run_meta: dict  # saved with every checkpoint; checked on resume
  hooks: list[Hook]
  t_start: float
  log: LibraryLog | None  # where the libraries' messages go, if not to the terminal
  t_compile: float = 0.0  # when compiling began: the first step's line counts from it
  phase: str = "compiling"  # what an interrupt outside the loop stopped (loop/ending.py)
  changes: tuple[str, ...] = ()  # harmless config changes since the checkpoint resumed from
  plan: budget.Plan | None = None  # train.time_budget: the schedule's ends
  tasks: list = dataclasses.field(default_factory=list)  # train.eval_tasks' records (tasks.Task)


def run(cfg: ml_collections.ConfigDict, *, show_progress: bool = True,
        hooks: tuple[Hook, ...] = (), library_log: bool = False,
        explicit: Collection[str] = ()) -> ending.RunResult:
  """Trains `cfg` in `cfg.workdir`, resuming from its latest checkpoint if there is one.

  `library_log`: from setup on, the libraries' messages go to workdir/logs/ instead of the
  terminal, until the process exits (for a process that ends with the run: the CLI).
  `explicit`: dotted fields the user set (the CLI's overrides). With `init_from` a jaxtrain run,
  every model field neither in it nor changed from its default takes the source run's value.
  """
  t_start = time.time()
  workdir = Path(str(cfg.workdir)).expanduser()
  try:
    existed = workdir.exists()
    fresh = not existed or (workdir.is_dir() and not any(workdir.iterdir()))
  except (OSError, ValueError):  # a name the file system refuses: validation names it below
    existed, fresh = True, False
  r, lock, result, started = None, WorkdirLock(), None, False  # the lock: taken in setup
  try:
    validation.validate(cfg)
    cfg, taken = init_from.resolve(cfg, explicit)
    validation.validate(cfg)
    if cfg.train.time_budget:  # the run sets train.max_steps: on its own copy
      cfg = cfg.copy_and_resolve_references()
    cpu.split_cpu(cfg)  # before jax starts its backends
    platform = runtime.setup(cfg)
    r = _setup(cfg, platform, show_progress,
               [*hooks, tblog.TensorBoard(), *wandb_log.hooks(cfg.log), status.Status()],
               t_start, library_log, lock)
    if taken:
      r.out.print(f"init_from: from {cfg.init_from}, {', '.join(taken)}")
    if cfg.train.time_budget and "train.max_steps" in explicit:
      r.out.print(f"note: train.time_budget={cfg.train.time_budget} sets the steps; the given "
                  "train.max_steps is not used (--config.train.time_budget=\"\" trains it)")
    if r.log is not None:
      r.log.start()
    try:
      state, elapsed_before, best = _start(r)
      started = True
      result = _loop(r, state, elapsed_before, best)
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM (signals.Terminated) outside the loop
      result = ending.interrupted(e, r, r.workdir, t_start)
    finally:
      saving_lib.close(r.ckpts)  # a save that was going well still completes, also on error
      hooks_lib.end_all(r.hooks, result)
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


def _setup(cfg: ml_collections.ConfigDict, platform: str, show_progress: bool,
           hooks: list[Hook], t_start: float, library_log: bool, lock: WorkdirLock) -> Run:
  is_main = jax.process_index() == 0
  out = Console(enabled=is_main and show_progress, headless=cfg.headless)
  eval_tasks = tasks.load(cfg)  # bad records stop the run before anything else is done
  devices = jax.devices()
  mesh.check_devices(cfg.mesh, cfg.train.batch_size, devices, cfg.model.dtype)
  workdir = paths.check_workdir(cfg.workdir)
  runtime.barrier("jaxtrain: workdir checked")  # every process looked before any writes
  paths.create_workdir(workdir)
  if runtime.any_process(not lock.acquire(workdir, is_main, out.print)):  # one run per workdir
    raise in_use_error(workdir)
  data_axis, fsdp_axis = mesh.mesh_shape(cfg.mesh, len(devices))
  out.print(f"jaxtrain {__version__} | workdir {workdir} | {platform} x{len(devices)} "
            f"(mesh data={data_axis} fsdp={fsdp_axis}) | jax {jax.__version__}"
            + (f" | {allocator.in_use()} allocator" if platform == "cpu" else ""))
  corpus = mixture.prepare(cfg.data, show_progress=out.use_bar, log=out.print,
                           vocab_size=cfg.model.vocab_size)
  mixture.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  tokenfiles.check_run(cfg, corpus.tokenizer)
  vocab = tokenizer_lib.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  programs = programs_lib.build(cfg, vocab, devices, eot_id=corpus.tokenizer.eot_id)
  plan = None
  if cfg.train.time_budget:
    spent = budget.process_age_s if library_log else lambda: time.time() - t_start
    probe = lambda: mixture.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len,  # noqa: E731
                                           cfg.seed, jax.process_index(), jax.process_count())
    programs, plan = budget.fit(cfg, programs, devices, workdir, out.print, spent, probe)
  signals.check()
  summary.describe(out, cfg, corpus, programs)
  tasks.describe(eval_tasks, cfg.train.eval_tasks_limit, out.print)
  train_iter = feed.DeviceFeed(
      mixture.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, cfg.seed,
                             jax.process_index(), jax.process_count()), programs.place)
  run_meta = {"jaxtrain_version": __version__, "data_fingerprint": corpus.fingerprint,
              "tokenizer": corpus.tokenizer.to_json(), "config": cfg.to_dict()}
  if is_main and not (workdir / paths.RUN_FILE).exists():  # a new run: mark the directory first
    ending.write_run_files(workdir, cfg, run_meta, corpus.tokenizer)
  log = LibraryLog(workdir / "logs" / f"process_{jax.process_index()}.log") if library_log \
      else None
  return Run(cfg=cfg, out=out, workdir=workdir, corpus=corpus, programs=programs,
             ckpts=checkpoint.Checkpoints(str(workdir), cfg.train.keep_checkpoints),
             train_iter=train_iter,
             metrics_file=metrics.MetricsFile(workdir / "metrics.jsonl", enabled=is_main),
             run_meta=run_meta, t_start=t_start,
             hooks=hooks + early_stop.hooks(cfg.train) + profile.hooks(cfg.train, workdir),
             log=log, plan=plan, tasks=eval_tasks)


def _start(r: Run) -> tuple[TrainState, float, float]:
  """(state, training seconds so far, best val loss so far), with the compiled train step put
  in `r.programs`: init (or a restore) runs beside the train step's compile, since XLA
  compiles and orbax reads without holding the GIL."""
  r.t_compile = time.time()
  latest = r.ckpts.latest_step()
  init = r.programs.lower_init() if latest is None else None  # traced here, compiled there
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    if init is None:
      pending = pool.submit(_restore, r)
    else:
      pending = pool.submit(lambda: (r.programs.abstract.with_arrays(init.compile()()), 0.0,
                                     math.inf))
    train_step = r.programs.compile_train()
    state, elapsed, best = pending.result()
  r.programs = dataclasses.replace(r.programs, train_step=train_step)
  if latest is None and r.cfg.init_from:
    state = init_from.apply(r.cfg.init_from, state, r.programs, r.corpus.tokenizer, r.out.print)
  if latest is None:
    r.out.print("starting a new run at step 0")
  step = int(state.step)
  # After a resume was found sound, this config is the run's from here on; a finished run
  # that has nothing to train keeps its files as they are.
  if jax.process_index() == 0 and latest is not None and step < r.cfg.train.max_steps:
    ending.write_run_files(r.workdir, r.cfg, r.run_meta, r.corpus.tokenizer, step, r.changes)
  return state, elapsed, best


def _restore(r: Run) -> tuple[TrainState, float, float]:
  """The newest intact checkpoint that fits this config (damaged ones are set aside)."""
  step, state, meta, r.changes = saving_lib.resume(r.ckpts, r.programs, r.train_iter, r.run_meta,
                                                   r.cfg, r.out)
  dropped = r.metrics_file.drop_after(step)
  r.out.print(f"resumed from checkpoint {r.ckpts.directory / str(step)} at step {step}"
              + (f" (dropped {dropped} metric lines past it)" if dropped else ""))
  return state, meta.get("elapsed_s", 0.0), meta.get("best_val_loss") or math.inf


def _loop(r: Run, state: TrainState, elapsed_before: float, best_val: float) -> ending.RunResult:
  t = r.cfg.train
  if int(state.step) >= t.max_steps:
    return ending.already_done(r, int(state.step))
  signals.check()
  p = progress.start(r, state, elapsed_before, best_val)
  for hook in r.hooks:
    hook.on_start(r, p.step)
  signal_stop = hook_stop = None
  with signals.GracefulStop() as stop, saving_lib.peers_watched(r.ckpts, lambda: p.step):
    r.phase, r.out.on_closed = "training", lambda: stop.request("SIGPIPE")
    if r.out.closed:
      stop.request("SIGPIPE")
    r.out.start(t.max_steps, p.step)
    while p.step < t.max_steps:
      if r.plan is not None:  # the schedule's end from this step on
        state = budget.follow(r, p, state)
      state = _step(r, p, state)
      for hook in r.hooks:
        hook.on_step(p.step, state)
      if p.log_due is not None:  # the step before this one, now that this one is queued
        _log(r, p, p.log_due)
      evaluate_now = p.step % t.eval_every == 0 or p.step == t.max_steps
      save_now = p.step % t.checkpoint_every == 0 or p.step == t.max_steps
      # Every process stops at one step: on a signal the loop caught, or one jax's preemption
      # notifier caught before the loop began (multi-process runs).
      if runtime.any_process(stop.requested is not None) or runtime.preempted(p.step):
        signal_stop, save_now = stop.requested or "SIGTERM", True
      if evaluate_now or save_now:
        _log(r, p, p.step)
      elif p.step % t.log_every == 0:  # logged once the next step is queued: the device never waits
        p.log_due = p.step
      if evaluate_now and p.best.update(_evaluate(r, p, state)):
        save_now = True  # the best model so far is always on disk
      hook_stop = _hook_stop(r.hooks) if r.hooks and not signal_stop else None
      if hook_stop:
        if p.pending:  # the run's last step gets its line too
          _log(r, p, p.step)
        save_now = True
      if save_now:
        with stop.saving_now():
          saving_lib.save(r.ckpts, state, r.train_iter, r.run_meta,
                          p.last_val if evaluate_now else None, p.best.value, p.elapsed())
          if signal_stop or hook_stop:
            saving_lib.finish(r.ckpts, p.step)
      if signal_stop or hook_stop:
        break
      if evaluate_now or save_now:
        p.meter.skip_time(time.perf_counter())  # eval and save time is not training time
    progress.read(p, r.out.print)
    r.out.close()
    with stop.saving_now():
      saving_lib.finish(r.ckpts, p.step)
  speed = p.meter.last.tokens_per_sec if p.meter.last else None
  if signal_stop:
    r.out.print(f"{signal_stop}: stopped at step {p.step}; checkpoint saved in "
                f"{r.ckpts.directory / str(p.step)}. Run the same command again to resume.")
    return ending.RunResult(str(r.workdir), p.step, p.last_loss, p.last_val, speed,
                            time.time() - r.t_start, [], signal_stop, stop.exit_code)
  if hook_stop:
    r.out.print(f"stopped at step {p.step}: {hook_stop}")
  return ending.finish(r, state, p, speed)


def _step(r: Run, p: progress.Progress, state: TrainState) -> TrainState:
  """One optimizer step: grad_accum micro-batches queued on the device, each on a batch placed
  ahead of it (the next ones are placed while it runs). Its metrics stay on the device until a
  log line reads them."""
  micro = []
  for _ in range(r.cfg.train.grad_accum):
    state, m = r.programs.train_step(state, next(r.train_iter))
    micro.append(m)
    p.in_flight.append(m)
    r.train_iter.fill()
    _keep_up(p.in_flight)
  p.step += 1
  if not p.meter.started:
    jax.block_until_ready(micro)
    r.out.print(f"compiled and ran the first step in {time.time() - r.t_compile:.1f}s")
    p.meter.start(p.step, time.perf_counter())
  p.pending.append((p.step, micro))
  return state


def _log(r: Run, p: progress.Progress, step: int) -> None:
  """The line and records of step `step` (this step, or the one before it)."""
  stats = {}
  grad_norm = progress.read(p, r.out.print, step, stats)
  p.log_due = None
  speed = p.meter.read(step, time.perf_counter())
  if speed is not None and not p.speed_said:
    p.speed_said = True
    r.out.print(summary.speed_line(speed, r.programs.model_cfg.dtype,
                                   r.cfg.train.max_steps - step))
  lr, elapsed = p.last_lr, p.elapsed()
  mem, mem_text, mem_warning = p.mem_watch.read()
  r.out.progress(step, r.cfg.train.max_steps, p.last_loss, lr,
                 speed.tokens_per_sec if speed else 0.0, elapsed, speed.eta_s if speed else 0.0,
                 mem_text)
  if mem_warning:
    r.out.print(mem_warning)
  saving_lib.check(r.ckpts, step)  # a background write that failed is reported now
  record = {"step": step, "loss": p.last_loss, "lr": lr, "grad_norm": grad_norm,
            "tokens_per_sec": speed.tokens_per_sec if speed else None,
            "mfu": speed.mfu if speed else None, "elapsed_s": round(elapsed, 3), **mem, **stats}
  r.metrics_file.write(**record)
  for hook in r.hooks:
    hook.on_log(step, record)


def _evaluate(r: Run, p: progress.Progress, state: TrainState) -> float:
  losses = []
  for batch in p.eval_set:
    losses.append(r.programs.eval_step(state, batch)["loss"])
    _throttle(losses)
  losses, w = np.asarray(jax.device_get(losses)), p.eval_weights  # w: completion tokens per batch
  val = p.last_val = float(np.mean(losses) if w is None else (losses * w).sum() / max(w.sum(), 1.0))
  ppl = math.exp(min(val, 50))
  scope = data.loss_scope(r.cfg.data)
  on = f" on {scope}" if scope and p.eval_weights is not None else ""
  bpb = {} if math.isnan(p.bpb) else {"val_bpb": val * p.bpb}  # nan: no bytes known (token ids)
  r.out.print(f"eval step {p.step}: val loss{on} {val:.4f} | perplexity {ppl:.2f}"
              + (f" | {bpb['val_bpb']:.4f} bits/byte" if bpb else ""))
  record = {"step": p.step, "val_loss": val, "val_ppl": ppl, **bpb,
            "elapsed_s": round(p.elapsed(), 3)}
  if p.source_sets:
    record.update(sources.evaluate(r.programs, state, p.source_sets, _throttle))
    r.out.print(sources.line(p.step, record))
  if r.tasks:
    record.update(tasks.evaluate(r.tasks, state, r.corpus.tokenizer, r.out.print))
  r.metrics_file.write(**record)
  for hook in r.hooks:
    hook.on_eval(p.step, record)
  return val


def _hook_stop(hooks: list[Hook]) -> str | None:
  """The first hook's reason to stop; every process stops if any process's hooks ask."""
  reason = next((reason for h in hooks if (reason := h.stop_reason())), None)
  if runtime.any_process(reason is not None):
    return reason or "a hook on another process asked to stop"
  return None
