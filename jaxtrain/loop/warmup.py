"""What a run compiles before its first step, side by side (`side_by_side`): the train step on the
calling thread and, in a pool beside it, the eval step, the programs of the samples at the end
(where the run samples), the libraries the hooks import on first use, and whatever setup does
meanwhile (a new state's init, or a restore). XLA compiles, orbax reads and much of an import run
without the GIL, so where cores are spare the first step waits for the slowest of them rather
than for their sum, and neither the first evaluation nor the samples stop a run under way to
compile (the first eval's compile cost an H100 run 7 s mid-run). The pool has a thread a spare
core: on 2 cores, its jobs run one after another beside the train step's compile."""

import concurrent.futures
import dataclasses
import os
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
  sample_s: float  # what the samples at the end take, compiled (`time_samples`; else 0)


def side_by_side(programs: Programs, cfg: ml_collections.ConfigDict, corpus: Corpus, hooks: Hooks,
                 beside: Callable[[], Any] | None = None, time_samples: bool = False) -> Ready:
  """Compiles `programs`' train step here (unless compiled already) while the pool compiles the
  rest, prepares the hooks and runs `beside`; returns once all of it is done. `time_samples`: the
  samples are made once too, to time them (a time budget's plan needs it)."""
  sampling = jax.process_index() == 0 and samples.wanted(cfg.sample)  # process 0 samples
  # Traced before the pool starts: tracing holds the GIL, which the pool's tracing and imports
  # would share with it; XLA's compile, the longest part, then runs beside them without it.
  lowered = None if isinstance(programs.train_step, jax.stages.Compiled) else \
      programs.lower_train()
  with concurrent.futures.ThreadPoolExecutor(spare_cores()) as pool:
    jobs = [pool.submit(beside or (lambda: None)), pool.submit(hooks.prepare),
            pool.submit(compile_eval, programs)]  # in the order the run needs them
    if sampling:
      jobs.append(pool.submit(samples.warm, cfg.sample, cfg.model.seq_len, cfg.seed,
                              programs.abstract, corpus.val, corpus.tokenizer, time_samples))
    train_step = programs.train_step if lowered is None else lowered.compile()
    done = [job.result() for job in jobs]
  return Ready(dataclasses.replace(programs, train_step=train_step), done[0],
               done[3] if sampling else 0.0)


def spare_cores() -> int:
  """The pool's threads: one a core beside the train step's compile, at most 4. More compiles at
  once than cores cost more CPU in all (on 2 busy cores, train, init and eval step compiled at
  once took ~15% more CPU seconds than one after another) and so delay the first step."""
  return max(1, min(4, len(os.sched_getaffinity(0)) - 1))


def compile_eval(programs: Programs) -> None:
  """The eval step compiled for states and batches placed as the run places them: its jitted
  function then finds it in its cache at the first evaluation."""
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       programs.abstract, programs.shardings)
  programs.eval_step.lower(state, programs.batch_spec()).compile()
