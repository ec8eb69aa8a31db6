"""The hand-written backward passes equal autodiff of the plain formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain.core import ops


def _grads(f, *args):
  out = jax.random.normal(jax.random.PRNGKey(9), jax.eval_shape(f, *args).shape)
  return jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * out), argnums=tuple(range(len(args))))(*args)


@pytest.mark.slow
@pytest.mark.parametrize("d_in,d_out", [(16, 48), (48, 16)])  # both transpose choices
def test_dense_gradients_match_autodiff(d_in, d_out):
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x, w = jax.random.normal(kx, (3, 5, d_in)), jax.random.normal(kw, (d_in, d_out))
  np.testing.assert_allclose(ops.dense(x, w), x @ w, rtol=1e-6)
  for mine, ref in zip(_grads(ops.dense, x, w), _grads(lambda a, b: a @ b, x, w)):
    assert mine.shape == ref.shape and mine.dtype == ref.dtype
    np.testing.assert_allclose(mine, ref, rtol=2e-5, atol=2e-5)


def _reference_attention(q, k, v):
  heads = lambda x: jnp.transpose(x, (0, 2, 1, 3))
  return heads(jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True))


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)])
def test_causal_attention_matches_jax_in_value_and_gradient(dtype, tol):
  q, k, v = (jax.random.normal(key, (2, 3, 17, 8), dtype)
             for key in jax.random.split(jax.random.PRNGKey(1), 3))
  np.testing.assert_allclose(ops.causal_attention(q, k, v).astype(jnp.float32),
                             _reference_attention(q, k, v).astype(jnp.float32), rtol=tol, atol=tol)
  for mine, ref in zip(_grads(ops.causal_attention, q, k, v), _grads(_reference_attention, q, k, v)):
    assert mine.dtype == dtype
    np.testing.assert_allclose(mine.astype(jnp.float32), ref.astype(jnp.float32), rtol=tol,
                               atol=tol)


def test_attention_is_causal_in_the_backward_pass_too():
  q, k, v = (jax.random.normal(key, (1, 1, 6, 4)) for key in jax.random.split(jax.random.PRNGKey(2), 3))
  # The loss reads only position 2: keys and values after it must get exactly zero gradient.
  _, dk, dv = jax.grad(lambda *a: jnp.sum(ops.causal_attention(*a)[0, 0, 2]), argnums=(0, 1, 2))(q, k, v)
  assert np.all(dk[0, 0, 3:] == 0) and np.all(dv[0, 0, 3:] == 0)
  assert np.any(dk[0, 0, :3] != 0) and np.any(dv[0, 0, :3] != 0)


def _ids(kind: str, n: int, vocab: int) -> np.ndarray:
  """Token ids as a batch may hold them: one id throughout, uniform, or Zipfian (a few ids take most
  positions), in the batch's order; "unused": a few ids of a large vocabulary, most rows unused;
  "out_of_range": some ids past either end (a negative id counts from the end, as in jnp.take)."""
  rng = np.random.default_rng(len(kind))
  if kind == "equal":
    return np.full(n, 5, np.int32)
  if kind == "zipf":
    ranks = rng.zipf(1.2, 8 * n)
    return rng.permutation(vocab)[ranks[ranks <= vocab][:n] - 1].astype(np.int32)
  if kind == "unused":
    return rng.choice(rng.choice(vocab, 6, replace=False), n).astype(np.int32)
  ids = rng.integers(0, vocab, n).astype(np.int32)
  if kind == "out_of_range":
    ids[::7], ids[3::7] = -1, vocab
  return ids


def _take_grad(table, ids, g, dtype):
  """The gradient of nnx.Embed's lookup (the whole table cast to `dtype`, then jnp.take), as
  float32."""
  take = lambda t: jnp.take(t.astype(dtype), ids, axis=0)
  return jax.vjp(take, table)[1](g.astype(dtype))[0].astype(jnp.float32)


def _embed_grad(table, ids, g, dtype, grad):
  return jax.vjp(lambda t: ops.embed(t, ids, dtype, grad), table)[1](g.astype(dtype))[0]


ID_KINDS = ["equal", "uniform", "zipf", "unused", "out_of_range"]


@pytest.mark.parametrize("grad", ops.EMBED_GRADS)
@pytest.mark.parametrize("kind", ID_KINDS)
def test_embedding_gradient_equals_takes_in_float32(kind, grad):
  """Integer cotangents sum exactly in any order: bit for bit. Others to rounding (the scatter
  is jnp.take's own gradient, so bit for bit; the scan adds in another order)."""
  vocab, d = 97, 24
  table = jax.random.normal(jax.random.PRNGKey(0), (vocab, d))
  ids = jnp.asarray(_ids(kind, 2 * 150, vocab).reshape(2, 150))
  grads = [jax.jit(f, static_argnums=3)(table, ids, g, jnp.float32)
           for f in (_take_grad, lambda *a: _embed_grad(*a, grad))
           for g in (jax.random.randint(jax.random.PRNGKey(1), (2, 150, d), -8, 9).astype(jnp.float32),
                     jax.random.normal(jax.random.PRNGKey(2), (2, 150, d)))]
  (ref_int, ref), (ours_int, ours) = grads[:2], grads[2:]
  assert ours.dtype == jnp.float32 and ours.shape == (vocab, d)
  np.testing.assert_array_equal(ours_int, ref_int)
  np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-5)
  if grad == "scatter":
    np.testing.assert_array_equal(ours, ref)
  unused = np.setdiff1d(np.arange(vocab), np.asarray(ids) % vocab)
  assert len(unused) and not np.any(np.asarray(ours)[unused])  # rows never looked up: exactly 0
  assert np.any(np.asarray(ours))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embedding_lookup_equals_nnx_embeds(dtype):
  from flax import nnx
  embed = nnx.Embed(50, 8, dtype=dtype, rngs=nnx.Rngs(0))
  ids = jnp.asarray(_ids("uniform", 40, 50).reshape(5, 8))
  ours = ops.embed(embed.embedding[...], ids, dtype)
  assert ours.dtype == dtype
  np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(embed(ids), np.float32))


@pytest.mark.parametrize("grad", ops.EMBED_GRADS)
def test_bfloat16_embedding_gradients_sum_in_float32(grad):
  """bfloat16 compute, Zipfian ids (the commonest id in hundreds of positions): summed into a
  bfloat16 table (nnx.Embed's way), the rounding of every addition adds up; summed in float32
  only the cotangents' own rounding is left."""
  vocab, d, n = 300, 16, 4096
  ids = jnp.asarray(_ids("zipf", n, vocab))
  g = jax.random.normal(jax.random.PRNGKey(3), (n, d)).astype(jnp.bfloat16)
  table = jnp.zeros((vocab, d))
  exact = np.zeros((vocab, d))
  np.add.at(exact, np.asarray(ids), np.asarray(g, np.float64))
  old = np.asarray(jax.jit(_take_grad, static_argnums=3)(table, ids, g, jnp.bfloat16), np.float64)
  new = np.asarray(jax.jit(_embed_grad, static_argnums=(3, 4))(table, ids, g, jnp.bfloat16, grad),
                   np.float64)
  assert np.bincount(np.asarray(ids)).max() > 300
  new_err, old_err = np.abs(new - exact).max(), np.abs(old - exact).max()
  assert new_err < 1e-4 and old_err > 100 * new_err, (new_err, old_err)


def test_the_scan_gradient_has_no_scatter():
  ids = jnp.asarray(_ids("zipf", 64, 40))
  lowered = jax.jit(jax.grad(lambda t: ops.embed(t, ids, jnp.bfloat16, "scan").astype(jnp.float32).sum()))
  text = lowered.lower(jnp.zeros((40, 8))).as_text()
  assert "gather" in text and "scatter" not in text


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_f32_sums_into_float32_with_denses_gradients(dtype):
  kx, kw = jax.random.split(jax.random.PRNGKey(4))
  x, w = jax.random.normal(kx, (3, 5, 32), dtype), jax.random.normal(kw, (32, 48), dtype)
  y = ops.dense_f32(x, w)
  assert y.dtype == jnp.float32
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)  # no rounding to bfloat16 on the way
  rounded = lambda a, b: ops.dense(a, b).astype(jnp.float32)  # the head's way before
  for mine, ref in zip(_grads(ops.dense_f32, x, w), _grads(rounded, x, w)):
    assert mine.dtype == ref.dtype == dtype
    np.testing.assert_array_equal(np.asarray(mine, np.float32), np.asarray(ref, np.float32))
  if dtype == jnp.float32:
    np.testing.assert_array_equal(y, ops.dense(x, w))


@pytest.mark.parametrize("grad", ops.EMBED_GRADS)
def test_embedding_gradient_per_device_under_shard_map(grad):
  """As `mesh.one_allreduce_step` computes gradients: params made varying per device inside
  shard_map (one device here), each device's rows, the gradient its own until a psum."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((1,), ("data",))
  table = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (30, 8)), NamedSharding(mesh, P()))
  ids = jax.device_put(jnp.asarray(_ids("zipf", 40, 30)), NamedSharding(mesh, P("data")))
  g = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (40, 8)), NamedSharding(mesh, P("data")))

  def local(table, ids, g, lookup):
    table = jax.lax.pcast(table, "data", to="varying")
    return jax.lax.psum(jax.vjp(lambda t: lookup(t, ids), table)[1](g)[0], "data")

  specs = {"mesh": mesh, "in_specs": (P(), P("data"), P("data")), "out_specs": P()}
  grads = [jax.jit(jax.shard_map(lambda *a, f=f: local(*a, f), **specs))(table, ids, g)
           for f in (lambda t, i: ops.embed(t, i, jnp.float32, grad), lambda t, i: jnp.take(t, i, axis=0))]
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-6)
