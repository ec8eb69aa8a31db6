"""The key-value cache that `model.GPT` extends when it runs new tokens after cached ones: its
layout, attention of new queries over the cached keys and values, and the span a causal
convolution reads. Static shapes: every layer holds seq_len positions, written in place, so that
a jitted decode loop compiles once.

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


def attend(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, layer: Layer,
           pos) -> tuple[jax.Array, Layer]:
  """Attention of queries at window positions pos.. over the cached positions up to each of them
  (theirs included): y_BTHK, and the layer's cache with their keys and values written in."""
  B, T, H, K = q_BTHK.shape
  S, G = layer.k_BSGK.shape[1], layer.k_BSGK.shape[2]
  write = lambda cache, x: jax.lax.dynamic_update_slice_in_dim(cache, x.astype(cache.dtype), pos, 1)  # noqa: E731
  k_BSGK, v_BSGK = write(layer.k_BSGK, k_BTGK), write(layer.v_BSGK, v_BTGK)
  # Query t (at window position pos + t) sees cached positions s <= pos + t.
  visible_TS = jnp.arange(S)[None, :] <= pos + jnp.arange(T)[:, None]
  # Query head h = g * R + r reads key/value head g, as the whole sequence's repeat of k and v does.
  q_BTGRK = (q_BTHK * K**-0.5).reshape(B, T, G, H // G, K)
  scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK).astype(jnp.float32)
  probs_BGRTS = jax.nn.softmax(jnp.where(visible_TS, scores_BGRTS, -jnp.inf), axis=-1)
  y_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS.astype(q_BTHK.dtype), v_BSGK)
  return y_BTGRK.reshape(B, T, H, K), layer._replace(k_BSGK=k_BSGK, v_BSGK=v_BSGK)


def conv_span(x_BTD: jax.Array, cache_BSD: jax.Array, width: int, pos) -> tuple[jax.Array, jax.Array]:
  """What a causal convolution of `width` at window positions pos.. reads: the width - 1 inputs
  before them (zeros before position 0) and theirs, [B, width - 1 + T, D]; and the cache with
  `x_BTD` written in."""
  T = x_BTD.shape[1]
  cache_BSD = jax.lax.dynamic_update_slice_in_dim(cache_BSD, x_BTD.astype(cache_BSD.dtype), pos, 1)
  padded_BSD = jnp.pad(cache_BSD, ((0, 0), (width - 1, 0), (0, 0)))
  span_BTD = jax.lax.dynamic_slice_in_dim(padded_BSD, pos, T + width - 1, axis=1).astype(x_BTD.dtype)
  return span_BTD, cache_BSD
