"""`train.time_budget`: train for a given wall time rather than a step count.

A new run measures itself first: it compiles its train step and times a few steps on random
tokens (the speed does not depend on their values), then fixes `train.max_steps` so that the
steps, their evaluations and the end of the run (a second compile, samples) fit the budget,
counted from the start of the process. The schedule (warmup, decay) then spans exactly those
steps, and the chosen number is the run's `train.max_steps` in config.json, so a resume trains
to the same step as an uninterrupted run.
"""

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import ml_collections

from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.core import programs as programs_lib
from jaxtrain.system import fmt, paths

EVAL_COST = 0.35  # a forward pass costs about a third of a forward and backward pass
END_S = 2.0  # closing work besides sampling: the loss plot, the last save's wait


def process_age_s() -> float:
  """Seconds since this process started (Linux), else 0: the budget covers the whole command."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError):
    return 0.0


def measure(programs, batches: Iterator[dict], grad_accum: int, min_s: float = 2.0,
            max_steps: int = 20) -> tuple[float, float, float]:
  """(seconds to compile the train step, seconds per optimizer step, seconds a checkpoint save
  holds the loop) of `programs` as the loop runs them: `batches` (host batches, an iterator of
  the run's own kind) read, placed and stepped, each step's metrics read back, and the state
  saved as the loop saves it. For a small model that host work is most of a step."""
  t0 = time.perf_counter()
  step = programs.compile_train()
  compile_s = time.perf_counter() - t0
  state = programs.init()

  def one(state):
    for _ in range(grad_accum):
      state, m = step(state, programs.place(next(batches)))
    jax.device_get(m)
    return state

  state = one(state)  # the first run of a compiled program pays extra
  times, t_end = [], time.perf_counter() + min_s
  while len(times) < 3 or (time.perf_counter() < t_end and len(times) < max_steps):
    t = time.perf_counter()
    state = one(state)
    times.append(time.perf_counter() - t)
  return compile_s, statistics.median(times), _save_s(state)


def _save_s(state) -> float:
  """What one checkpoint save costs the loop (the copy and checksums; the write is async): the
  second of two saves, the first having compiled the checksums."""
  with tempfile.TemporaryDirectory(prefix="jaxtrain-probe-") as tmp:
    ckpts = Checkpoints(tmp, keep=1)
    try:
      took = []
      for step in (1, 2):
        t = time.perf_counter()
        ckpts.save(state.replace(step=step))
        took.append(time.perf_counter() - t)
    finally:
      ckpts.close()
  return took[-1]


def fit_steps(budget_s: float, spent_s: float, compile_s: float, step_s: float, train,
              sample_s: float = 0.0, save_s: float = 0.0) -> int:
  """The optimizer steps that fit what is left of the budget: each step with its share of the
  evaluations (every `train.eval_every` steps, `eval_steps` forward passes of one micro-batch)
  and of the checkpoint saves, then the real train step's compile and the end of the run."""
  left = budget_s - spent_s - compile_s - END_S - sample_s
  eval_per_step = EVAL_COST * train.eval_steps * step_s / train.grad_accum / train.eval_every
  return max(1, int(left / (step_s + eval_per_step + save_s / train.checkpoint_every)))


def fit(cfg: ml_collections.ConfigDict, programs: programs_lib.Programs, devices: list,
        workdir: Path, log: Callable[[str], None], spent: Callable[[], float],
        batches: Callable[[], Iterator[dict]]) -> programs_lib.Programs:
  """`train.time_budget`: sets `cfg.train.max_steps` to the steps that fit (measured by a new
  run; a resumed run keeps those its first leg chose) and builds the programs for them."""
  if paths.is_run(workdir):
    cfg.train.max_steps = int(paths.read_json(workdir / "config.json")["train"]["max_steps"])
  else:
    budget_s = fmt.parse_duration(cfg.train.time_budget)
    compile_s, step_s, save_s = measure(programs, batches(), cfg.train.grad_accum)
    sample_s = compile_s if cfg.sample.num_samples and cfg.sample.max_new_tokens else 0.0
    spent_s = spent()
    cfg.train.max_steps = fit_steps(budget_s, spent_s, compile_s, step_s, cfg.train, sample_s,
                                    save_s)
    log(f"time budget {fmt.duration(budget_s)}: train.max_steps={cfg.train.max_steps} fit "
        f"({step_s * 1e3:.1f} ms/step, {save_s * 1e3:.0f} ms/save and a {compile_s:.1f}s compile "
        f"measured; {fmt.duration(spent_s)} spent so far)")
  m = programs.model_cfg
  return programs_lib.build(cfg, m.vocab_size, devices, eot_id=m.eot_id)
