"""The key-value cache that `model.GPT` extends when it runs new tokens after cached ones: its
layout, the new keys and values written in (attention then reads them all: core/blocks.py), and
the span a causal convolution reads. Static shapes: every layer holds seq_len positions, written
in place, so that a jitted decode loop compiles once.

Shape suffixes as in model.py, plus S cache length (= seq_len).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Layer(NamedTuple):
  """One layer's cache. With `model.canon`, also the attention's and the MLP's inputs, which the
  convolutions of the next positions read (None without)."""
  k_BSGK: jax.Array
  v_BSGK: jax.Array
  attn_in_BSD: jax.Array | None = None
  mlp_in_BSD: jax.Array | None = None


Cache = list[Layer]  # one per block


def empty(c, batch: int) -> Cache:
  """Zeros for `batch` rows of a model of `c` (a model.ModelConfig): what a prefill writes into."""
  kv = lambda: jnp.zeros((batch, c.seq_len, c.kv_heads, c.head_dim), c.dtype)  # noqa: E731
  inputs = lambda: jnp.zeros((batch, c.seq_len, c.d_model), c.dtype) if c.canon else None  # noqa: E731
  return [Layer(kv(), kv(), inputs(), inputs()) for _ in range(c.n_layers)]


def write(layer: Layer, k_BTGK: jax.Array, v_BTGK: jax.Array, pos) -> Layer:
  """The layer's cache with the keys and values of the tokens at window positions pos.. written in
  (attention then reads the whole cache: a query sees the positions up to its own)."""
  put = lambda cache, x: jax.lax.dynamic_update_slice_in_dim(cache, x.astype(cache.dtype), pos, 1)  # noqa: E731
  return layer._replace(k_BSGK=put(layer.k_BSGK, k_BTGK), v_BSGK=put(layer.v_BSGK, v_BTGK))


def conv_span(x_BTD: jax.Array, cache_BSD: jax.Array, width: int, pos) -> tuple[jax.Array, jax.Array]:
  """What a causal convolution of `width` at window positions pos.. reads: the width - 1 inputs
  before them (zeros before position 0) and theirs, [B, width - 1 + T, D]; and the cache with
  `x_BTD` written in."""
  T = x_BTD.shape[1]
  cache_BSD = jax.lax.dynamic_update_slice_in_dim(cache_BSD, x_BTD.astype(cache_BSD.dtype), pos, 1)
  padded_BSD = jnp.pad(cache_BSD, ((0, 0), (width - 1, 0), (0, 0)))
  span_BTD = jax.lax.dynamic_slice_in_dim(padded_BSD, pos, T + width - 1, axis=1).astype(x_BTD.dtype)
  return span_BTD, cache_BSD
