"""The hand-written backward passes equal autodiff of the plain formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain.core import ops


def _grads(f, *args):
  out = jax.random.normal(jax.random.PRNGKey(9), jax.eval_shape(f, *args).shape)
  return jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * out), argnums=tuple(range(len(args))))(*args)


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
