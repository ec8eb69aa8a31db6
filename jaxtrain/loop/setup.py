"""How a resolved run (loop/resolution.py) gets to its first step: its hooks attached, a time
budget's end planned, a new run's files written, its checkpoints opened (`prepare`: the `Run`);
then the state to train from, a new one or the newest intact checkpoint's, made beside the
compiles (`start`, loop/warmup.py); and what the loop carries through the leg (`progress`)."""

import dataclasses
import math
import time
from collections.abc import Sequence

import jax

from jaxtrain import __version__
from jaxtrain.checkpoints import init_from, lifecycle
from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.config import extensions
from jaxtrain.core.model import flops_per_token
from jaxtrain.core.steps import TrainState
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.evals import validation
from jaxtrain.loop import budget, ending, resolution, warmup
from jaxtrain.loop.feed import DeviceFeed
from jaxtrain.loop.state import Progress, Run
from jaxtrain.loop.step_metrics import NonFiniteGuard, Pending
from jaxtrain.loop.workdir import write_run_files
from jaxtrain.measure import estimate
from jaxtrain.measure.speed import Throughput
from jaxtrain.system import paths, signals
from jaxtrain.system.console import Console
from jaxtrain.trackers import standard
from jaxtrain.trackers.hooks import Hook


def prepare(res: resolution.Resolved, out: Console, hooks: Sequence[Hook], t_start: float) -> Run:
  """The run `res` resolved, up to its first compile: its hooks, a time budget's end planned (a
  new run with a budget measures itself on what it compiles: it compiles here), a new run's files
  written, its checkpoints opened, its batches."""
  cfg, workdir, corpus, built = res.cfg, res.workdir, res.corpus, res.programs
  batches = lambda: corpus_lib.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len,  # noqa: E731
                                              cfg.seed, jax.process_index(), jax.process_count())
  run_hooks = standard.for_run(cfg, workdir, hooks)
  plan, t_compile = budget.Plan(((0, cfg.train.max_steps),)), time.time()  # (compiles from here)
  if res.budget_s is not None:
    if paths.is_run(workdir):  # a resumed run follows the ends it recorded
      plan = budget.recorded(res.budget_s, workdir)
    else:  # a new run measures the programs it runs, compiled first (with the rest, side by side)
      spent = lambda: time.time() - t_start  # noqa: E731
      budget.check_left(cfg, res.budget_s, spent())
      ready = warmup.side_by_side(built, cfg, corpus, run_hooks, built.init,  # the probe's state
                                  measure=True)
      budget.check_left(cfg, res.budget_s, spent(), compiled=True)
      built, plan = ready.programs, budget.fit(cfg, res.budget_s, ready, out.print, spent, batches)
    cfg = budget.with_end(cfg, plan.final)  # the run's train.max_steps from here on
    resolution.say_epochs(out, cfg, len(corpus.train), plan.final)
  signals.check()
  meta = {"jaxtrain_version": __version__, "data_fingerprint": corpus.fingerprint,
          "tokenizer": corpus.tokenizer.to_json(), "config": extensions.saved_config(cfg)}
  if jax.process_index() == 0 and not (workdir / paths.RUN_FILE).exists():  # a new run
    write_run_files(workdir, cfg, meta, corpus.tokenizer)
  saving = lifecycle.Saving(Checkpoints(str(workdir), cfg.train.keep_checkpoints), meta,
                            cfg.train.checkpoint_every)
  return Run(cfg=cfg, out=out, workdir=workdir, corpus=corpus, programs=built, saving=saving,
             feed=DeviceFeed(batches(), built.place), hooks=run_hooks, t_start=t_start,
             plan=plan, tasks=res.tasks, t_compile=t_compile)


def start(r: Run) -> tuple[Run, TrainState, float, float]:
  """(the run with its train step compiled, the state to train from on the plan's schedule,
  training seconds and the best val loss so far): init (or a restore) runs beside the compiles
  (warmup.py), or after them where a time budget's measurement compiled already."""
  t_compile = time.time()
  latest = r.saving.ckpts.latest_step()
  if latest is None:
    init = r.programs.lower_init()  # traced here, compiled beside the train step
    begin = lambda: (r.programs.abstract.with_arrays(init.compile()()), 0.0, math.inf, ())  # noqa: E731
  else:
    begin = lambda: _restore(r)  # noqa: E731
  done = None
  if latest is not None and latest >= r.plan.final and not ending.end_left(r.workdir, latest):
    # A finished run: restored, nothing compiled
    done = begin()  # (unless its end was damaged and it fell back to a step that still trains)
    begin = lambda: done  # noqa: E731
  if isinstance(r.programs.train_step, jax.stages.Compiled) or \
      (done is not None and int(done[0].step) >= r.plan.final):
    state, elapsed, best, changes = begin()
  else:
    ready = warmup.side_by_side(r.programs, r.cfg, r.corpus, r.hooks, begin)
    state, elapsed, best, changes = ready.beside
    r = dataclasses.replace(r, programs=ready.programs, t_compile=t_compile, ahead=ready.ahead)
  if latest is None and r.cfg.init_from:
    state = init_from.apply(r.cfg.init_from, state, r.programs, r.corpus.tokenizer, r.out.print)
  if latest is None:
    r.out.print("starting a new run at step 0")
  step = int(state.step)
  # After a resume was found sound, this config is the run's from here on; a finished run
  # that has nothing to train keeps its files as they are.
  if jax.process_index() == 0 and latest is not None and step < r.plan.final:
    write_run_files(r.workdir, r.cfg, r.saving.meta, r.corpus.tokenizer, step, changes)
  if r.plan.budget_s is not None:
    state = budget.on_schedule(r.plan, step, state)
  return r, state, elapsed, best


def _restore(r: Run) -> tuple[TrainState, float, float, tuple[str, ...]]:
  """(state, training seconds, best val loss, the harmless config changes since it) of the
  newest intact checkpoint that fits this config (damaged ones are set aside)."""
  step, state, meta, changes = lifecycle.resume(r.saving.ckpts, r.programs, r.feed,
                                                r.saving.meta, r.cfg, r.out)
  r.out.print(f"resumed from checkpoint {r.saving.ckpts.directory / str(step)} at step {step}")
  return state, meta.get("elapsed_s", 0.0), meta.get("best_val_loss") or math.inf, changes


def progress(r: Run, state: TrainState, elapsed_before: float, best: float) -> Progress:
  """What the loop carries through a leg that starts at `state`: the run's end, the meters, and
  the validation set placed on the devices."""
  cfg, t = r.cfg, r.cfg.train
  dtype = r.programs.model_cfg.dtype
  return Progress(
      step=int(state.step), plan=r.plan, elapsed_before=elapsed_before, t_run=time.time(),
      meter=Throughput(t.batch_size * t.grad_accum * cfg.model.seq_len,
                       flops_per_token(r.programs.model_cfg),
                       peak=lambda achieved: estimate.peak_flops(jax.devices(), dtype,
                                                                 achieved)[0]),
      pending=Pending(NonFiniteGuard(t.skip_nonfinite, r.programs.optimizer.loss_scaling)),
      val=validation.prepare(cfg, r.corpus, r.programs.place, r.tasks),
      best=lifecycle.BestVal(best))
