"""How a run gets to its first step: the workdir checked and locked, the data read, the programs
built, the hooks attached, a time budget's end planned (`prepare`: the `Run`); then the state to
train from, a new one or the newest intact checkpoint's, made beside the compiles (`start`,
loop/warmup.py); and what the loop carries through the leg (`progress`)."""

import math
import time
from collections.abc import Sequence

import jax
import ml_collections

from jaxtrain import __version__
from jaxtrain.checkpoints import init_from, lifecycle
from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.core import mesh, programs
from jaxtrain.core.model import flops_per_token
from jaxtrain.core.steps import TrainState
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenfiles, tokenizer
from jaxtrain.evals import tasks, validation
from jaxtrain.loop import budget, ending, warmup
from jaxtrain.loop.feed import DeviceFeed
from jaxtrain.loop.state import Progress, Run
from jaxtrain.loop.step_metrics import NonFiniteGuard, Pending
from jaxtrain.measure import estimate, summary
from jaxtrain.measure.speed import Throughput
from jaxtrain.system import allocator, paths, runtime, signals
from jaxtrain.system.console import Console, LibraryLog
from jaxtrain.system.lock import WorkdirLock, in_use_error
from jaxtrain.trackers import standard
from jaxtrain.trackers.hooks import Hook


def prepare(cfg: ml_collections.ConfigDict, platform: str, show_progress: bool,
            hooks: Sequence[Hook], t_start: float, library_log: bool, lock: WorkdirLock) -> Run:
  """The run, up to its first compile (a new run with a time budget measures itself on what it
  compiles: it compiles here)."""
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
  corpus = corpus_lib.prepare(cfg.data, show_progress=out.use_bar, log=out.print,
                              vocab_size=cfg.model.vocab_size)
  corpus_lib.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  tokenfiles.check_run(cfg, corpus.tokenizer)
  vocab = tokenizer.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  built = programs.build(cfg, vocab, devices, eot_id=corpus.tokenizer.eot_id)
  batches = lambda: corpus_lib.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len,  # noqa: E731
                                              cfg.seed, jax.process_index(), jax.process_count())
  run_hooks = standard.for_run(cfg, workdir, hooks)
  plan, t_compile = None, time.time()  # a new run with a budget compiles from here on
  if cfg.train.time_budget:
    spent = lambda: time.time() - t_start  # noqa: E731
    built, plan = _plan(cfg, built, corpus, run_hooks, workdir, out.print, spent, batches)
    cfg = budget.with_end(cfg, plan.final)  # the run's train.max_steps from here on
  signals.check()
  summary.describe(out, cfg, corpus, built)
  tasks.describe(eval_tasks, cfg.train.eval_tasks_limit, out.print)
  meta = {"jaxtrain_version": __version__, "data_fingerprint": corpus.fingerprint,
          "tokenizer": corpus.tokenizer.to_json(), "config": cfg.to_dict()}
  if is_main and not (workdir / paths.RUN_FILE).exists():  # a new run: mark the directory first
    ending.write_run_files(workdir, cfg, meta, corpus.tokenizer)
  log = LibraryLog(workdir / "logs" / f"process_{jax.process_index()}.log") if library_log \
      else None
  saving = lifecycle.Saving(Checkpoints(str(workdir), cfg.train.keep_checkpoints), meta,
                            cfg.train.checkpoint_every)
  return Run(cfg=cfg, out=out, workdir=workdir, corpus=corpus, programs=built, saving=saving,
             feed=DeviceFeed(batches(), built.place), hooks=run_hooks, t_start=t_start, log=log,
             plan=plan, tasks=eval_tasks, t_compile=t_compile,
             compiled=isinstance(built.train_step, jax.stages.Compiled))


def _plan(cfg: ml_collections.ConfigDict, built: programs.Programs, corpus, hooks, workdir,
          say, spent, batches) -> tuple[programs.Programs, budget.Plan]:
  """A time budget's plan: the ends a resumed run recorded; a new run's from a measurement of
  the programs it runs, compiled (with the rest, side by side) before the plan is made."""
  if paths.is_run(workdir):
    return built, budget.recorded(cfg, workdir)
  budget.check_left(cfg, spent())
  ready = warmup.side_by_side(built, cfg, corpus, hooks, built.init,  # the probe's own state
                              measure=True)
  budget.check_left(cfg, spent(), compiled=True)
  return ready.programs, budget.fit(cfg, ready, say, spent, batches)


def start(r: Run) -> tuple[TrainState, float]:
  """(state, training seconds so far), with the compiled train step put in `r.programs` and the
  best val loss so far in `r.saving`: init (or a restore) runs beside the compiles (warmup.py),
  or after them where a time budget's measurement compiled already."""
  if not r.compiled:
    r.t_compile = time.time()
  latest = r.saving.ckpts.latest_step()
  if latest is None:
    init = r.programs.lower_init()  # traced here, compiled beside the train step
    begin = lambda: (r.programs.abstract.with_arrays(init.compile()()), 0.0, math.inf)  # noqa: E731
  else:
    begin = lambda: _restore(r)  # noqa: E731
  if r.compiled:
    state, elapsed, best = begin()
  else:
    ready = warmup.side_by_side(r.programs, r.cfg, r.corpus, r.hooks, begin)
    r.programs, r.compiled = ready.programs, True
    state, elapsed, best = ready.beside
  r.saving.best = lifecycle.BestVal(best)
  if latest is None and r.cfg.init_from:
    state = init_from.apply(r.cfg.init_from, state, r.programs, r.corpus.tokenizer, r.out.print)
  if latest is None:
    r.out.print("starting a new run at step 0")
  step = int(state.step)
  # After a resume was found sound, this config is the run's from here on; a finished run
  # that has nothing to train keeps its files as they are.
  if jax.process_index() == 0 and latest is not None and step < r.cfg.train.max_steps:
    ending.write_run_files(r.workdir, r.cfg, r.saving.meta, r.corpus.tokenizer, step, r.changes)
  return state, elapsed


def _restore(r: Run) -> tuple[TrainState, float, float]:
  """The newest intact checkpoint that fits this config (damaged ones are set aside)."""
  step, state, meta, r.changes = lifecycle.resume(r.saving.ckpts, r.programs, r.feed,
                                                  r.saving.meta, r.cfg, r.out)
  r.out.print(f"resumed from checkpoint {r.saving.ckpts.directory / str(step)} at step {step}")
  return state, meta.get("elapsed_s", 0.0), meta.get("best_val_loss") or math.inf


def progress(r: Run, state: TrainState, elapsed_before: float) -> Progress:
  """What the loop carries through a leg that starts at `state`: the meters, and the validation
  set placed on the devices."""
  cfg, t = r.cfg, r.cfg.train
  dtype = r.programs.model_cfg.dtype
  return Progress(
      step=int(state.step), end=t.max_steps, elapsed_before=elapsed_before, t_run=time.time(),
      meter=Throughput(t.batch_size * t.grad_accum * cfg.model.seq_len,
                       flops_per_token(r.programs.model_cfg), t.max_steps,
                       peak=lambda achieved: estimate.peak_flops(jax.devices(), dtype,
                                                                 achieved)[0]),
      pending=Pending(NonFiniteGuard(t.skip_nonfinite, r.programs.abstract.dynamic_loss_scale)),
      val=validation.prepare(cfg, r.corpus, r.programs.place, r.tasks))
