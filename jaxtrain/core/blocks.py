"""Attention and the block, as registered components: `Attention` (the fused q/k/v projection,
QK-norm, the positions' rotation, the key-value cache, then the attention variant the config
names), `Attend` (what a variant is given: where queries and keys sit, and jaxtrain's softmax
attention to call), the built-in variant `causal`, and the built-in block `prenorm`, with its
optional short convolutions (model.canon). A block's parts share one forward pass's `Context`.
Shape suffixes as in model.py, plus S key positions and R query heads per key/value head.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain.core import draws, kvcache, ops, registry
from jaxtrain.core.layers import Dense, dropout, expect, guarded, make, out_std
from jaxtrain.core.registry import decorator as _builtin


@dataclasses.dataclass
class Context:
  """One block's view of a forward pass. With a key-value cache, `layer` is the block's, and its
  attention and convolutions write their inputs into it (the model collects it after the block)."""

  start: int | jax.Array  # the window position of x's first token: 0 in training
  positions: object  # the model's positions component: its `rotate`, where it has one
  same_doc_BTS: jax.Array | None = None  # the document mask (model.doc_mask), training only
  layer: kvcache.Layer | None = None
  key: jax.Array | None = None  # dropout


class Attend:
  """What an attention variant gets besides q [B, T, H, K], k and v [B, S, G, K]: where they sit
  (`q_pos` [T], `k_pos` [S], `distance` = q_pos - k_pos [T, S]), and jaxtrain's softmax
  attention, which a variant calls: `at(q, k, v, mask=..., bias=...)`. It always keeps each query
  to the positions up to its own (and to its document, with model.doc_mask)."""

  def __init__(self, start, T: int, S: int, kernel: str, same_doc_BTS=None, cached: bool = False):
    self.start, self.T, self.S, self.kernel = start, T, S, kernel
    self.same_doc_BTS, self.cached = same_doc_BTS, cached

  @property
  def q_pos(self) -> jax.Array:
    return self.start + jnp.arange(self.T, dtype=jnp.int32)

  @property
  def k_pos(self) -> jax.Array:
    return jnp.arange(self.S, dtype=jnp.int32) if self.cached else self.q_pos

  @property
  def distance(self) -> jax.Array:
    return self.q_pos[:, None] - self.k_pos[None, :]

  def __call__(self, q_BTHK, k_BSGK, v_BSGK, *, mask=None, bias=None) -> jax.Array:
    """Softmax attention: `mask` (bool) keeps scores, `bias` (float) adds to them; each of
    shape [T, S], [H, T, S] or [B, H, T, S]."""
    if mask is None and bias is None and not self.cached:
      return self._fused(q_BTHK, k_BSGK, v_BSGK)
    visible = self.k_pos[None, :] <= self.q_pos[:, None]  # [T, S]
    if self.same_doc_BTS is not None:
      visible = visible & self.same_doc_BTS[:, None, None]
    H, G = q_BTHK.shape[2], k_BSGK.shape[2]
    if mask is not None:
      visible = visible & _grouped(jnp.asarray(mask, bool), H, G)
    if bias is not None:
      bias = _grouped(jnp.asarray(bias, jnp.float32), H, G)
    return softmax_attention(q_BTHK, k_BSGK, v_BSGK, visible, bias)

  def _fused(self, q_BTHK, k_BTGK, v_BTGK) -> jax.Array:
    """The whole sequence's own attention, by the kernel (model.attention) that a run resolved."""
    if self.kernel == "cudnn":  # takes G < H as it is
      mask = None if self.same_doc_BTS is None else self.same_doc_BTS[:, None]
      return jax.nn.dot_product_attention(q_BTHK, k_BTGK, v_BTGK, mask=mask, is_causal=True,
                                          implementation="cudnn")
    H, G = q_BTHK.shape[2], k_BTGK.shape[2]
    heads = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # BTHK <-> BHTK: a head is a batch of matmuls  # noqa: E731
    k_BTHK, v_BTHK = (jnp.repeat(x, H // G, axis=2) for x in (k_BTGK, v_BTGK))
    qkv = heads(q_BTHK), heads(k_BTHK), heads(v_BTHK)
    return heads(ops.causal_attention(*qkv) if self.same_doc_BTS is None else
                 ops.document_attention(*qkv, self.same_doc_BTS))


def _grouped(x: jax.Array, H: int, G: int) -> jax.Array:
  """A mask or bias over [T, S], [H, T, S] or [B, H, T, S], laid out against scores [B, G, R, T, S]."""
  if x.ndim <= 2:
    return x
  return x.reshape(*x.shape[:-3], G, H // G, *x.shape[-2:])


def softmax_attention(q_BTHK, k_BSGK, v_BSGK, visible, bias=None) -> jax.Array:
  """Attention of each query over the keys `visible` to it (bool, broadcast against [B, G, R, T,
  S]: query head h = g * R + r reads key/value head g), scores plus `bias`, softmax in float32."""
  B, T, H, K = q_BTHK.shape
  G = k_BSGK.shape[2]
  q_BTGRK = (q_BTHK * K**-0.5).reshape(B, T, G, H // G, K)
  scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK).astype(jnp.float32)
  if bias is not None:
    scores_BGRTS = scores_BGRTS + bias
  probs_BGRTS = jax.nn.softmax(jnp.where(visible, scores_BGRTS, -jnp.inf), axis=-1)
  y_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS.astype(q_BTHK.dtype), v_BSGK)
  return y_BTGRK.reshape(B, T, H, K)


@_builtin("attention", "causal", {}, builtin=True, batched_init=True)
def causal(q_BTHK, k_BSGK, v_BSGK, at: Attend) -> jax.Array:
  return at(q_BTHK, k_BSGK, v_BSGK)


def qkv_heads(qkv_BTN: jax.Array, H: int, G: int, K: int) -> tuple[jax.Array, ...]:
  """Queries [B, T, H, K], keys and values [B, T, G, K] from the fused projection's output."""
  B, T, _ = qkv_BTN.shape
  q, k, v = jnp.split(qkv_BTN, [H * K, (H + G) * K], axis=-1)
  return q.reshape(B, T, H, K), k.reshape(B, T, G, K), v.reshape(B, T, G, K)


def rms_heads(x: jax.Array) -> jax.Array:
  """QK-norm: each head's query or key scaled to unit RMS (no weights), so that attention logits
  cannot grow without bound."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


class Attention(nnx.Module):
  """The attention sublayer: projections around the attention variant that model.attention_variant
  names (a block of an extension can hold one: `jt.Attention(c, rngs)(x_BTD, ctx)`)."""

  def __init__(self, c, rngs: nnx.Rngs):
    self.c = c
    dtype = jnp.dtype(c.dtype)
    self.qkv = Dense(c.d_model, (c.n_heads + 2 * c.kv_heads) * c.head_dim, dtype=dtype,
                     kernel_init=draws.normal(0.02), rngs=rngs)
    self.out = Dense(c.d_model, c.d_model, dtype=dtype, kernel_init=draws.normal(out_std(c)), rngs=rngs)

  def __call__(self, x_BTD: jax.Array, ctx: Context) -> jax.Array:
    B, T, D = x_BTD.shape
    c = self.c
    q_BTHK, k_BTGK, v_BTGK = qkv_heads(self.qkv(x_BTD), c.n_heads, c.kv_heads, c.head_dim)
    if c.qk_norm:
      q_BTHK, k_BTGK = rms_heads(q_BTHK), rms_heads(k_BTGK)
    rotate = getattr(ctx.positions, "rotate", None)
    if rotate is not None:
      q_BTHK = expect(guarded("positions", c, rotate, q_BTHK, ctx.start), q_BTHK, "positions", c,
                      "rotate returned")
      k_BTGK = expect(guarded("positions", c, rotate, k_BTGK, ctx.start), k_BTGK, "positions", c,
                      "rotate returned")
    S = T
    if ctx.layer is not None:  # the cached positions' keys and values too; no document mask
      ctx.layer = kvcache.write(ctx.layer, k_BTGK, v_BTGK, ctx.start)
      k_BTGK, v_BTGK, S = ctx.layer.k_BSGK, ctx.layer.v_BSGK, c.seq_len
    at = Attend(ctx.start, T, S, c.attention, ctx.same_doc_BTS, cached=ctx.layer is not None)
    variant = registry.get("attention", c.attention_variant)
    y_BTHK = registry.call(variant, q_BTHK, k_BTGK, v_BTGK, at, options=c.options_of(variant.name))
    y_BTHK = expect(y_BTHK, q_BTHK, "attention", c)
    return self.out(y_BTHK.reshape(B, T, D))


def causal_conv(x_BTD: jax.Array, w_KD: jax.Array, same_doc_BTS: jax.Array | None = None):
  """x plus a short causal depthwise convolution of it: position t adds w[i] * x[t - i] for
  i < K (zeros before the window, and before its document's start where documents are given)."""
  K, T = w_KD.shape[0], x_BTD.shape[1]
  padded_BTD = jnp.pad(x_BTD, ((0, 0), (K - 1, 0), (0, 0)))  # one pad, K slices: fastest on CPU
  y_BTD = x_BTD
  for i in range(K):
    shifted_BTD = padded_BTD[:, K - 1 - i:K - 1 - i + T]
    if same_doc_BTS is not None and i > 0:  # t and t - i in one document
      same_BT = jnp.pad(jnp.diagonal(same_doc_BTS, -i, 1, 2), ((0, 0), (i, 0)))
      shifted_BTD = jnp.where(same_BT[..., None], shifted_BTD, 0)
    y_BTD = y_BTD + shifted_BTD * w_KD[i].astype(x_BTD.dtype)
  return y_BTD


def _conv(x_BTD, w_KD, ctx: Context, field: str):
  """`causal_conv` of x; with a cache, over the inputs cached in `ctx.layer`'s `field` too, x's
  written in."""
  if ctx.layer is None:
    return causal_conv(x_BTD, w_KD, ctx.same_doc_BTS)
  span_BTD, cache_BSD = kvcache.conv_span(x_BTD, getattr(ctx.layer, field), w_KD.shape[0], ctx.start)
  ctx.layer = ctx.layer._replace(**{field: cache_BSD})
  return causal_conv(span_BTD, w_KD)[:, w_KD.shape[0] - 1:]


@_builtin("block", "prenorm", {}, builtin=True, batched_init=True)
class Block(nnx.Module):
  """x + attention(norm1(x)), then + mlp(norm2(x)); each branch's output through dropout. A
  block of an extension may subclass it and write its own `__call__(x_BTD, ctx)`."""

  def __init__(self, c, rngs: nnx.Rngs):
    self.c = c
    self.dropout = c.dropout
    self.norm1 = make("norm", c, rngs)
    self.attn = Attention(c, rngs)
    self.norm2 = make("norm", c, rngs)
    self.mlp = make("mlp", c, rngs)
    self.canon = c.canon
    if c.canon:  # zero: each convolution starts as the identity
      self.conv_attn = nnx.Param(jnp.zeros((c.canon, c.d_model), jnp.float32))
      self.conv_mlp = nnx.Param(jnp.zeros((c.canon, c.d_model), jnp.float32))

  def part(self, kind: str, layer, x_BTD: jax.Array) -> jax.Array:
    """`layer(x)` for a norm or an MLP: its output checked against x's shape and dtype."""
    return expect(guarded(kind, self.c, layer, x_BTD), x_BTD, kind, self.c)

  def __call__(self, x_BTD: jax.Array, ctx: Context) -> jax.Array:
    k1, k2 = jax.random.split(ctx.key) if ctx.key is not None else (None, None)
    a_BTD = self.part("norm", self.norm1, x_BTD)
    if self.canon:
      a_BTD = _conv(a_BTD, self.conv_attn[...], ctx, "attn_in_BSD")
    x_BTD = x_BTD + dropout(self.attn(a_BTD, ctx), self.dropout, k1)
    m_BTD = self.part("norm", self.norm2, x_BTD)
    if self.canon:
      m_BTD = _conv(m_BTD, self.conv_mlp[...], ctx, "mlp_in_BSD")
    return x_BTD + dropout(self.part("mlp", self.mlp, m_BTD), self.dropout, k2)
