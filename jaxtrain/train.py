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
from jax.experimental import multihost_utils

from jaxtrain import (
  __version__,
  allocator,
  checkpoint,
  config,
  data,
  estimate,
  fmt,
  mesh,
  metrics,
  monitor,
  optim,
  paths,
  runtime,
  signals,
)
from jaxtrain import model as model_lib
from jaxtrain import programs as programs_lib
from jaxtrain import sample as sampling
from jaxtrain import saving as saving_lib
from jaxtrain import tokenizer as tokenizer_lib
from jaxtrain.console import Console, LibraryLog
from jaxtrain.errors import ConfigError, UserError
from jaxtrain.steps import TrainState

# Dispatches queued ahead of the device within one step (micro-batches, eval batches). XLA:CPU
# deadlocked in a cross-device all-reduce with 50-100 two-device steps queued; a few ahead
# already keep the device busy.
MAX_IN_FLIGHT = 4


def _throttle(results: list) -> None:
  """Waits for the dispatch MAX_IN_FLIGHT back, so no more than that many are queued."""
  if len(results) > MAX_IN_FLIGHT:
    jax.block_until_ready(results[-MAX_IN_FLIGHT - 1])


class Hook:
  """Attach to a run (`run(cfg, hooks=[...])`): sees each record the loop writes, may stop it."""

  def on_log(self, step: int, record: dict) -> None: ...

  def on_eval(self, step: int, record: dict) -> None: ...

  def stop_reason(self) -> str | None:
    """A reason to end the run after this step (it then saves and finishes), or None. Asked
    after each step's records; it must follow from them, so every process agrees."""
    return None


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
  speed_said: bool = False  # the first speed reading gets a line of its own


def run(cfg: ml_collections.ConfigDict, *, show_progress: bool = True,
        hooks: tuple[Hook, ...] = (), library_log: bool = False) -> RunResult:
  """Trains `cfg` in `cfg.workdir`, resuming from its latest checkpoint if there is one.

  `library_log`: the libraries' messages go to workdir/logs/ instead of the terminal (the CLI).
  """
  t_start = time.time()
  config.validate(cfg)
  platform = runtime.setup(cfg)
  workdir = Path(cfg.workdir).expanduser()
  existed = workdir.exists()
  r = None
  try:
    r = _setup(cfg, platform, show_progress, list(hooks), t_start, library_log)
    try:
      state, elapsed_before, best = _start(r)
      return _loop(r, state, elapsed_before, best)
    finally:
      saving_lib.close(r.ckpts)  # a save that was going well still completes, also on error
  except UserError as e:
    if r is not None and r.log is not None and r.log.errors:
      e.add_note(f"the libraries' own messages are in {r.log.path}")
    # A run that failed before writing anything leaves no empty directory behind.
    if not existed and workdir.is_dir() and not any(workdir.iterdir()):
      workdir.rmdir()
    raise


def _setup(cfg: ml_collections.ConfigDict, platform: str, show_progress: bool,
           hooks: list[Hook], t_start: float, library_log: bool) -> Run:
  is_main = jax.process_index() == 0
  out = Console(enabled=is_main and show_progress, headless=cfg.headless)
  devices = jax.devices()
  workdir = paths.check_workdir(cfg.workdir)
  runtime.barrier("jaxtrain: workdir checked")  # every process looked before any writes
  paths.create_workdir(workdir)
  data_axis, fsdp_axis = mesh.mesh_shape(cfg.mesh, len(devices))
  out.print(f"jaxtrain {__version__} | workdir {workdir} | {platform} x{len(devices)} "
            f"(mesh data={data_axis} fsdp={fsdp_axis}) | jax {jax.__version__}"
            + (f" | {allocator.in_use()} allocator" if platform == "cpu" else ""))
  corpus = data.prepare(cfg.data, show_progress=out.use_bar, log=out.print)
  data.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  programs = programs_lib.build(cfg, _vocab_size(cfg.model.vocab_size, corpus.tokenizer), devices)
  _describe(out, cfg, corpus, programs)
  train_iter = data.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, cfg.seed,
                                   jax.process_index(), jax.process_count())
  tok = corpus.tokenizer
  run_meta = {"jaxtrain_version": __version__, "data_fingerprint": corpus.fingerprint,
              "tokenizer": tok.to_json(), "config": cfg.to_dict()}
  if is_main and not (workdir / paths.RUN_FILE).exists():  # a new run: mark the directory first
    _write_run_files(workdir, cfg, run_meta, tok)
  log = LibraryLog(workdir / "logs" / f"process_{jax.process_index()}.log") if library_log \
      else None
  return Run(cfg=cfg, out=out, workdir=workdir, corpus=corpus, programs=programs,
             ckpts=checkpoint.Checkpoints(str(workdir), cfg.train.keep_checkpoints),
             train_iter=train_iter,
             metrics_file=metrics.MetricsFile(workdir / "metrics.jsonl", enabled=is_main),
             run_meta=run_meta, hooks=hooks, t_start=t_start, log=log)


def _vocab_size(want: int, tok) -> int:
  if want == 0:
    return tok.vocab_size
  if want < tok.vocab_size:
    raise ConfigError("model.vocab_size", f"{want} is smaller than the {tok.name} tokenizer's "
                      f"{tok.vocab_size} tokens", "pass --config.model.vocab_size=0 (automatic)")
  return want


def _describe(out: Console, cfg: ml_collections.ConfigDict, corpus: data.Corpus,
              programs: programs_lib.Programs) -> None:
  """The data, the model, its compute and memory, in a few lines before the first step."""
  tok, mc = corpus.tokenizer, programs.model_cfg
  out.print(f"data: {data.describe(cfg.data.path)}: {corpus.n_files} file(s), "
            f"{fmt.count(corpus.n_bytes)}B -> {fmt.count(len(corpus.tokens))} {tok.name} tokens "
            f"(train {fmt.count(len(corpus.train))}, val {fmt.count(len(corpus.val))})")
  for note in corpus.notes:
    out.print(f"data: {note}")
  k, B, T = cfg.train.grad_accum, cfg.train.batch_size, cfg.model.seq_len
  n_params = sum(x.size for x in jax.tree.leaves(programs.abstract.params))
  out.print(f"model: {fmt.count(n_params)} params, "
            f"{fmt.count(model_lib.flops_per_token(mc))} train FLOPs/token, vocab "
            f"{mc.vocab_size}, {B * k * T} tokens/step ({B} x {T} x {k} micro-batches)")
  out.print(f"compute: {mc.dtype} (params and optimizer float32), attention {mc.attention}"
            + (" (cuDNN fused attention)" if mc.attention == "cudnn" else "")
            + (f"; XLA options {programs.compiler_options}" if programs.compiler_options else ""))
  line, warning = estimate.memory_report(mc, B, k, list(programs.mesh.devices.flat),
                                         programs.mesh.shape["fsdp"], n_params)
  out.print(line)
  if warning:
    out.print(f"WARNING: {warning}")


def _start(r: Run) -> tuple[TrainState, float, float]:
  """(state, training seconds so far, best val loss so far), and the compiled train step in
  `r.programs`' place: init (or a restore) runs beside the train step's compile, since XLA
  compiles and orbax reads without holding the GIL."""
  r.t_compile = time.time()
  latest = r.ckpts.latest_step()
  init = r.programs.lower_init() if latest is None else None  # traced here, compiled there
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    if init is None:
      pending = pool.submit(_restore, r, latest)
    else:
      pending = pool.submit(lambda: (r.programs.abstract.with_arrays(init.compile()()), 0.0,
                                     math.inf))
    train_step = r.programs.compile_train()
    state, elapsed, best = pending.result()
  r.programs = dataclasses.replace(r.programs, train_step=train_step)
  if latest is None:
    r.out.print("starting a new run at step 0")
  if jax.process_index() == 0:  # after a resume was found sound: this config is the run's now
    _write_run_files(r.workdir, r.cfg, r.run_meta, r.corpus.tokenizer)
  return state, elapsed, best


def _write_run_files(workdir: Path, cfg: ml_collections.ConfigDict, run_meta: dict, tok) -> None:
  paths.write_json(workdir / "config.json", cfg.to_dict())
  paths.write_json(workdir / paths.RUN_FILE, {k: v for k, v in run_meta.items() if k != "config"})
  tokenizer_lib.save(tok, str(workdir / "tokenizer.json"))


def _restore(r: Run, step: int) -> tuple[TrainState, float, float]:
  meta = r.ckpts.read_meta(step)
  saving_lib.check_resumable(meta, r.run_meta, r.cfg, r.out)
  state = r.ckpts.restore(step, r.programs.abstract, r.programs.shardings, r.train_iter)
  position = r.train_iter.get_state()["next_index"]
  k = r.cfg.train.grad_accum
  if position != step * k:
    raise UserError(f"checkpoint {step} in {r.ckpts.directory} is inconsistent (data position "
                    f"{position}, expected {step * k}); move that step's directory away to "
                    "resume from an earlier one")
  dropped = r.metrics_file.drop_after(step)
  r.out.print(f"resumed from checkpoint {r.ckpts.directory / str(step)} at step {step}"
              + (f" (dropped {dropped} metric lines past it)" if dropped else ""))
  return state, meta.get("elapsed_s", 0.0), meta.get("best_val_loss") or math.inf


@dataclasses.dataclass
class Progress:
  """What the loop knows of the run so far."""

  step: int
  elapsed_before: float  # training seconds of earlier legs of this run
  t_run: float  # when this leg's training began
  best: monitor.BestVal
  last_loss: float | None = None
  last_val: float | None = None

  def elapsed(self) -> float:
    return self.elapsed_before + time.time() - self.t_run


def _loop(r: Run, state: TrainState, elapsed_before: float, best_val: float) -> RunResult:
  cfg, out, t = r.cfg, r.out, r.cfg.train
  mc = r.programs.model_cfg
  p = Progress(int(state.step), elapsed_before, time.time(), monitor.BestVal(best_val))
  guard = monitor.NonFiniteGuard(t.skip_nonfinite, r.programs.abstract.dynamic_loss_scale)
  meter = monitor.Throughput(t.batch_size * t.grad_accum * cfg.model.seq_len,
                             model_lib.flops_per_token(mc), t.max_steps,
                             peak=lambda: _peak(mc.dtype))
  eval_set = [r.programs.place(b) for b in data.eval_batches(
      r.corpus, t.batch_size, cfg.model.seq_len, cfg.seed, t.eval_steps, jax.process_index(),
      jax.process_count())]
  schedule = jax.jit(optim.lr_schedule(cfg.optim, t.max_steps))
  signal_stop, hook_stop = None, None
  if p.step >= t.max_steps:
    out.print(f"this run already reached step {p.step} (train.max_steps={t.max_steps}); raise "
              "--config.train.max_steps to train further")
  with signals.GracefulStop() as stop:
    pending = None  # the newest step's micro-batch metrics, still on the device
    out.start(t.max_steps, p.step)
    while p.step < t.max_steps:
      state, micro = _step(r, state)
      p.step += 1
      if not meter.started:
        jax.block_until_ready(micro)
        out.print(f"compiled and ran the first step in {time.time() - r.t_compile:.1f}s")
        meter.start(p.step, time.perf_counter())
      if pending is not None:  # that step is done or nearly: reading it costs no stall
        _read(guard, out, p, *pending)
      pending = (p.step, micro)
      evaluate_now = p.step % t.eval_every == 0 or p.step == t.max_steps
      save_now = p.step % t.checkpoint_every == 0 or p.step == t.max_steps
      if runtime.any_process(stop.requested is not None):  # every process stops at one step
        signal_stop, save_now = stop.requested or "SIGTERM", True
      if p.step % t.log_every == 0 or evaluate_now or save_now:
        grad_norm = _read(guard, out, p, *pending)
        pending = None
        _log(r, p, meter.read(p.step, time.perf_counter()), float(schedule(p.step - 1)),
             grad_norm)
      if evaluate_now and p.best.update(_evaluate(r, p, state, eval_set)):
        save_now = True  # the best model so far is always on disk
      # Hooks decide from the records alone, which every process has: they agree on the step.
      hook_stop = next((reason for h in r.hooks if (reason := h.stop_reason())), None)
      save_now = save_now or hook_stop is not None
      if save_now:
        with stop.saving_now():
          saving_lib.save(r.ckpts, state, r.train_iter, r.run_meta,
                          p.last_val if evaluate_now else None, p.best.value, p.elapsed())
          if signal_stop or hook_stop:
            saving_lib.finish(r.ckpts, p.step)
      if signal_stop or hook_stop:
        break
      if evaluate_now or save_now:
        meter.skip_time(time.perf_counter())  # eval and save time is not training time
    if pending is not None:
      _read(guard, out, p, *pending)
    out.close()
    with stop.saving_now():
      saving_lib.finish(r.ckpts, p.step)
  speed = meter.last.tokens_per_sec if meter.last else None
  if signal_stop:
    out.print(f"{signal_stop}: stopped at step {p.step}; checkpoint saved in "
              f"{r.ckpts.directory / str(p.step)}. Run the same command again to resume.")
    return RunResult(str(r.workdir), p.step, p.last_loss, p.last_val, speed,
                     time.time() - r.t_start, [], signal_stop, stop.exit_code)
  if hook_stop:
    out.print(f"stopped at step {p.step}: {hook_stop}")
  return _finish(r, state, p, speed)


def _step(r: Run, state: TrainState) -> tuple[TrainState, list[dict]]:
  """One optimizer step: grad_accum micro-batches; their metrics stay on the device."""
  micro = []
  for _ in range(r.cfg.train.grad_accum):
    state, m = r.programs.train_step(state, r.programs.place(next(r.train_iter)))
    micro.append(m)
    _throttle(micro)
  return state, micro


def _read(guard: monitor.NonFiniteGuard, out: Console, p: Progress, step: int,
          micro: list[dict]) -> float:
  """Reads a step's metrics (waiting for it); returns its gradient norm."""
  loss, grad_norm, note = guard.check(step, jax.device_get(micro))
  if note:
    out.print(note)
  p.last_loss = loss
  return grad_norm


def _peak(dtype: str) -> float:
  peak, _ = estimate.peak_flops(jax.devices()[0], dtype)
  return peak * estimate.peak_units(jax.devices())


def _log(r: Run, p: Progress, speed: monitor.Speed | None, lr: float, grad_norm: float) -> None:
  if speed is not None and not r.speed_said:
    r.speed_said = True
    peak, source = estimate.peak_flops(jax.devices()[0], r.programs.model_cfg.dtype)
    r.out.print(f"speed: {fmt.count(speed.tokens_per_sec)} tokens/s, "
                f"{fmt.count(speed.flops_per_sec)}FLOP/s = {speed.mfu or 0:.1%} MFU (of "
                f"{fmt.count(peak)}FLOP/s x {estimate.peak_units(jax.devices())}, {source}); "
                f"ETA for the remaining {r.cfg.train.max_steps - p.step} steps: "
                f"{fmt.duration(speed.eta_s)}")
  elapsed = p.elapsed()
  r.out.progress(p.step, r.cfg.train.max_steps, p.last_loss, lr,
                 speed.tokens_per_sec if speed else 0.0, elapsed, speed.eta_s if speed else 0.0)
  saving_lib.check(r.ckpts, p.step)  # a background write that failed is reported now
  record = {"step": p.step, "loss": p.last_loss, "lr": lr, "grad_norm": grad_norm,
            "tokens_per_sec": speed.tokens_per_sec if speed else None,
            "mfu": speed.mfu if speed else None, "elapsed_s": round(elapsed, 3)}
  r.metrics_file.write(**record)
  for hook in r.hooks:
    hook.on_log(p.step, record)


def _evaluate(r: Run, p: Progress, state: TrainState, eval_set: list[dict]) -> float:
  losses = []
  for batch in eval_set:
    losses.append(r.programs.eval_step(state, batch)["loss"])
    _throttle(losses)
  val = p.last_val = float(np.mean(jax.device_get(losses)))
  ppl = math.exp(min(val, 50))
  r.out.print(f"eval step {p.step}: val loss {val:.4f} | perplexity {ppl:.2f}")
  record = {"step": p.step, "val_loss": val, "val_ppl": ppl, "elapsed_s": round(p.elapsed(), 3)}
  r.metrics_file.write(**record)
  for hook in r.hooks:
    hook.on_eval(p.step, record)
  return val


def _finish(r: Run, state: TrainState, p: Progress, speed: float | None) -> RunResult:
  """Samples and the loss plot (process 0), then the closing line."""
  params = _gather(state.params)  # every process takes part; process 0 samples
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


def _gather(tree):
  """Host copies of possibly sharded (across processes, too) arrays."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"
