"""Parameter initialisation that compiles fast: normal draws collected while a model is built,
then made a group at a time (`batched`), bit for bit what separate draws give.

May import: nothing of jaxtrain's.
"""

import functools
import itertools
import threading
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# Per thread, the draws that `batched` collects to make in batches (none: initializers draw at once).
BATCHING = threading.local()


def normal(std: float):
  """An initializer of normal draws times `std`; while `batched` builds a model, it records the
  draw and returns a placeholder."""
  def init(key, shape: tuple[int, ...], dtype) -> jax.Array:
    draws = getattr(BATCHING, "draws", None)
    if draws is None:
      return jax.random.normal(key, shape, dtype) * jnp.array(std, dtype)
    placeholder = jnp.zeros(shape, dtype)
    draws.append((placeholder, key, std))  # key: the index `batched`'s stand-in gave out
    return placeholder
  return init


def batched(build: Callable[[Any], nnx.Module], key: jax.Array,
            exact_shapes: bool = False) -> nnx.Module:
  """`build(nnx.Rngs(params=key))`, with the same values, but cheaper to compile: one vmapped
  threefry loop per group of draws instead of one per parameter. A group's draws are padded to its
  largest and cut back: with partitionable threefry (jax's default) a key's first n values do not
  depend on how many are drawn, so the params are bit for bit those of separate draws.
  `exact_shapes`: groups of one shape, drawn in that shape, so that params split over devices
  (FSDP) are drawn by each device for its own part.
  """
  BATCHING.draws = draws = []
  try:
    # Stands in for `nnx.Rngs(params=key)`: the i-th params key it hands out is the number i,
    # where nnx.Rngs would hand out `fold_in(key, i)`.
    model = build(types.SimpleNamespace(params=itertools.count().__next__))
  finally:
    BATCHING.draws = None
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.array([i for _, i, _ in draws],
                                                                 jnp.uint32))
  pad = jax.config.jax_threefry_partitionable and not exact_shapes
  values = {}
  for group in draw_groups([placeholder for placeholder, _, _ in draws], pad):
    first = draws[group[0]][0]
    shape = first.shape if not pad else (first.size,)
    stds = jnp.array([draws[d][2] for d in group], first.dtype)
    draw = functools.partial(scaled_normal, shape=shape, dtype=first.dtype)
    drawn = jax.vmap(draw)(keys[jnp.array(group)], stds)
    for j, d in enumerate(group):
      placeholder = draws[d][0]
      values[id(placeholder)] = drawn[j] if not pad else \
          drawn[j, :placeholder.size].reshape(placeholder.shape)
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda x: values.pop(id(x), x), params))
  if values:
    raise RuntimeError(f"draws.batched: {len(values)} drawn parameter(s) not found in the model")
  return model


def scaled_normal(key: jax.Array, std: jax.Array, *, shape: tuple[int, ...], dtype) -> jax.Array:
  return jax.random.normal(key, shape, dtype) * std


MAX_PADDING = 2**24  # values drawn only to be thrown away, per group (64 MiB of float32)


def draw_groups(placeholders: list[jax.Array], pad: bool = True) -> list[list[int]]:
  """Indices of draws made together, largest first in each group. With `pad`, sizes join a group
  while padding each draw to the group's largest at most doubles the group's values and wastes at
  most MAX_PADDING; without it, a group is one shape and dtype."""
  order = sorted(range(len(placeholders)), key=lambda d: (
      -placeholders[d].size, placeholders[d].dtype.name, placeholders[d].shape))
  groups: list[list[int]] = []
  for d in order:
    p = placeholders[d]
    if groups:
      group = groups[-1]
      first = placeholders[group[0]]
      total = sum(placeholders[g].size for g in group) + p.size
      padded = first.size * (len(group) + 1)
      fits = padded <= 2 * total and padded - total <= MAX_PADDING if pad else \
          p.shape == first.shape
      if p.dtype == first.dtype and fits:
        group.append(d)
        continue
    groups.append([d])
  return groups


