"""A training run's evaluation, every `train.eval_every` steps and at its last, in one record: the
val loss (perplexity, bits per byte) on the same placed batches each time, each `data.mixture`
source's (val/<source>/loss, val/<source>/bpb), and the scores of `train.eval_tasks` (tasks.py)."""

import dataclasses
import math
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from jaxtrain.core.programs import Programs
from jaxtrain.core.steps import TrainState
from jaxtrain.data import corpus
from jaxtrain.data.corpus import EvalSet
from jaxtrain.evals import tasks as tasks_lib
from jaxtrain.system import runtime

Stopped = tasks_lib.Stopped  # an evaluation given up part way: the run is stopping


@dataclasses.dataclass
class Validation:
  """What a run scores at each evaluation, and when: `should_eval`."""

  every: int  # train.eval_every
  own: EvalSet  # the run's, placed on the devices: the same batches at every evaluation
  scope: str  # what the loss is on where not every token ("completions"), else ""
  sources: list[EvalSet] = dataclasses.field(default_factory=list)  # data.mixture's, placed
  tasks: list[tasks_lib.Task] = dataclasses.field(default_factory=list)  # train.eval_tasks'
  tokenizer: object = None  # the run's, for the tasks

  def should_eval(self, step: int, end: int) -> bool:
    """Every `every` steps, and at the run's last step (`end`: the loop's train.max_steps)."""
    return step % self.every == 0 or step == end

  def score(self, programs: Programs, state: TrainState, step: int,
            elapsed_s: Callable[[], float], say: Callable[[str], None],
            stopping: Callable[[], bool]) -> dict:
    """The evaluation record of `state` (at `step`), its lines said; `elapsed_s()`: the run's
    training seconds so far. Every process takes part. `stopping()` is asked between batches (a
    collective where there are several processes); True raises `Stopped`."""
    val = weighted_loss(programs, state, self.own, stopping)
    ppl = math.exp(min(val, 50))
    on = f" on {self.scope}" if self.scope and self.own.weights is not None else ""
    bpb = {} if math.isnan(self.own.bpb) else {"val_bpb": val * self.own.bpb}  # nan: no bytes (ids)
    say(f"eval step {step}: val loss{on} {val:.4f} | perplexity {ppl:.2f}"
        + (f" | {bpb['val_bpb']:.4f} bits/byte" if bpb else ""))
    record = {"step": step, "val_loss": val, "val_ppl": ppl, **bpb,
              "elapsed_s": round(elapsed_s(), 3)}
    if self.sources:
      by, line = by_source(programs, state, self.sources, stopping)
      record.update(by)
      say(f"eval step {step} by source: {line}")
    if self.tasks:
      # Process 0 alone scores the tasks: a collective `stopping` would wait for the others.
      alone = stopping if jax.process_count() == 1 else lambda: False
      record.update(tasks_lib.score(self.tasks, state, self.tokenizer, say, alone))
    return record


def prepare(cfg: ml_collections.ConfigDict, data: corpus.Corpus, place: Callable[[dict], dict],
            eval_tasks: list[tasks_lib.Task] = ()) -> Validation:
  """The run's validation set (and each source's), read and placed on the devices."""
  t = cfg.train
  sets = corpus.eval_sets(data, t.batch_size, cfg.model.seq_len, cfg.seed, t.eval_steps,
                          jax.process_index(), jax.process_count())
  sets = [dataclasses.replace(s, batches=[place(b) for b in s.batches]) for s in sets]
  return Validation(every=t.eval_every, own=sets[0], scope=corpus.loss_scope(cfg.data),
                    sources=sets[1:], tasks=list(eval_tasks), tokenizer=data.tokenizer)


def weighted_loss(programs: Programs, state: TrainState, s: EvalSet,
                  stopping: Callable[[], bool]) -> float:
  """The mean loss over the set's batches; with its weights (targets per batch), per target."""
  losses = []
  for batch in s.batches:
    if stopping():
      raise tasks_lib.Stopped
    losses.append(programs.eval_step(state, batch)["loss"])
    runtime.throttle(losses)
  losses = np.asarray(jax.device_get(losses))
  return float(np.mean(losses) if s.weights is None
               else (losses * s.weights).sum() / max(s.weights.sum(), 1.0))


def by_source(programs: Programs, state: TrainState, sets: list[EvalSet],
              stopping: Callable[[], bool]) -> tuple[dict, str]:
  """({"val/<name>/loss": mean loss over the set's batches, "val/<name>/bpb": in bits per byte},
  the line that says them: `books 1.2345 (1.7810 bits/byte) | notes ...`)."""
  record, parts = {}, []
  for s in sets:
    loss = weighted_loss(programs, state, s, stopping)
    record.update({f"val/{s.name}/loss": loss, f"val/{s.name}/bpb": loss * s.bpb})
    parts.append(f"{s.name} {loss:.4f} ({loss * s.bpb:.4f} bits/byte)")
  return record, " | ".join(parts)

