"""What a run compiles before its first step, side by side (`side_by_side`): the train step on the
calling thread and, in a pool beside it, what setup does meanwhile (a new state's init, or a
restore); on an accelerator also the eval step, the samples' programs and the hooks' imports.
XLA compiles, orbax reads and much of an import run without the GIL, so the first step waits for
the slowest of them rather than their sum, and no evaluation or sampling stops the run to compile.
On a CPU, whose cores the train step's compile keeps busy, those wait until the run (or a time
budget's measurement) needs them."""

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from jaxtrain.core.programs import Programs
from jaxtrain.data.corpus import Corpus
from jaxtrain.generation import samples
from jaxtrain.trackers.hooks import Hooks


@dataclasses.dataclass
class Ready:
  """What `side_by_side` made ready."""

  programs: Programs  # the train step compiled (a `Compiled`), the eval step's compile cached
  beside: Any  # what `beside` returned
  sample_s: float  # what the samples at the end take, compiled (a `measure`ment; else 0)


def side_by_side(programs: Programs, cfg: ml_collections.ConfigDict, corpus: Corpus, hooks: Hooks,
                 beside: Callable[[], Any] | None = None, measure: bool = False) -> Ready:
  """Compiles `programs`' train step here (unless compiled already) while a pool runs `beside`
  and, where `extras_beside`, the extras (the eval step, the samples' programs, the hooks' imports);
  elsewhere those follow here only for a `measure`ment (a time budget's plan needs them compiled,
  the samples timed). Returns once all of it is done."""
  extras = {"hooks": hooks.prepare, "eval": lambda: compile_eval(programs)}  # in the order needed
  if jax.process_index() == 0 and samples.wanted(cfg.sample):  # process 0 samples
    extras["samples"] = lambda: samples.warm(cfg.sample, cfg.model.seq_len, cfg.seed,
                                             programs.abstract, corpus.val, corpus.tokenizer, measure)
  parallel = extras_beside(programs)
  # Traced before the pool starts: tracing holds the GIL, which the pool's tracing and imports
  # would share with it; XLA's compile, the longest part, then runs beside them without it.
  lowered = None if isinstance(programs.train_step, jax.stages.Compiled) else \
      programs.lower_train()
  with concurrent.futures.ThreadPoolExecutor(4 if parallel else 1) as pool:
    job = pool.submit(beside or (lambda: None))
    jobs = {name: pool.submit(extra) for name, extra in extras.items()} if parallel else {}
    train_step = programs.train_step if lowered is None else lowered.compile()
    made, done = job.result(), {name: j.result() for name, j in jobs.items()}
  if measure and not parallel:
    done = {name: extra() for name, extra in extras.items()}
  return Ready(dataclasses.replace(programs, train_step=train_step), made, done.get("samples", 0.0))


def extras_beside(programs: Programs) -> bool:
  """Whether compiles beside the train step's save time: on an accelerator, whose compile is host
  work beside an idle device, yes; on a CPU, whose cores the train step's compile keeps busy, they
  only slow it down (benchmarks/results/)."""
  return programs.mesh.devices.flat[0].platform != "cpu"


def compile_eval(programs: Programs) -> None:
  """The eval step compiled for states and batches placed as the run places them: its jitted
  function then finds it in its cache at the first evaluation."""
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       programs.abstract, programs.shardings)
  programs.eval_step.lower(state, programs.batch_spec()).compile()
