"""What the training loop carries from step to step (`Progress`), and how a leg starts it: the
meters, the learning-rate schedule for the log, and the placed evaluation batches."""

import dataclasses
import time

import jax
import numpy as np

from jaxtrain.core import optim
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
  schedule: object  # jitted: the learning rate at a step
  eval_set: list[dict]  # the same placed validation batches at every evaluation
  bpb: float  # val_bpb / val_loss over eval_set (data.bits_per_byte)
  eval_weights: np.ndarray | None  # targets in the loss per eval batch (completions only); None: all
  pending: tuple[int, list[dict]] | None = None  # a step whose metrics are still on the device
  last_loss: float | None = None
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
      schedule=jax.jit(optim.lr_schedule(cfg.optim, t.max_steps)),
      eval_set=sets[0].batches, bpb=sets[0].bpb, source_sets=sets[1:],
      eval_weights=data.eval_weights(r.corpus, t.batch_size, cfg.model.seq_len, cfg.seed,
                                     t.eval_steps))
