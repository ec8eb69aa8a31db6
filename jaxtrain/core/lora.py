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
from flax import nnx

from jaxtrain.config import lists
from jaxtrain.core import model as model_lib
from jaxtrain.core import ops

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
  """The `finetune` section's LoRA, or None when it is off (rank 0)."""
  if not finetune.lora_rank:
    return None
  return Lora(finetune.lora_rank, float(finetune.lora_alpha),
              lists.lora_targets(finetune.lora_targets))


class LoraDense(model_lib.Dense):
  """A `Dense` whose output gains (alpha / r) (x A) B; its kernel is the layer's own."""

  def __init__(self, dense: model_lib.Dense, a: jax.Array, b: jax.Array, scale: float):
    self.kernel = dense.kernel
    self.dtype = dense.dtype
    self.lora_a = nnx.Param(a)
    self.lora_b = nnx.Param(b)
    self.scale = scale

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    y = ops.dense(x, self.kernel[...].astype(self.dtype))
    low_rank = ops.dense(ops.dense(x, self.lora_a[...].astype(self.dtype)),
                         self.lora_b[...].astype(self.dtype))
    return y + low_rank * jnp.asarray(self.scale, self.dtype)


def attach(model: model_lib.GPT, lora: Lora, key: jax.Array) -> model_lib.GPT:
  """`model` with adapters on every block's targeted layers (in place; returned too)."""
  for i, block in enumerate(model.blocks):
    for target in lora.targets:
      owner = getattr(block, OWNERS[target])
      dense = getattr(owner, target)
      d_in, d_out = dense.kernel.shape
      layer_key = jax.random.fold_in(key, i * len(OWNERS) + list(OWNERS).index(target))
      a = jax.random.normal(layer_key, (d_in, lora.rank), jnp.float32) / math.sqrt(d_in)
      setattr(owner, target, LoraDense(dense, a, jnp.zeros((lora.rank, d_out), jnp.float32),
                                       lora.scale))
  return model


def adapter_key(key: jax.Array) -> jax.Array:
  return jax.random.fold_in(key, STREAM)


def _select(tree, keep, path: tuple = ()):
  """The nested dict `tree` with only the leaves whose path `keep` accepts (None: none left)."""
  if not isinstance(tree, dict):
    return tree if keep(path) else None
  out = {}
  for k, v in tree.items():
    kept = _select(v, keep, (*path, k))
    if kept is not None:
      out[k] = kept
  return out or None


def _is_adapter(path: tuple) -> bool:
  return bool(path) and path[-1] in ADAPTERS


def trainable(params: dict, lora: Lora | None) -> dict:
  """What the optimizer trains: the adapters under LoRA, else every param (`params` itself)."""
  return params if lora is None else _select(params, _is_adapter) or {}


def base(params: dict) -> dict:
  """`params` without adapters: the model's own params."""
  return _select(params, lambda path: not _is_adapter(path)) or {}


def combine(params: dict, part: dict) -> dict:
  """`params` with the leaves of `part` (a nested dict of some of its leaves) put in place."""
  if not isinstance(part, dict):
    return part
  return {k: combine(v, part[k]) if k in part else v for k, v in params.items()}


def merged(params: dict, lora: Lora | None) -> dict:
  """Host params with every adapter folded into its kernel, W + (alpha / r) A B in float32, and
  the adapters gone: the params of an ordinary model that computes what the adapted one does."""
  params = jax.device_get(params)
  if lora is None:
    return params

  def fold(node):
    if not isinstance(node, dict):
      return node
    if "lora_a" in node:
      a, b = np.asarray(node["lora_a"], np.float32), np.asarray(node["lora_b"], np.float32)
      kernel = np.asarray(node["kernel"], np.float32) + np.float32(lora.scale) * (a @ b)
      return {**{k: v for k, v in node.items() if k not in ADAPTERS}, "kernel": kernel}
    return {k: fold(v) for k, v in node.items()}
  return fold(params)


def count(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
