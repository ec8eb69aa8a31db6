"""The train state and the pure train and eval steps.

`train_step(state, batch) -> (state, metrics)` and `eval_step(state, batch) -> metrics` read
nothing but their arguments, so a test can call them directly, with or without `jax.jit`.
A batch is `{"tokens": int32[B, T+1]}`: inputs are tokens[:, :-1], targets tokens[:, 1:]; it may
add `"weights"`, float32[B, T], one per target (prompt/completion data: 0 for prompt tokens), and
the loss is then the mean over the weighted targets.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxtrain.core import lora as lora_lib
from jaxtrain.core import loss as loss_lib
from jaxtrain.core import model as model_lib
from jaxtrain.core import optim
from jaxtrain.core import stats as stats_lib

TRAIN_METRICS = ("loss", "grad_norm", "skipped", "loss_scale", "lr")  # what train_step reports
INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_GROWTH = 2.0 ** (1 / 1000)


@struct.dataclass
class TrainState:
  params: Any  # nested dict of float32 arrays (the NNX Param state as a pure dict)
  opt_state: optax.OptState
  step: jax.Array  # int32: optimizer steps taken (micro-batches / grad_accum)
  rng: jax.Array  # uint32[2]: raw key data for dropout
  loss_scale: jax.Array  # float32: the loss is multiplied by it before backprop (1 unless dynamic)
  # float32[4]: where the lr schedule ends (optim.schedule_args). Not saved: a run's config and a
  # time budget's plan give it again; states made from arrays get `optimizer.max_steps`'s.
  schedule: jax.Array
  graphdef: nnx.GraphDef = struct.field(pytree_node=False)
  optimizer: optim.Optimizer = struct.field(pytree_node=False)
  model_cfg: model_lib.ModelConfig = struct.field(pytree_node=False)
  lora: lora_lib.Lora | None = struct.field(pytree_node=False, default=None)  # None: all train

  @property
  def tx(self) -> optax.GradientTransformation:
    return self.optimizer.transformation(self.schedule)

  def model(self) -> model_lib.GPT:
    return nnx.merge(self.graphdef, self.params)

  def arrays(self) -> dict:
    """What a checkpoint holds: every array of the state, and nothing static."""
    return {"params": self.params, "opt_state": self.opt_state, "step": self.step, "rng": self.rng,
            "loss_scale": self.loss_scale}

  def with_arrays(self, arrays: dict) -> "TrainState":
    """A state of these arrays; from an abstract state, with the schedule of its own end."""
    schedule = self.schedule
    if isinstance(schedule, jax.ShapeDtypeStruct):
      schedule = optim.schedule_args(self.optimizer, self.optimizer.max_steps)
    return self.replace(**arrays, schedule=schedule)

  def trainable(self) -> Any:
    """The params the optimizer trains (and holds state for): LoRA's adapters, else all."""
    return lora_lib.trainable(self.params, self.lora)


def init_state(model_cfg: model_lib.ModelConfig, optimizer: optim.Optimizer, *,
               seed: int, exact_shapes: bool = False,
               lora: lora_lib.Lora | None = None) -> TrainState:
  """A fresh state from `seed` (the same params on every platform); the optimizer's `loss_scaling`
  turns on dynamic loss scaling. `exact_shapes`: see `draws.batched`; `lora`: adapters, the only
  params that train (core/lora.py)."""
  key = jax.random.PRNGKey(seed)
  param_key, dropout_key = jax.random.split(key)
  model = model_lib.init(model_cfg, param_key, exact_shapes=exact_shapes)
  if lora is not None:
    lora_lib.attach(model, lora, param_key)
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  scale = INITIAL_LOSS_SCALE if optimizer.loss_scaling else 1.0
  return TrainState(params=params,
                    opt_state=optimizer.transformation().init(lora_lib.trainable(params, lora)),
                    step=jnp.array(0, jnp.int32), rng=dropout_key,
                    loss_scale=jnp.array(scale, jnp.float32),
                    schedule=jnp.asarray(optim.schedule_args(optimizer, optimizer.max_steps)),
                    graphdef=graphdef,
                    optimizer=optimizer, model_cfg=model_cfg, lora=lora)


def loss_fn(params, graphdef: nnx.GraphDef, tokens_BT1: jax.Array,
            dropout_key: jax.Array | None = None, weights_BT: jax.Array | None = None) -> jax.Array:
  """The model's mean loss on `tokens_BT1` (weighted per target token by `weights_BT`, if given);
  with `model.loss_chunk`, without the whole batch's logits; with `model.fused_loss`, from logits
  in the compute dtype (core/loss.py)."""
  return losses(params, graphdef, tokens_BT1, dropout_key, weights_BT)[1]


def _settings(model) -> model_lib.ModelConfig:
  """How the loss is taken: the model's ModelConfig (a user's whole model may have none: the
  plain cross-entropy of its logits then)."""
  c = getattr(model, "c", None)
  return c if isinstance(c, model_lib.ModelConfig) else model_lib.ModelConfig()


def losses(params, graphdef: nnx.GraphDef, tokens_BT1: jax.Array,
           dropout_key: jax.Array | None = None, weights_BT: jax.Array | None = None,
           z_loss: float = 0.0, term: tuple = ()) -> tuple[jax.Array, jax.Array]:
  """(the loss that trains, `loss_fn`'s loss): with `z_loss`, the first adds z_loss x the
  (weighted) mean of `loss.z_terms`, with `term` (an extension's loss term and its options) its
  weighted mean; without, the two are one."""
  model = nnx.merge(graphdef, params)
  c = _settings(model)
  # A key only where dropout draws one: a user's whole model without dropout takes tokens alone.
  keyed = {"dropout_key": dropout_key} if dropout_key is not None and c.dropout > 0 else {}
  targets_BT = tokens_BT1[:, 1:]
  if c.fused_loss:
    dtype = jnp.dtype(c.dtype)
    x_BTD = model.hidden(tokens_BT1[:, :-1], **keyed).astype(dtype)
    trains_BT, ce_BT = loss_lib.fused_token_losses(x_BTD, model.head_weight().astype(dtype),
                                                   targets_BT, z_loss)
    return loss_lib.mean_loss(trains_BT, weights_BT), loss_lib.mean_loss(ce_BT, weights_BT)
  if c.loss_chunk:
    x_BTD = model.hidden(tokens_BT1[:, :-1], **keyed)
    ce_BT, z_BT = loss_lib.chunked_token_losses(x_BTD, model.head_weight(), targets_BT,
                                                model.head, c.loss_chunk, with_z=bool(z_loss),
                                                scatter_free=c.scatter_free)
    logits_BTV = None
  else:
    logits_BTV = model(tokens_BT1[:, :-1], **keyed)
    ce_BT = loss_lib.token_losses(logits_BTV, targets_BT, c.scatter_free)
    z_BT = loss_lib.z_terms(logits_BTV) if z_loss else None
  loss = loss_lib.mean_loss(ce_BT, weights_BT)
  trains = loss + z_loss * loss_lib.mean_loss(z_BT, weights_BT) if z_loss else loss
  if term:
    trains = trains + loss_lib.mean_loss(loss_lib.extra_term(term, logits_BTV, targets_BT), weights_BT)
  return trains, loss


def train_step(state: TrainState, batch: dict, stats: str = "none") -> tuple[TrainState, dict]:
  """One micro-batch: gradients, then the optimizer (which applies an update every grad_accum).
  `stats`: per-group statistics in the metrics too (stats.MODES; bound before jit)."""
  rng, dropout_key = jax.random.split(state.rng)
  loss, grads = gradients(state, batch["tokens"], dropout_key, batch.get("weights"))
  return apply_gradients(state, rng, loss, grads, stats)


def gradients(state: TrainState, tokens_BT1: jax.Array, dropout_key: jax.Array | None,
              weights_BT: jax.Array | None = None) -> tuple[jax.Array, Any]:
  """(loss, gradients of the trained params) for a micro-batch, through the loss scale and back.
  Under LoRA the base params are constants here: no gradient of theirs is ever computed."""
  scale = state.loss_scale

  def scaled_loss(trained):
    params = lora_lib.combine(state.params, trained)
    o = state.optimizer
    term = (o.loss_term, o.options_of(o.loss_term)) if o.loss_term else ()
    trains, loss = losses(params, state.graphdef, tokens_BT1, dropout_key, weights_BT, o.z_loss, term)
    return trains * scale, loss  # the cross-entropy alone is reported, as the val loss is

  (_, loss), grads = jax.value_and_grad(scaled_loss, has_aux=True)(state.trainable())
  return loss, jax.tree.map(lambda g: g / scale, grads)


def apply_gradients(state: TrainState, rng: jax.Array, loss: jax.Array,
                    grads: Any, stats: str = "none") -> tuple[TrainState, dict]:
  """The optimizer's part of `train_step`; `rng` is the state's next dropout key. Only the
  trained params are updated; the others (LoRA's base) leave the step as they came."""
  scale = state.loss_scale
  grad_norm = optax.tree.norm(grads)
  trained = state.trainable()
  updates, opt_state = state.tx.update(grads, state.opt_state, trained)
  new = optax.apply_updates(trained, updates)
  step = state.step + optim.is_update_step(opt_state).astype(jnp.int32)
  if state.optimizer.loss_scaling:
    # Halve on overflow (the optimizer drops that step), else creep up, doubling over ~1000
    # good steps, so that small float16 gradients do not flush to zero.
    scale = jnp.clip(jnp.where(jnp.isfinite(grad_norm), scale * LOSS_SCALE_GROWTH, scale / 2),
                     1.0, 2.0**24)
  # The learning rate this step used, read with the loss: the log needs no device work of its own.
  lr = optim.lr_schedule(state.optimizer, state.optimizer.max_steps, args=state.schedule)(state.step)
  metrics = {"loss": loss, "grad_norm": grad_norm, "skipped": optim.skipped_steps(opt_state),
             "loss_scale": scale, "lr": lr, **stats_lib.group_stats(trained, grads, new, stats)}
  return state.replace(params=lora_lib.combine(state.params, new), opt_state=opt_state,
                       step=step, rng=rng, loss_scale=scale), metrics


def eval_step(state: TrainState, batch: dict) -> dict:
  return {"loss": loss_fn(state.params, state.graphdef, batch["tokens"],
                          weights_BT=batch.get("weights"))}
