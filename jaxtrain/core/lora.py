"""LoRA: low-rank adapters beside the blocks' linear layers, the only params a LoRA run trains.

A targeted layer computes x W + (alpha / r) (x A) B: A [d_in, r] is drawn from N(0, 1/d_in), B
[r, d_out] starts at zero, so a fresh adapter changes nothing. The adapters are params `lora_a`
and `lora_b` beside the layer's `kernel` (whose name stays, so checkpoints, `init_from` and export
find the base params where they always are). The train step differentiates, updates and holds
optimizer state for the adapters alone (`trainable`, `combine`); the base params pass through it
bit for bit. `merged` folds the adapters into the kernels: an ordinary model, as export writes it.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx, traverse_util

from jaxtrain.config import lists
from jaxtrain.core import layers, ops
from jaxtrain.core import model as model_lib
from jaxtrain.system.errors import UserError

ADAPTERS = ("lora_a", "lora_b")
# Where each target lives in a block; its index keeps each layer's draw apart.
OWNERS = {"qkv": "attn", "out": "attn", "up": "mlp", "down": "mlp"}
STREAM = 0x4C6F5241  # folded into the params key: the adapters' draws, apart from the model's


@dataclasses.dataclass(frozen=True)
class Lora:
  rank: int
  alpha: float
  targets: tuple[str, ...]

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def from_config(finetune: ml_collections.ConfigDict) -> Lora | None:
  if not finetune.lora_rank:
    return None
  return Lora(finetune.lora_rank, float(finetune.lora_alpha),
              lists.lora_targets(finetune.lora_targets))


class LoraDense(layers.Dense):
  """A `Dense` whose output gains (alpha / r) (x A) B; its kernel is the layer's own."""

  def __init__(self, dense: layers.Dense, a: jax.Array, b: jax.Array, scale: float):
    self.kernel = dense.kernel
    self.dtype = dense.dtype
    self.lora_a = nnx.Param(a)
    self.lora_b = nnx.Param(b)
    self.scale = scale

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    low_rank = ops.dense(ops.dense(x, self.lora_a[...].astype(self.dtype)),
                         self.lora_b[...].astype(self.dtype))
    return super().__call__(x) + low_rank * jnp.asarray(self.scale, self.dtype)


def attach(model: model_lib.GPT, lora: Lora, key: jax.Array) -> model_lib.GPT:
  """`model` with adapters on every block's targeted layers (in place; returned too); `key`: the
  model's params key."""
  key = jax.random.fold_in(key, STREAM)
  for i, block in enumerate(getattr(model, "blocks", None) or [None]):
    for target in lora.targets:
      owner = getattr(block, OWNERS[target], None)
      dense = getattr(owner, target, None)
      if not isinstance(dense, layers.Dense):  # an extension's part, laid out its own way
        raise UserError(f"finetune.lora_targets: {target} is not a layer of this model (jaxtrain's "
                        f"block has it as blocks[i].{OWNERS[target]}.{target}, a Dense; an "
                        "extension's block, MLP or model may not); pass only targets it has, e.g. "
                        "--config.finetune.lora_targets=qkv,out")
      d_in, d_out = dense.kernel.shape
      layer_key = jax.random.fold_in(key, i * len(OWNERS) + list(OWNERS).index(target))
      a = jax.random.normal(layer_key, (d_in, lora.rank), jnp.float32) / math.sqrt(d_in)
      setattr(owner, target, LoraDense(dense, a, jnp.zeros((lora.rank, d_out), jnp.float32),
                                       lora.scale))
  return model


def _select(tree: dict, adapters: bool) -> dict:
  flat = traverse_util.flatten_dict(tree)
  return traverse_util.unflatten_dict({k: v for k, v in flat.items() if (k[-1] in ADAPTERS) == adapters})


def trainable(params: dict, lora: Lora | None) -> dict:
  """What the optimizer trains: the adapters under LoRA, else every param (`params` itself)."""
  return params if lora is None else _select(params, adapters=True)


def base(params: dict) -> dict:
  return _select(params, adapters=False)


def combine(params: dict, part: dict) -> dict:
  """`params` with the leaves of `part` (a nested dict of some of its leaves) put in place."""
  return traverse_util.unflatten_dict({**traverse_util.flatten_dict(params),
                                       **traverse_util.flatten_dict(part)})


def merged(params: dict, lora: Lora | None) -> dict:
  """Host params with every adapter folded into its kernel, W + (alpha / r) A B in float32, and
  the adapters gone: the params of an ordinary model that computes what the adapted one does."""
  params = jax.device_get(params)
  if lora is None:
    return params
  flat = traverse_util.flatten_dict(params)
  for *layer, _ in [k for k in flat if k[-1] == "lora_a"]:
    a, b = (np.asarray(flat.pop((*layer, name)), np.float32) for name in ADAPTERS)
    kernel = np.asarray(flat[(*layer, "kernel")], np.float32)
    flat[(*layer, "kernel")] = kernel + np.float32(lora.scale) * (a @ b)
  return traverse_util.unflatten_dict(flat)


def count(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
