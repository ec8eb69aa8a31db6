"""What a run compiles before its first step, side by side (`side_by_side`): the train step on the
calling thread and, in a pool beside it, what setup does meanwhile (a new state's init, or a
restore); on an accelerator also the eval step, the checkpoints' checksum program, the samples'
programs and the hooks' imports. XLA compiles, orbax reads and much of an import run without the
GIL, so the first step waits for the slowest of them rather than their sum, and no evaluation,
save or sampling stops the run to compile. On a CPU, whose cores the train step's compile keeps
busy, those compile in a thread of their own once training runs (`Ahead`: from the first speed
reading on), unless a time budget's measurement needs them first: the end of a run finds them
compiled."""

import concurrent.futures
import contextlib
import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from jaxtrain.checkpoints import store
from jaxtrain.core.programs import Programs
from jaxtrain.data.corpus import Corpus
from jaxtrain.generation import samples
from jaxtrain.system import allocator
from jaxtrain.trackers.hooks import Hooks


class Ahead:
  """Compiles in a thread of its own what the run needs after its first steps (`jobs`: name ->
  what compiles it, in the order needed), once `start`ed; `wait(name)` before the run uses one.
  On a CPU they take the cores from training for the time they would take at the end: one at a
  time while training runs, two at a time where the run waits for them (a run that ends before
  it started them). A job that fails is left for the run to meet again (and report) where it
  needs it."""

  def __init__(self, jobs: dict[str, Callable[[], Any]] | None = None):
    self.jobs, self.futures, self.pool = dict(jobs or {}), {}, None

  def start(self, threads: int = 1) -> None:
    if self.jobs and self.pool is None:
      self.pool = concurrent.futures.ThreadPoolExecutor(threads, "jaxtrain-ahead")
      self.futures = {name: self.pool.submit(_quietly, job) for name, job in self.jobs.items()}

  def wait(self, name: str | None = None) -> None:
    """Until job `name` and those before it (every job where `name` is none) are done."""
    self.start(threads=2)  # not started: nothing trains while the run waits
    for job, future in self.futures.items():
      future.result()
      if job == name:
        break

  def close(self) -> None:
    """No job starts from now on; waits for those compiling (a compile cannot be stopped)."""
    if self.pool is not None:
      self.pool.shutdown(cancel_futures=True)


def _quietly(job: Callable[[], Any]) -> None:
  with allocator.purging(), contextlib.suppress(Exception):  # its garbage is not kept beside training's
    job()


@dataclasses.dataclass
class Ready:
  programs: Programs  # the train step compiled (a `Compiled`), the eval step's compile cached
  beside: Any  # what `beside` returned
  sample_s: float  # what the samples at the end take, compiled (a `measure`ment; else 0)
  ahead: Ahead  # what compiles once training runs (on a CPU)


def side_by_side(programs: Programs, cfg: ml_collections.ConfigDict, corpus: Corpus, hooks: Hooks,
                 beside: Callable[[], Any], measure: bool = False) -> Ready:
  """Compiles `programs`' train step here (unless compiled already) while a pool runs `beside`
  and, on an accelerator, the extras (the eval step, the checksums, the samples' programs, the
  hooks' imports); elsewhere those follow here only for a `measure`ment (a time budget's plan
  needs them compiled, the samples timed), and are otherwise left to `Ahead`. Returns once all
  of it is done."""
  # The eval step compiled as the run places its states and batches: the first evaluation finds it cached.
  placed = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        programs.abstract, programs.shardings)
  extras = {"hooks": hooks.prepare,  # in the order needed
            "eval": lambda: programs.eval_step.lower(placed, programs.batch_spec()).compile(),
            "checkpoints": lambda: store.compile_survey(programs.abstract, programs.shardings)}
  if jax.process_index() == 0 and samples.wanted(cfg.sample):  # process 0 samples
    extras["samples"] = lambda: samples.warm(cfg.sample, cfg.model.seq_len, cfg.seed,
                                             programs.abstract, corpus.val, corpus.tokenizer, measure)
  if jax.process_index() == 0:  # the loss plot (hooks.prepare imports it too, before on_start)
    extras["plot"] = lambda: importlib.import_module("matplotlib.figure")
  parallel = programs.mesh.devices.flat[0].platform != "cpu"  # a CPU: its cores compile the step
  # Traced before the pool starts: tracing holds the GIL, which the pool's tracing and imports
  # would share with it; XLA's compile, the longest part, then runs beside them without it.
  lowered = None if isinstance(programs.train_step, jax.stages.Compiled) else \
      programs.lower_train()
  with allocator.purging(), concurrent.futures.ThreadPoolExecutor(4 if parallel else 1) as pool:
    job = pool.submit(beside)
    jobs = {name: pool.submit(extra) for name, extra in extras.items()} if parallel else {}
    train_step = programs.train_step if lowered is None else lowered.compile()
    made, done = job.result(), {name: j.result() for name, j in jobs.items()}
  if measure and not parallel:
    done = {name: extra() for name, extra in extras.items()}
  later = {} if parallel or measure else {k: v for k, v in extras.items() if k != "hooks"}
  return Ready(dataclasses.replace(programs, train_step=train_step), made, done.get("samples", 0.0),
               Ahead(later))
