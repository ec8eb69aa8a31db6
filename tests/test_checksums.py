"""A checkpoint's checksums (checkpoints/store.py) are the same whether numpy makes them on the
host (a small state in one process on the CPU) or the compiled program does: a checkpoint saved
one way is checked on restore the other way."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain.checkpoints import store


def arrays() -> dict:
  rng = np.random.default_rng(0)
  return {"params": {"w": jnp.asarray(rng.standard_normal((37, 5)), jnp.float32),
                     "b16": jnp.asarray(rng.standard_normal((3, 4, 5)), jnp.bfloat16),
                     "v": jnp.zeros((7,), jnp.float32)},
          "step": jnp.array(123, jnp.int32), "key": jax.random.PRNGKey(7),
          "flags": jnp.array([True, False, True]), "small": jnp.arange(-4, 4, dtype=jnp.int8)}


def test_numpy_and_the_program_give_the_same_checksums(monkeypatch):
  state = arrays()
  assert store.on_host(state)
  host = store.survey(state)
  monkeypatch.setattr(store, "HOST_SURVEY_VALUES", 0)  # the compiled program, as for a large state
  assert not store.on_host(state)
  assert store.survey(state) == host
  assert host[0] and len(set(host[1].values())) == len(host[1])
  # A chunk boundary inside an array changes nothing; one flipped bit changes its digest.
  w = np.asarray(state["params"]["w"])
  assert store.host_digest(w, chunk=16) == host[1]["params/w"]
  flipped = w.copy()
  flipped.view(np.uint32)[3, 2] ^= 1
  assert store.host_digest(flipped) != host[1]["params/w"]


def test_a_non_finite_param_is_found_either_way(monkeypatch):
  state = arrays()
  state["params"]["v"] = state["params"]["v"].at[3].set(jnp.nan)
  assert store.survey(state)[0] is False
  monkeypatch.setattr(store, "HOST_SURVEY_VALUES", 0)
  assert store.survey(state)[0] is False
