"""The next-token cross-entropy: whole, in chunks of tokens (`model.loss_chunk`), or fused with its
gradient (`model.fused_loss`). The whole way materializes float32 logits for every token of the
micro-batch (B x T x V), and autodiff keeps them for the backward pass; the chunked way keeps one
chunk's at a time (same loss and gradients, up to float rounding), the fused way keeps them in the
compute dtype. Losses are per token first, so that a per-token weight (a prompt mask) can weigh them.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from jaxtrain.core import ops, registry
from jaxtrain.system.errors import UserError


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


def extra_term(term: tuple, logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
  """float32[B, T]: the loss term optim.loss_term names (`term`: its name and options) of the
  logits, checked for its shape."""
  name, options = term
  component = registry.get("loss", name)
  out = registry.call(component, logits_BTV, targets_BT, options=options)
  if getattr(out, "shape", None) != targets_BT.shape:
    got = f"{out.dtype}{list(out.shape)}" if hasattr(out, "shape") else type(out).__name__
    raise UserError(f"optim.loss_term={name}: the loss term ({component.where}) returned {got}, "
                    f"not one value per target token, [B, T] = {list(targets_BT.shape)}; make it "
                    "return that")
  return out.astype(jnp.float32)


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
  return tuple(None if a_NC is None else a_NC.reshape(-1)[:n_tokens].reshape(B, T)
               for a_NC in per_chunk)


def fused_token_losses(x_BTD: jax.Array, w_DV: jax.Array, targets_BT: jax.Array,
                       z_loss: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """(the loss that trains: `token_losses` + z_loss x `z_terms`, the cross-entropy a run reports,
  which carries no gradient where z_loss > 0), float32[B, T] each, of the logits `x @ w`, kept in
  x's dtype (the compute dtype). The softmax is taken in float32 by the pass that also writes the
  logits' gradient over them; the backward pass is two matmuls with the per-token cotangent applied
  to x's rows and to the result: no pass over B x T x V of its own, no scatter."""
  trains_BT, ce_BT = _fused(x_BTD, w_DV, targets_BT, z_loss)
  return trains_BT, (jax.lax.stop_gradient(ce_BT) if z_loss else trains_BT)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(x_BTD, w_DV, targets_BT, z_loss):
  return _fused_fwd(x_BTD, w_DV, targets_BT, z_loss)[0]


def _fused_fwd(x_BTD, w_DV, targets_BT, z_loss):
  x_ND, t_N = x_BTD.reshape(-1, x_BTD.shape[-1]), targets_BT.reshape(-1)
  # The barrier keeps the logits in x's dtype: XLA would otherwise fold the float32 convert into
  # the matmul ("excess precision") and write float32 logits after all.
  logits_NV = jax.lax.optimization_barrier(x_ND @ w_DV).astype(jnp.float32)
  lse_N = jax.nn.logsumexp(logits_NV, axis=-1)
  ce_N = lse_N - jnp.take_along_axis(logits_NV, t_N[:, None], axis=-1)[:, 0]
  trains_N = ce_N + z_loss * jnp.square(lse_N) if z_loss else ce_N
  # d trains / d logits: softmax x (1 + 2 z_loss log Z) - one-hot(target)
  hit_NV = jnp.arange(w_DV.shape[1]) == t_N[:, None]
  grad_NV = jnp.exp(logits_NV - lse_N[:, None]) * (1 + 2 * z_loss * lse_N)[:, None] - hit_NV
  B, T = targets_BT.shape
  return (trains_N.reshape(B, T), ce_N.reshape(B, T)), (x_ND, w_DV, grad_NV.astype(x_ND.dtype))


def _fused_bwd(z_loss, residuals, cotangents):
  x_ND, w_DV, grad_NV = residuals
  r_N1 = cotangents[0].reshape(-1, 1)  # the ce output's cotangent is 0 (fused_token_losses)
  # dx = r * (grad @ w^T), dw = (r * x)^T @ grad: the per-token factor rides on the narrow side
  dx_ND, dw_DV = ops.dense_backward(((r_N1 * x_ND).astype(x_ND.dtype), w_DV), grad_NV)
  dx_BTD = (r_N1 * dx_ND).astype(x_ND.dtype).reshape(*cotangents[0].shape, -1)
  return dx_BTD, dw_DV, None


_fused.defvjp(_fused_fwd, _fused_bwd)
