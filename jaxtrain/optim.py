"""AdamW with linear warmup, cosine decay, global-norm clipping and gradient accumulation."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax


def lr_schedule(optim, max_steps: int) -> optax.Schedule:
  """Linear warmup to `lr` (step 0 already moves), then cosine decay to `lr * min_lr_ratio`.
  `optim`: the config's section or an `Optimizer`."""
  peak, warmup = optim.lr, optim.warmup_steps
  end = peak * optim.min_lr_ratio
  decay_end = max(optim.decay_steps or max_steps, warmup + 1)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm_lr = peak * (step + 1) / (warmup + 1)
    progress = jnp.clip((step - warmup) / (decay_end - warmup), 0.0, 1.0)
    cos_lr = end + 0.5 * (peak - end) * (1 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < warmup, warm_lr, cos_lr)

  return schedule


def decay_mask(params):
  """Weight decay applies to matrices only: norm scales and other vectors are left alone."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """One run's optimizer settings. A value, not a function: equal settings compare equal, so
  states built separately from one config share their static structure and compiled steps."""

  lr: float
  min_lr_ratio: float
  warmup_steps: int
  decay_steps: int
  weight_decay: float
  clip_norm: float
  b1: float
  b2: float
  eps: float
  max_steps: int
  grad_accum: int = 1
  skip_nonfinite: bool = False
  loss_scaling: bool = False  # dynamic loss scaling is on: overflowing steps are dropped

  def transformation(self) -> optax.GradientTransformation:
    """AdamW with the schedule and clipping, accumulated over grad_accum micro-batches."""
    parts = [optax.clip_by_global_norm(self.clip_norm)] if self.clip_norm > 0 else []
    parts.append(optax.adamw(lr_schedule(self, self.max_steps), b1=self.b1, b2=self.b2,
                             eps=self.eps, weight_decay=self.weight_decay, mask=decay_mask))
    inner = optax.chain(*parts)
    # With loss scaling, gradients overflow now and then by design: such steps are dropped.
    skip = self.skip_nonfinite or self.loss_scaling
    if self.grad_accum == 1 and not skip:
      return inner
    # MultiSteps averages grad_accum micro-batch gradients, then applies one inner update.
    multi = optax.MultiSteps(inner, every_k_schedule=self.grad_accum)
    return skip_nonfinite_steps(multi) if skip else multi.gradient_transformation()


def make_optimizer(optim: ml_collections.ConfigDict, *, max_steps: int, grad_accum: int = 1,
                   skip_nonfinite: bool = False, loss_scaling: bool = False) -> Optimizer:
  """The `optim` section's optimizer for a run of `max_steps` optimizer steps."""
  return Optimizer(lr=optim.lr, min_lr_ratio=optim.min_lr_ratio, warmup_steps=optim.warmup_steps,
                   decay_steps=optim.decay_steps, weight_decay=optim.weight_decay,
                   clip_norm=optim.clip_norm, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                   max_steps=max_steps, grad_accum=grad_accum, skip_nonfinite=skip_nonfinite,
                   loss_scaling=loss_scaling)


class SkipState(NamedTuple):
  multi: optax.MultiStepsState
  poisoned: jax.Array  # a micro-batch of the current optimizer step had a non-finite gradient
  skipped: jax.Array  # optimizer steps dropped so far


def skip_nonfinite_steps(multi: optax.MultiSteps) -> optax.GradientTransformation:
  """Drops a whole optimizer step when any of its micro-batches has a non-finite gradient.

  A NaN must never reach MultiSteps' accumulator: it would stay there for every later step. So
  the bad micro-batch enters as zeros, and when the step completes, its update and the inner
  optimizer state are thrown away. Counters (and so the data position) still advance.
  """

  def init(params):
    return SkipState(multi.init(params), jnp.array(False), jnp.array(0, jnp.int32))

  def update(grads, state, params=None):
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    safe = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
    updates, new_multi = multi.update(safe, state.multi, params)
    poisoned = state.poisoned | ~finite
    drop = (new_multi.mini_step == 0) & poisoned
    updates = jax.tree.map(lambda u: jnp.where(drop, jnp.zeros_like(u), u), updates)
    inner = jax.tree.map(lambda old, new: jnp.where(drop, old, new),
                         state.multi.inner_opt_state, new_multi.inner_opt_state)
    new_multi = new_multi._replace(inner_opt_state=inner)
    return updates, SkipState(new_multi, poisoned & (new_multi.mini_step != 0),
                              state.skipped + drop.astype(jnp.int32))

  return optax.GradientTransformation(init, update)


def is_update_step(opt_state) -> jax.Array:
  """True when the update that produced `opt_state` completed an optimizer step."""
  if isinstance(opt_state, SkipState):
    opt_state = opt_state.multi
  if isinstance(opt_state, optax.MultiStepsState):
    return opt_state.mini_step == 0
  return jnp.array(True)


def skipped_steps(opt_state) -> jax.Array:
  return opt_state.skipped if isinstance(opt_state, SkipState) else jnp.array(0, jnp.int32)
