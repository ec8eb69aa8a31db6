"""The training loop: setup, restore or init, steps, finish. Side effects live here and in the
modules it calls (files, console, checkpoints, signals); the steps themselves are pure.

Per optimizer step: `grad_accum` micro-batches through the compiled train step. A step's metrics
are read once the next step is queued, so the host never stalls the device. Hooks (`Hook`)
see every logged and evaluated record and can end a run, without changes to the loop.
"""

import concurrent.futures
import dataclasses
import math
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxtrain import __version__
from jaxtrain.checkpoints import init_from
from jaxtrain.checkpoints import lifecycle as saving_lib
from jaxtrain.checkpoints import store as checkpoint
from jaxtrain.config import validate as validation
from jaxtrain.core import cpu, mesh, optim
from jaxtrain.core import programs as programs_lib
from jaxtrain.core import stats as stats_lib
from jaxtrain.core.model import flops_per_token
from jaxtrain.core.steps import TrainState
from jaxtrain.data import corpus as data
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.generation import samples as sampling
from jaxtrain.loop import early_stop, estimate, memory, metrics, monitor, status, summary, tblog, wandb_log
from jaxtrain.loop import hooks as hooks_lib
from jaxtrain.loop.console import Console, LibraryLog
from jaxtrain.loop.hooks import Hook
from jaxtrain.system import allocator, fmt, paths, runtime, signals
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


@dataclasses.dataclass
class RunResult:
  workdir: str
  step: int
  train_loss: float | None
  val_loss: float | None
  tokens_per_sec: float | None
  wall_s: float
  samples: list[str]
  stopped_by: str | None = None  # "SIGTERM" or "SIGINT" when a signal ended the run early
  exit_code: int = 0


@dataclasses.dataclass
class Run:
  """What setup prepares for the loop; each part gets its own config section from here."""

  cfg: ml_collections.ConfigDict
  out: Console
  workdir: Path
  corpus: data.Corpus
  programs: programs_lib.Programs
  ckpts: checkpoint.Checkpoints
  train_iter: object  # grain iterator of this process's rows of each micro-batch
  metrics_file: metrics.MetricsFile
  run_meta: dict  # saved with every checkpoint; checked on resume
  hooks: list[Hook]
  t_start: float
  log: LibraryLog | None  # where the libraries' messages go, if not to the terminal
  t_compile: float = 0.0  # when compiling began: the first step's line counts from it


def run(cfg: ml_collections.ConfigDict, *, show_progress: bool = True,
        hooks: tuple[Hook, ...] = (), library_log: bool = False) -> RunResult:
  """Trains `cfg` in `cfg.workdir`, resuming from its latest checkpoint if there is one.

  `library_log`: from setup on, the libraries' messages go to workdir/logs/ instead of the
  terminal, until the process exits (for a process that ends with the run: the CLI).
  """
  validation.validate(cfg)
  cpu.split_cpu(cfg)  # before jax starts its backends
  platform = runtime.setup(cfg)
  t_start = time.time()
  workdir = Path(cfg.workdir).expanduser()
  existed = workdir.exists()
  r, lock, result = None, WorkdirLock(), None  # the lock: taken in setup, released at the end
  try:
    r = _setup(cfg, platform, show_progress,
               [*hooks, tblog.TensorBoard(), *wandb_log.hooks(cfg.log), status.Status()],
               t_start, library_log, lock)
    if r.log is not None:
      r.log.start()
    try:
      state, elapsed_before, best = _start(r)
      result = _loop(r, state, elapsed_before, best)
    finally:
      saving_lib.close(r.ckpts)  # a save that was going well still completes, also on error
      hooks_lib.end_all(r.hooks, result)
      lock.release()  # after the run's last write
    if r.log is not None and r.log.errors:
      r.out.print(f"note: the libraries logged {r.log.errors} error(s); see {r.log.path}")
    return result
  except BaseException as e:
    lock.release()  # first: it removes its file, which the emptiness check below must not see
    if r is not None and r.log is not None and r.log.errors:
      e.add_note(f"the libraries' own messages are in {r.log.path}")
    # A run that failed before writing anything leaves no empty directory behind.
    if isinstance(e, UserError) and not existed and workdir.is_dir() \
        and not any(workdir.iterdir()):
      workdir.rmdir()
    raise


def _setup(cfg: ml_collections.ConfigDict, platform: str, show_progress: bool,
           hooks: list[Hook], t_start: float, library_log: bool, lock: WorkdirLock) -> Run:
  is_main = jax.process_index() == 0
  out = Console(enabled=is_main and show_progress, headless=cfg.headless)
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
  corpus = data.prepare(cfg.data, show_progress=out.use_bar, log=out.print)
  data.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  programs = programs_lib.build(cfg, tokenizer_lib.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer),
                                devices, eot_id=corpus.tokenizer.eot_id)
  summary.describe(out, cfg, corpus, programs)
  train_iter = data.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, cfg.seed,
                                   jax.process_index(), jax.process_count())
  run_meta = {"jaxtrain_version": __version__, "data_fingerprint": corpus.fingerprint,
              "tokenizer": corpus.tokenizer.to_json(), "config": cfg.to_dict()}
  if is_main and not (workdir / paths.RUN_FILE).exists():  # a new run: mark the directory first
    _write_run_files(workdir, cfg, run_meta, corpus.tokenizer)
  log = LibraryLog(workdir / "logs" / f"process_{jax.process_index()}.log") if library_log \
      else None
  return Run(cfg=cfg, out=out, workdir=workdir, corpus=corpus, programs=programs,
             ckpts=checkpoint.Checkpoints(str(workdir), cfg.train.keep_checkpoints),
             train_iter=train_iter,
             metrics_file=metrics.MetricsFile(workdir / "metrics.jsonl", enabled=is_main),
             run_meta=run_meta, hooks=hooks + early_stop.hooks(cfg.train), t_start=t_start,
             log=log)


def _write_run_files(workdir: Path, cfg: ml_collections.ConfigDict, run_meta: dict, tok) -> None:
  paths.write_json(workdir / "config.json", cfg.to_dict())
  paths.write_json(workdir / paths.RUN_FILE, {k: v for k, v in run_meta.items() if k != "config"})
  tokenizer_lib.save(tok, str(workdir / "tokenizer.json"))


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
  if jax.process_index() == 0:  # after a resume was found sound: this config is the run's now
    _write_run_files(r.workdir, r.cfg, r.run_meta, r.corpus.tokenizer)
  return state, elapsed, best


def _restore(r: Run) -> tuple[TrainState, float, float]:
  """The newest intact checkpoint that fits this config (damaged ones are set aside)."""
  step, state, meta = saving_lib.resume(r.ckpts, r.programs, r.train_iter, r.run_meta, r.cfg,
                                        r.out)
  dropped = r.metrics_file.drop_after(step)
  r.out.print(f"resumed from checkpoint {r.ckpts.directory / str(step)} at step {step}"
              + (f" (dropped {dropped} metric lines past it)" if dropped else ""))
  return state, meta.get("elapsed_s", 0.0), meta.get("best_val_loss") or math.inf


@dataclasses.dataclass
class Progress:
  """What the loop carries from step to step."""

  step: int
  elapsed_before: float  # training seconds of earlier legs of this run
  t_run: float  # when this leg's training began
  best: monitor.BestVal
  guard: monitor.NonFiniteGuard
  meter: monitor.Throughput
  schedule: object  # jitted: the learning rate at a step
  eval_set: list[dict]  # the same placed validation batches at every evaluation
  bpb: float  # val_bpb / val_loss over eval_set (data.bits_per_byte)
  pending: tuple[int, list[dict]] | None = None  # a step whose metrics are still on the device
  last_loss: float | None = None
  last_val: float | None = None
  speed_said: bool = False  # the first speed reading gets a line of its own
  mem_watch: memory.Watch = dataclasses.field(default_factory=memory.Watch)

  def elapsed(self) -> float:
    return self.elapsed_before + time.time() - self.t_run


def _progress(r: Run, state: TrainState, elapsed_before: float, best_val: float) -> Progress:
  cfg, t = r.cfg, r.cfg.train
  dtype = r.programs.model_cfg.dtype
  eval_batches = data.eval_batches(r.corpus, t.batch_size, cfg.model.seq_len, cfg.seed,
                                   t.eval_steps, jax.process_index(), jax.process_count())
  return Progress(
      step=int(state.step), elapsed_before=elapsed_before, t_run=time.time(),
      best=monitor.BestVal(best_val),
      guard=monitor.NonFiniteGuard(t.skip_nonfinite, r.programs.abstract.dynamic_loss_scale),
      meter=monitor.Throughput(t.batch_size * t.grad_accum * cfg.model.seq_len,
                               flops_per_token(r.programs.model_cfg), t.max_steps,
                               peak=lambda: estimate.peak_flops(jax.devices(), dtype)[0]),
      schedule=jax.jit(optim.lr_schedule(cfg.optim, t.max_steps)),
      eval_set=[r.programs.place(b) for b in eval_batches],
      bpb=data.bits_per_byte(r.corpus, t.batch_size, cfg.model.seq_len, cfg.seed, t.eval_steps))


def _loop(r: Run, state: TrainState, elapsed_before: float, best_val: float) -> RunResult:
  t = r.cfg.train
  p = _progress(r, state, elapsed_before, best_val)
  for hook in r.hooks:
    hook.on_start(r, p.step)
  signal_stop = hook_stop = None
  if p.step >= t.max_steps:
    r.out.print(f"this run already reached step {p.step} (train.max_steps={t.max_steps}); raise "
                "--config.train.max_steps to train further")
  with signals.GracefulStop() as stop, saving_lib.peers_watched(r.ckpts, lambda: p.step):
    if p.step < t.max_steps:
      r.out.start(t.max_steps, p.step)
    while p.step < t.max_steps:
      state = _step(r, p, state)
      evaluate_now = p.step % t.eval_every == 0 or p.step == t.max_steps
      save_now = p.step % t.checkpoint_every == 0 or p.step == t.max_steps
      if runtime.any_process(stop.requested is not None):  # every process stops at one step
        signal_stop, save_now = stop.requested or "SIGTERM", True
      if p.step % t.log_every == 0 or evaluate_now or save_now:
        _log(r, p)
      if evaluate_now and p.best.update(_evaluate(r, p, state)):
        save_now = True  # the best model so far is always on disk
      hook_stop = _hook_stop(r.hooks) if r.hooks and not signal_stop else None
      if hook_stop:
        if p.pending is not None:  # the run's last step gets its line too
          _log(r, p)
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
    _read(r, p)
    r.out.close()
    with stop.saving_now():
      saving_lib.finish(r.ckpts, p.step)
  speed = p.meter.last.tokens_per_sec if p.meter.last else None
  if signal_stop:
    r.out.print(f"{signal_stop}: stopped at step {p.step}; checkpoint saved in "
                f"{r.ckpts.directory / str(p.step)}. Run the same command again to resume.")
    return RunResult(str(r.workdir), p.step, p.last_loss, p.last_val, speed,
                     time.time() - r.t_start, [], signal_stop, stop.exit_code)
  if hook_stop:
    r.out.print(f"stopped at step {p.step}: {hook_stop}")
  return _finish(r, state, p, speed)


def _step(r: Run, p: Progress, state: TrainState) -> TrainState:
  """One optimizer step: grad_accum micro-batches. The previous step's metrics are read now
  that this one is queued; this one's stay on the device."""
  micro = []
  for _ in range(r.cfg.train.grad_accum):
    state, m = r.programs.train_step(state, r.programs.place(next(r.train_iter)))
    micro.append(m)
    _throttle(micro)
  p.step += 1
  if not p.meter.started:
    jax.block_until_ready(micro)
    r.out.print(f"compiled and ran the first step in {time.time() - r.t_compile:.1f}s")
    p.meter.start(p.step, time.perf_counter())
  _read(r, p)
  p.pending = (p.step, micro)
  return state


def _read(r: Run, p: Progress, stats: dict | None = None) -> float | None:
  """Reads the pending step's metrics (waiting for it); returns its gradient norm. Its per-group
  statistics are copied from the device only when asked (into `stats`)."""
  if p.pending is None:
    return None
  micro = p.pending[1]
  host = jax.device_get([{k: v for k, v in m.items() if stats is not None or not stats_lib.is_stat(k)}
                         for m in micro])
  loss, grad_norm, note = p.guard.check(p.pending[0], host)
  if stats is not None:
    stats.update(stats_lib.combine(host))
  p.pending = None
  if note:
    r.out.print(note)
  p.last_loss = loss
  return grad_norm


def _log(r: Run, p: Progress) -> None:
  stats = {}
  grad_norm = _read(r, p, stats)
  speed = p.meter.read(p.step, time.perf_counter())
  if speed is not None and not p.speed_said:
    p.speed_said = True
    r.out.print(summary.speed_line(speed, r.programs.model_cfg.dtype,
                                   r.cfg.train.max_steps - p.step))
  lr, elapsed = float(p.schedule(p.step - 1)), p.elapsed()
  mem, mem_text, mem_warning = p.mem_watch.read()
  r.out.progress(p.step, r.cfg.train.max_steps, p.last_loss, lr,
                 speed.tokens_per_sec if speed else 0.0, elapsed, speed.eta_s if speed else 0.0,
                 mem_text)
  if mem_warning:
    r.out.print(mem_warning)
  saving_lib.check(r.ckpts, p.step)  # a background write that failed is reported now
  record = {"step": p.step, "loss": p.last_loss, "lr": lr, "grad_norm": grad_norm,
            "tokens_per_sec": speed.tokens_per_sec if speed else None,
            "mfu": speed.mfu if speed else None, "elapsed_s": round(elapsed, 3), **mem, **stats}
  r.metrics_file.write(**record)
  for hook in r.hooks:
    hook.on_log(p.step, record)


def _evaluate(r: Run, p: Progress, state: TrainState) -> float:
  losses = []
  for batch in p.eval_set:
    losses.append(r.programs.eval_step(state, batch)["loss"])
    _throttle(losses)
  val = p.last_val = float(np.mean(jax.device_get(losses)))
  ppl = math.exp(min(val, 50))
  r.out.print(f"eval step {p.step}: val loss {val:.4f} | perplexity {ppl:.2f} | "
              f"{val * p.bpb:.4f} bits/byte")
  record = {"step": p.step, "val_loss": val, "val_ppl": ppl, "val_bpb": val * p.bpb,
            "elapsed_s": round(p.elapsed(), 3)}
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


def _finish(r: Run, state: TrainState, p: Progress, speed: float | None) -> RunResult:
  """Samples and the loss plot (process 0), then the closing line."""
  params = runtime.host_copy(state.params)  # every process takes part; process 0 samples
  is_main = jax.process_index() == 0
  samples = sampling.write_samples(
      r.cfg.sample, r.cfg.model.seq_len, r.cfg.seed, state.replace(params=params), r.corpus.val,
      r.corpus.tokenizer, r.workdir, r.out) if is_main else []
  if is_main:
    png = metrics.plot_losses(r.workdir / "metrics.jsonl", r.workdir / "loss.png")
    if png:
      r.out.print(f"loss curves: {png}")
  wall = time.time() - r.t_start
  r.out.print(f"done: step {p.step} | train loss {_fmt(p.last_loss)} | val loss "
              f"{_fmt(p.last_val)} | wall {fmt.duration(wall)} | workdir {r.workdir}")
  return RunResult(str(r.workdir), p.step, p.last_loss, p.last_val, speed, wall, samples)


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"
