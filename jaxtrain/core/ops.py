"""Matmul-shaped ops with hand-written backward passes, laid out for XLA's CPU backend.

Autodiff of `x @ w` asks for `dy @ w.T` and `x.T @ dy`, which XLA:CPU runs as a slower
transposed-operand matmul or by fusing the transpose into a neighbouring elementwise op that then
writes in a strided order. Here every backward product is a plain row-major matmul: the smaller
operand (a weight, or q/k/v rather than the T x T scores) is transposed on its own, behind an
optimization barrier so XLA cannot fold it back. Same math as autodiff, up to float rounding.

Beside them: `dense_f32`, the head's matmul with float32 logits, and `embed`, a token embedding
lookup whose gradient sums in float32.
"""

import functools

import jax
import jax.numpy as jnp


def transposed(x: jax.Array) -> jax.Array:
  """`x` with its last two axes swapped, materialized as its own row-major array:
  `dense(x, transposed(w))` is `x @ w.T` (a tied embedding's logits) as a plain matmul."""
  return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))


def _transpose_of_product(x: jax.Array) -> jax.Array:
  """The transpose of a matmul's result `x`, kept a transpose: without the barrier, XLA folds
  it into the matmul, which then reads its larger operand transposed."""
  return jnp.swapaxes(jax.lax.optimization_barrier(x), -1, -2)


@jax.custom_vjp
def dense(x_ND: jax.Array, w_DF: jax.Array) -> jax.Array:
  """`x @ w` over the last axis of x (any leading axes)."""
  return x_ND @ w_DF


def dense_backward(residuals: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(dx, dw) of `dense(x, w)` for its output's cotangent `dy`, `residuals` being (x, w)."""
  x, w = residuals
  x_ND, dy_NF = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
  dx = (dy_NF @ transposed(w)).reshape(x.shape)
  if x_ND.shape[1] <= dy_NF.shape[1]:  # transpose whichever of x and dy is narrower
    dw = transposed(x_ND) @ dy_NF
  else:
    dw = _transpose_of_product(transposed(dy_NF) @ x_ND)
  return dx, dw.astype(w.dtype)


dense.defvjp(lambda x, w: (x @ w, (x, w)), dense_backward)


@jax.custom_vjp
def dense_f32(x_ND: jax.Array, w_DF: jax.Array) -> jax.Array:
  """`dense(x, w)` accumulated into, and returned as, float32 (the head's logits: one rounding, no
  second pass to convert them). The backward products are `dense`'s, in the inputs' dtype."""
  return jnp.matmul(x_ND, w_DF, preferred_element_type=jnp.float32)


dense_f32.defvjp(lambda x, w: (dense_f32(x, w), (x, w)),
                 lambda res, dy: dense_backward(res, dy.astype(res[0].dtype)))


@jax.custom_vjp
def causal_attention(q_BHTK: jax.Array, k_BHTK: jax.Array, v_BHTK: jax.Array) -> jax.Array:
  """Softmax attention where position t sees positions <= t; the softmax runs in float32."""
  return _attention_fwd(q_BHTK, k_BHTK, v_BHTK)[0]


def _attention_fwd(q, k, v, same_doc_BTS=None):
  T, K = q.shape[-2], q.shape[-1]
  scores_BHTS = ((q * K**-0.5) @ transposed(k)).astype(jnp.float32)
  allowed = jnp.tril(jnp.ones((T, T), bool))  # every row keeps its diagonal: never all -inf
  if same_doc_BTS is not None:
    allowed = allowed & same_doc_BTS[:, None]
  probs_BHTS = jax.nn.softmax(jnp.where(allowed, scores_BHTS, -jnp.inf), axis=-1)
  probs_BHTS = probs_BHTS.astype(q.dtype)
  return probs_BHTS @ v, (q, k, v, probs_BHTS)


def _attention_bwd(residuals, dout_BHTK):
  q, k, v, probs = residuals
  scale = q.shape[-1] ** -0.5
  # dv^T = dout^T probs: no T x T transpose
  dv = _transpose_of_product(transposed(dout_BHTK) @ probs)
  dprobs = (dout_BHTK @ transposed(v)).astype(jnp.float32)
  p32 = probs.astype(jnp.float32)
  dscores = (p32 * (dprobs - jnp.sum(dprobs * p32, axis=-1, keepdims=True))).astype(q.dtype)
  dq = (dscores @ k) * scale
  dk = _transpose_of_product(transposed(q) @ dscores) * scale  # dk^T = q^T dscores
  return dq, dk, dv


causal_attention.defvjp(_attention_fwd, _attention_bwd)


@jax.custom_vjp
def document_attention(q_BHTK: jax.Array, k_BHTK: jax.Array, v_BHTK: jax.Array,
                       same_doc_BTS: jax.Array) -> jax.Array:
  """`causal_attention` where position t also sees only positions s with same_doc[t, s]. Masked
  probabilities are 0, so the backward pass is causal_attention's."""
  return _attention_fwd(q_BHTK, k_BHTK, v_BHTK, same_doc_BTS)[0]


document_attention.defvjp(_attention_fwd, lambda res, dout: (*_attention_bwd(res, dout), None))


# Backward passes of `embed`. "scatter": jnp.take's gradient (XLA's scatter-add) in float32, the
# fastest on XLA:CPU. "scan": no scatter, for GPUs, where a scatter-add is an atomic add per token
# and element, so the tokens of a frequent id queue on one row.
EMBED_GRADS = ("scatter", "scan")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def embed(table_VD: jax.Array, ids: jax.Array, dtype, grad: str = "scatter") -> jax.Array:
  """Rows `ids` of the float32 `table_VD` (ids < 0 count from the end, ids >= V give NaN rows, as
  `jnp.take`), cast to `dtype`: only the rows looked up are cast, never the whole table. The
  table's gradient is summed in float32 whatever `dtype` is, by the backward pass `grad`."""
  return jnp.take(table_VD, ids, axis=0).astype(dtype)


def _embed_bwd(dtype, grad, residuals, g):
  table_VD, ids = residuals
  ids_N, g_ND = ids.reshape(-1), g.reshape(-1, g.shape[-1])
  if grad == "scatter":  # jnp.take's own gradient, taken in float32 (the table is float32)
    take = lambda t: jnp.take(t, ids_N, axis=0)
    return jax.vjp(take, table_VD)[1](g_ND.astype(table_VD.dtype))[0], None
  if grad == "scan":
    return segment_sums(ids_N, g_ND, table_VD.shape[0]), None
  raise ValueError(f"embed: grad must be one of {EMBED_GRADS}, got {grad!r}")


embed.defvjp(lambda table, ids, dtype, grad: (embed(table, ids, dtype, grad), (table, ids)), _embed_bwd)


def segment_sums(ids_N: jax.Array, x_ND: jax.Array, V: int) -> jax.Array:
  """float32[V, D]: row v sums the rows of `x_ND` whose id is v (ids < 0 count from the end, ids
  >= V are dropped), with no scatter: sort the ids, sum each run of equal ids by a segmented
  scan (log-depth and elementwise, whatever the ids), then gather each id's run total."""
  ids_N = jnp.where(ids_N < 0, ids_N + V, ids_N)
  sorted_N, order_N = jax.lax.sort((ids_N, jnp.arange(ids_N.shape[0], dtype=ids_N.dtype)), num_keys=1)
  starts_N = jnp.concatenate([jnp.ones((1,), bool), sorted_N[1:] != sorted_N[:-1]])

  def add_within_runs(a, b):  # a run's start discards what came before it
    (start_a, sum_a), (start_b, sum_b) = a, b
    return start_a | start_b, jnp.where(start_b[:, None], sum_b, sum_a + sum_b)

  _, sums_ND = jax.lax.associative_scan(add_within_runs, (starts_N, x_ND[order_N].astype(jnp.float32)))
  v_V = jnp.arange(V, dtype=sorted_N.dtype)
  last_V = jnp.maximum(jnp.searchsorted(sorted_N, v_V, side="right", method="scan_unrolled") - 1, 0)
  return jnp.where((sorted_N[last_V] == v_V)[:, None], sums_ND[last_V], 0.0)
