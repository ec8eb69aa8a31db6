"""The built-in attention and MLP written again as a user's components (benchmarks/extensions.py
builds a model of them and the built-in model, and compares their programs)."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

import jaxtrain as jt


@jt.attention("twin_causal")
def twin_causal(q, k, v, at):
  return at(q, k, v)


@jt.mlp("twin_swiglu")
class SwiGLU(nnx.Module):
  def __init__(self, c, rngs):
    F = 8 * math.ceil(2 / 3 * c.mlp_ratio * c.d_model / 8)
    init = jax.nn.initializers.normal(0.02)
    self.up = jt.Dense(c.d_model, 2 * F, dtype=jnp.dtype(c.dtype), kernel_init=init, rngs=rngs)
    self.down = jt.Dense(F, c.d_model, dtype=jnp.dtype(c.dtype), kernel_init=init, rngs=rngs)

  def __call__(self, x):
    gate, up = jnp.split(self.up(x), 2, axis=-1)
    return self.down(jax.nn.silu(gate) * up)
