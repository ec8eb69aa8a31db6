"""What the training loop carries from step to step (`Progress`), and how a leg starts it: the
meters, the steps still running on the device, and the placed evaluation batches."""

import collections
import dataclasses
import time
from collections.abc import Callable

import jax
import numpy as np

from jaxtrain.core import stats as stats_lib
from jaxtrain.core.model import flops_per_token
from jaxtrain.data import corpus as data
from jaxtrain.data import mixture
from jaxtrain.loop import estimate, memory, monitor


@dataclasses.dataclass
class Progress:
  """What the loop carries from step to step."""

  step: int
  elapsed_before: float  # training seconds of earlier legs of this run
  t_run: float  # when this leg's training began
  best: monitor.BestVal
  guard: monitor.NonFiniteGuard
  meter: monitor.Throughput
  eval_set: list[dict]  # the same placed validation batches at every evaluation
  bpb: float  # val_bpb / val_loss over eval_set (data.bits_per_byte)
  eval_weights: np.ndarray | None  # targets in the loss per eval batch (completions only); None: all
  # (step, its micro-batches' metrics) not yet read from the device, oldest first
  pending: list[tuple[int, list[dict]]] = dataclasses.field(default_factory=list)
  # micro-batch metrics of train steps that may still be queued, oldest first (train._keep_up)
  in_flight: collections.deque = dataclasses.field(default_factory=collections.deque)
  log_due: int | None = None  # a step whose log line waits for the next step to be queued
  last_loss: float | None = None
  last_lr: float | None = None
  last_val: float | None = None
  speed_said: bool = False  # the first speed reading gets a line of its own
  mem_watch: memory.Watch = dataclasses.field(default_factory=memory.Watch)
  source_sets: list = dataclasses.field(default_factory=list)  # data.mixture's, placed

  def elapsed(self) -> float:
    return self.elapsed_before + time.time() - self.t_run


def start(r, state, elapsed_before: float, best_val: float) -> Progress:
  """The loop's state at the start of a leg: `r` is train.Run, `state` the restored or new state."""
  cfg, t = r.cfg, r.cfg.train
  dtype = r.programs.model_cfg.dtype
  sets = mixture.eval_sets(r.corpus, t.batch_size, cfg.model.seq_len, cfg.seed, t.eval_steps,
                           jax.process_index(), jax.process_count())
  sets = [dataclasses.replace(s, batches=[r.programs.place(b) for b in s.batches]) for s in sets]
  return Progress(
      step=int(state.step), elapsed_before=elapsed_before, t_run=time.time(),
      best=monitor.BestVal(best_val),
      guard=monitor.NonFiniteGuard(t.skip_nonfinite, r.programs.abstract.dynamic_loss_scale),
      meter=monitor.Throughput(t.batch_size * t.grad_accum * cfg.model.seq_len,
                               flops_per_token(r.programs.model_cfg), t.max_steps,
                               peak=lambda achieved: estimate.peak_flops(jax.devices(), dtype,
                                                                          achieved)[0]),
      eval_set=sets[0].batches, bpb=sets[0].bpb, source_sets=sets[1:],
      eval_weights=data.eval_weights(r.corpus, t.batch_size, cfg.model.seq_len, cfg.seed,
                                     t.eval_steps))


def read(p: Progress, say: Callable[[str], None], upto: int | None = None,
         stats: dict | None = None) -> float | None:
  """Reads the pending steps' metrics up to step `upto` (default: all), waiting for them, and
  checks each for non-finite values (a note goes to `say`); returns the last one's gradient norm.
  Its per-group statistics are copied from the device only when asked (into `stats`)."""
  n = sum(1 for step, _ in p.pending if upto is None or step <= upto)
  if n == 0:
    return None
  due, p.pending = p.pending[:n], p.pending[n:]
  keep = lambda k, last: not stats_lib.is_stat(k) or (last and stats is not None)  # noqa: E731
  host = jax.device_get([[{k: v for k, v in m.items() if keep(k, i == n - 1)} for m in micro]
                         for i, (_, micro) in enumerate(due)])
  for (step, _), micro_host in zip(due, host):
    loss, grad_norm, note = p.guard.check(step, micro_host)
    if note:
      say(note)
  if stats is not None:
    stats.update(stats_lib.combine(host[-1]))
  p.last_loss, p.last_lr = loss, float(host[-1][-1]["lr"])
  return grad_norm
