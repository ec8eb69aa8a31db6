"""The optimizer around the one optim.name names (core/registry.py): the built-ins AdamW, and Muon
on the hidden matrices with AdamW on the rest, or a user's; warmup, then the schedule optim.schedule
names (built-in: cosine, warmup-stable-decay, constant); global gradient-norm clipping and
accumulation; the matmul FLOPs of one optimizer step (Muon's orthogonalization)."""

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxtrain.core import registry
from jaxtrain.core.registry import decorator as _builtin
from jaxtrain.system.errors import UserError


def _options(optim, component: "registry.Component") -> dict:
  """A schedule's or optimizer's options: an `Optimizer`'s, else (a config's section) their defaults."""
  return dict(dict(getattr(optim, "options", ())).get(component.name, component.options))


def schedule_args(optim, max_steps: int, offset: float = 0.0, rate: float = 1.0) -> np.ndarray:
  """float32 [decay_start, per_step, offset, rate]: where the decay of a run of `max_steps` starts,
  the share of it each step covers, and the schedule's step, `offset + rate * step` (a time budget
  whose end moved warps it, loop/budget.py). An input of the train step rather than constants, so
  that one compiled step serves every end. `optim`: the config's section or an `Optimizer`."""
  decay_end = max(optim.decay_steps or max_steps, optim.warmup_steps + 1)
  start = registry.get("schedule", optim.schedule).start or after_warmup
  start, span = start(optim, decay_end)
  # The reciprocal, as XLA makes of a division by a constant: the same bits as a step that had
  # the end compiled in.
  return np.array([start, np.float32(1) / np.float32(span), offset, rate], np.float32)


def after_warmup(optim, decay_end: int) -> tuple[float, float]:
  """Where a schedule's decay starts, and how many steps it takes: from the warmup's end to the
  run's (a schedule's `start` by default)."""
  return optim.warmup_steps, decay_end - optim.warmup_steps


def lr_schedule(optim, max_steps: int, peak: float | None = None,
                args: jax.Array | np.ndarray | None = None) -> optax.Schedule:
  """Linear warmup to `peak` (default `optim.lr`; step 0 already moves), then the schedule
  `optim.schedule` names, of the progress through the decay (0 -> 1: cosine decay to `peak *
  min_lr_ratio` at the end, "wsd" constant, then a linear decay to it over the last
  `decay_fraction` of the steps, "constant", or a user's). `optim`: the config's section or an
  `Optimizer`; `args`: `schedule_args` (default: those of `max_steps`), traced in a compiled step."""
  peak = optim.lr if peak is None else peak
  warmup = optim.warmup_steps
  after = registry.get("schedule", optim.schedule)
  options = _options(optim, after)
  args = schedule_args(optim, max_steps) if args is None else args

  def schedule(count):
    decay_start, per_step, offset, rate = args[0], args[1], args[2], args[3]
    # 0 + 1 * count is count exactly: an unwarped schedule is the plain one, bit for bit.
    step = offset + rate * jnp.asarray(count, jnp.float32)
    warm_lr = peak * (step + 1) / (warmup + 1)
    progress = jnp.clip((step - decay_start) * per_step, 0.0, 1.0)
    return jnp.where(step < warmup, warm_lr, registry.call(after, progress, peak, optim,
                                                           options=tuple(options.items())))

  return schedule


@_builtin("schedule", "cosine", {}, builtin=True)
def cosine(progress, peak: float, optim):
  end = peak * optim.min_lr_ratio
  return end + 0.5 * (peak - end) * (1 + jnp.cos(jnp.pi * progress))


def _wsd_start(optim, decay_end: int) -> tuple[float, float]:
  start = max(optim.warmup_steps, decay_end - optim.decay_fraction * decay_end)
  return start, max(decay_end - start, 1)


@_builtin("schedule", "wsd", {}, builtin=True, start=_wsd_start)
def wsd(progress, peak: float, optim):
  end = peak * optim.min_lr_ratio
  return peak + (end - peak) * progress


@_builtin("schedule", "constant", {}, builtin=True)
def constant(progress, peak: float, optim):
  return jnp.asarray(peak, jnp.float32)


def decay_mask(params):
  """Weight decay applies to matrices only: norm scales and other vectors are left alone."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def _matrix_dims(updates):
  return jax.tree.map(lambda _: optax.contrib.MuonDimensionNumbers(), updates)


def scale_by_muon(ns_steps: int, beta: float) -> optax.GradientTransformation:
  """optax's Muon (Nesterov momentum, its default Newton-Schulz coefficients), the iterations run
  as a loop (one coefficient row each, which optax scans over) rather than `ns_steps` unrolled
  copies, which XLA would compile once each. The state keeps optax's layout (one row), so
  checkpoints are the same either way."""
  kwargs = dict(ns_steps=ns_steps, beta=beta, nesterov=True, weight_dimension_numbers=_matrix_dims)
  single = optax.contrib.scale_by_muon(**kwargs)
  looped = optax.contrib.scale_by_muon(ns_coeffs=(MUON_NS_COEFFS,) * ns_steps, **kwargs)

  def update(updates, state, params=None):
    rows = jnp.broadcast_to(state.ns_coeffs, (ns_steps, 3))
    updates, new = looped.update(updates, state._replace(ns_coeffs=rows), params)
    return updates, new._replace(ns_coeffs=state.ns_coeffs)

  return optax.GradientTransformation(single.init, update)


MUON_NS_COEFFS = (3.4445, -4.7750, 2.0315)  # optax's default Newton-Schulz coefficients


def param_groups(params) -> dict:
  """Each param's group for Muon: "embedding" (token and position embeddings), "head" (an
  untied output projection), "matrix" (the blocks' kernels) or "vector" (norm scales)."""
  def group(path, p) -> str:
    names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
    if names & {"wte", "wpe"}:
      return "embedding"
    if names & {"conv_attn", "conv_mlp", "x0_scale"}:
      return "vector"
    if "lm_head" in names:
      return "head"
    return "matrix" if p.ndim == 2 else "vector"
  return jax.tree_util.tree_map_with_path(group, params)


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
  name: str = "adamw"
  schedule: str = "cosine"
  decay_fraction: float = 0.2
  matrix_lr: float = 0.02
  momentum: float = 0.95
  muon_ns_steps: int = 5  # Newton-Schulz iterations of Muon's orthogonalization
  z_loss: float = 0.0  # the loss that trains adds z_loss x mean(log Z^2) (core/steps.py)

  loss_term: str = ""  # an extension's term (@jt.loss) the loss that trains adds
  # The options of the components above that have some: ((component, ((option, value), ...)), ...)
  options: tuple = ()

  def options_of(self, component: str) -> tuple:
    return dict(self.options).get(component, ())

  def transformation(self, schedule: jax.Array | None = None) -> optax.GradientTransformation:
    """The optimizer with its schedule and clipping, accumulated over grad_accum micro-batches.
    `schedule`: the schedule's `schedule_args` (default: those of `max_steps`)."""
    parts = [optax.clip_by_global_norm(self.clip_norm)] if self.clip_norm > 0 else []
    component = registry.get("optimizer", self.name)
    tx = registry.call(component, Rate(self, schedule), self, options=self.options_of(self.name))
    if not isinstance(tx, optax.GradientTransformation):
      raise UserError(f"optim.name={self.name}: the optimizer ({component.where}) returned "
                      f"{type(tx).__name__}, not an optax.GradientTransformation; return one "
                      "(e.g. optax.lion(lr, ...))")
    inner = optax.chain(*parts, tx)
    # With loss scaling, gradients overflow now and then by design: such steps are dropped.
    skip = self.skip_nonfinite or self.loss_scaling
    if self.grad_accum == 1 and not skip:
      return inner
    # MultiSteps averages grad_accum micro-batch gradients, then applies one inner update.
    multi = optax.MultiSteps(inner, every_k_schedule=self.grad_accum)
    return skip_nonfinite_steps(multi) if skip else multi.gradient_transformation()


class Rate:
  """The learning rate an optimizer is given: `lr(count)`, warmup then the schedule, to the peak
  optim.lr; `lr.at(peak)` the same schedule to another peak (Muon's matrices: optim.matrix_lr)."""

  def __init__(self, optimizer: Optimizer, args: jax.Array | None, peak: float | None = None):
    self.optimizer, self.args = optimizer, args
    self.schedule = lr_schedule(optimizer, optimizer.max_steps, peak, args)

  def __call__(self, count):
    return self.schedule(count)

  def at(self, peak: float) -> "Rate":
    return Rate(self.optimizer, self.args, peak)


@_builtin("optimizer", "adamw", {}, builtin=True)
def adamw(lr: Rate, o: Optimizer, weight_decay: float | None = None) -> optax.GradientTransformation:
  return optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps,
                     weight_decay=o.weight_decay if weight_decay is None else weight_decay,
                     mask=decay_mask)


def muon_flops(o: Optimizer, params) -> int:
  """Matmul FLOPs of Muon's orthogonalization of each "matrix" param in a step."""
  groups = jax.tree.leaves(param_groups(params))
  return sum(newton_schulz_flops(p.shape, o.muon_ns_steps)
             for p, g in zip(jax.tree.leaves(params), groups, strict=True) if g == "matrix")


@_builtin("optimizer", "muon", {}, builtin=True, flops=muon_flops)
def muon(lr: Rate, o: Optimizer) -> optax.GradientTransformation:
  """Muon for the blocks' matrices; AdamW at lr for the embeddings, an untied head and the
  vectors. The matrices and the head decay at weight_decay; the embeddings and vectors never."""
  matrix = optax.chain(
      # Kernels are [d_in, d_out]: axis 0 is reduced, as Muon's default assumes. Given as a
      # function, since inside `partition` the other groups' leaves are placeholders.
      scale_by_muon(o.muon_ns_steps, o.momentum),
      optax.add_decayed_weights(o.weight_decay),
      optax.scale_by_learning_rate(lr.at(o.matrix_lr)))
  return optax.partition({
      "matrix": matrix,
      "embedding": adamw(lr, o, 0.0),
      "head": adamw(lr, o),
      "vector": adamw(lr, o, 0.0),
  }, param_groups)


def make_optimizer(optim: ml_collections.ConfigDict, *, max_steps: int, grad_accum: int = 1,
                   skip_nonfinite: bool = False, loss_scaling: bool = False,
                   ext=None) -> Optimizer:
  """The `optim` section's optimizer for a run of `max_steps` optimizer steps; `ext`: the config's
  ext section, whose options of the optimizer, schedule and loss term it takes."""
  names = sorted({optim.name, optim.schedule, optim.loss_term} - {""})
  given = dict(max_steps=max_steps, grad_accum=grad_accum, skip_nonfinite=skip_nonfinite,
               loss_scaling=loss_scaling,
               options=tuple((n, o) for n in names if (o := registry.options_of(ext, n))))
  return Optimizer(**given, **{f.name: optim[f.name] for f in dataclasses.fields(Optimizer)
                               if f.name not in given})


def newton_schulz_flops(shape: tuple[int, ...], ns_steps: int) -> int:
  """Matmul FLOPs of optax's Newton-Schulz orthogonalization of one [a, b] kernel (leading axes:
  a batch). X is [m, n], m = min(a, b); each iteration forms A = X X^T (2 m^2 n), A A (2 m^3) and
  (c1 A + c2 A A) X (2 m^2 n)."""
  m, n = sorted(shape[-2:])
  return math.prod(shape[:-2]) * ns_steps * (4 * m * m * n + 2 * m**3)


def flops_per_step(opt: Optimizer, params) -> int:
  """Matmul FLOPs of one optimizer step over `params` (arrays or their shapes), as the optimizer's
  `flops` counts them (Muon's orthogonalization); 0 where it has none. AdamW's and the momentum's
  elementwise updates, a few FLOPs per parameter, are not counted, as the model's count leaves out
  norms and activations."""
  flops = registry.get("optimizer", opt.name).flops
  return 0 if flops is None else int(flops(opt, params))


class SkipState(NamedTuple):
  multi: optax.MultiStepsState
  poisoned: jax.Array  # a micro-batch of the current optimizer step had a non-finite gradient
  skipped: jax.Array  # optimizer steps dropped so far


def skip_nonfinite_steps(multi: optax.MultiSteps) -> optax.GradientTransformation:
  """Drops a whole optimizer step when any of its micro-batches has a non-finite gradient: the bad
  micro-batch enters MultiSteps' accumulator as zeros (a NaN would stay there), and the step's
  update and inner state are thrown away. Counters (and so the data position) still advance."""

  def init(params):
    return SkipState(multi.init(params), jnp.array(False), jnp.array(0, jnp.int32))

  def update(grads, state, params=None):
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    safe = optax.tree.where(finite, grads, optax.tree.zeros_like(grads))
    updates, new_multi = multi.update(safe, state.multi, params)
    poisoned = state.poisoned | ~finite
    drop = (new_multi.mini_step == 0) & poisoned
    updates = optax.tree.where(drop, optax.tree.zeros_like(updates), updates)
    inner = optax.tree.where(drop, state.multi.inner_opt_state, new_multi.inner_opt_state)
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
