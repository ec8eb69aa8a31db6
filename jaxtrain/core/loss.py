"""The next-token cross-entropy, whole or in chunks of tokens.

The whole way materializes float32 logits for every token of the micro-batch (B x T x V), and
autodiff keeps them for the backward pass. The chunked way (`model.loss_chunk` tokens at a time)
runs the head and log-softmax one chunk after another under `jax.checkpoint`: only one chunk's
logits exist at once, in the backward pass too. Same loss and gradients, up to float rounding.
Losses are per token first, so that a per-token weight (a prompt mask) can weigh them.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def token_losses(logits_BTV: jax.Array, targets_BT: jax.Array, scatter_free: bool = False) -> jax.Array:
  """float32[B, T]: -log p(target) at every position (optax's integer-label cross-entropy).

  `scatter_free` (ModelConfig's, for GPUs): the target's logit is a masked sum over the vocabulary,
  which XLA can fuse with the logsumexp and whose gradient is a select, not optax's gather, whose
  gradient is a scatter.
  """
  if not scatter_free:
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT)
  hit_BTV = jnp.arange(logits_BTV.shape[-1]) == targets_BT[..., None]
  target_BT = jnp.sum(jnp.where(hit_BTV, logits_BTV, 0), axis=-1)
  return jax.nn.logsumexp(logits_BTV, axis=-1) - target_BT


def z_terms(logits_BTV: jax.Array) -> jax.Array:
  """float32[B, T]: log(Z)^2, Z the sum of exp(logits), at every position (the z-loss's term:
  it pulls log Z toward 0, so the logits cannot all drift up or down together)."""
  return jnp.square(jax.nn.logsumexp(logits_BTV.astype(jnp.float32), axis=-1))


def mean_loss(losses_BT: jax.Array, weights_BT: jax.Array | None = None) -> jax.Array:
  """The mean loss per token, or the weighted mean (0 where every weight is 0)."""
  if weights_BT is None:
    return losses_BT.mean()
  w_BT = weights_BT.astype(jnp.float32)
  total = w_BT.sum()
  return jnp.where(total > 0, (losses_BT * w_BT).sum() / jnp.where(total > 0, total, 1.0), 0.0)


def chunked_token_losses(x_BTD: jax.Array, w_DV: jax.Array, targets_BT: jax.Array,
                         head: Callable[[jax.Array, jax.Array], jax.Array],
                         chunk: int, with_z: bool = False,
                         scatter_free: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """(`token_losses(head(x, w), targets)`, with `with_z` also `z_terms(head(x, w))`, else None),
  `chunk` tokens at a time: float32[B, T] each.

  `head(x_CD, w_DV)` gives a chunk's float32 logits. The last chunk is padded with zero rows,
  whose losses are dropped (so they get no gradient).
  """
  B, T, D = x_BTD.shape
  n_tokens = B * T
  chunk = min(chunk, n_tokens)
  n_chunks = -(-n_tokens // chunk)
  pad = n_chunks * chunk - n_tokens
  x_NCD = jnp.pad(x_BTD.reshape(n_tokens, D), ((0, pad), (0, 0))).reshape(n_chunks, chunk, D)
  t_NC = jnp.pad(targets_BT.reshape(n_tokens), (0, pad)).reshape(n_chunks, chunk)

  @jax.checkpoint  # the backward pass recomputes each chunk's logits instead of keeping them
  def one_chunk(w, x_CD, t_C):
    logits_CV = head(x_CD, w)
    return token_losses(logits_CV, t_C, scatter_free), (z_terms(logits_CV) if with_z else None)

  per_chunk = jax.lax.map(lambda xt: one_chunk(w_DV, *xt), (x_NCD, t_NC))
  ce_BT, z_BT = (None if a_NC is None else a_NC.reshape(-1)[:n_tokens].reshape(B, T)
                 for a_NC in per_chunk)
  return ce_BT, z_BT
