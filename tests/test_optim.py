"""Schedules and Muon: the learning rates each schedule gives, Muon's groups, and that a Muon
run learns, accumulates like one big batch and resumes bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain import testing
from jaxtrain.core import optim, programs
from jaxtrain.testing import assert_trees_equal, random_batch, split_batch, tiny_config

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too


def _optimizer(**kw) -> optim.Optimizer:
  base = dict(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, decay_steps=0, weight_decay=0.0,
              clip_norm=0.0, b1=0.9, b2=0.95, eps=1e-8, max_steps=100)
  return optim.Optimizer(**{**base, **kw})


def test_schedules_warm_up_then_follow_their_shape():
  at = lambda o, *steps: [float(optim.lr_schedule(o, o.max_steps)(s)) for s in steps]
  for schedule in ("cosine", "wsd", "constant"):
    o = _optimizer(schedule=schedule)
    np.testing.assert_allclose(at(o, 0, 4, 9), [1 / 11, 5 / 11, 10 / 11], rtol=1e-6)
  # wsd: the peak until the last 20% of the steps, then a straight line down to lr * 0.1.
  np.testing.assert_allclose(at(_optimizer(schedule="wsd"), 10, 50, 80, 90, 100, 200),
                             [1, 1, 1, 0.55, 0.1, 0.1], rtol=1e-6)
  np.testing.assert_allclose(at(_optimizer(schedule="wsd", decay_fraction=0.5), 50, 75),
                             [1, 0.55], rtol=1e-6)
  np.testing.assert_allclose(at(_optimizer(schedule="constant"), 10, 99, 1000), [1, 1, 1])
  cosine = at(_optimizer(), 10, 55, 100)
  np.testing.assert_allclose(cosine, [1, 0.55, 0.1], rtol=1e-5)


def test_muon_groups_every_param_by_its_role():
  cfg = tiny_config(**{"optim.name": "muon", "model.tie_embeddings": False,
                       "model.pos": "learned"})
  params = programs.build(cfg, 256, jax.devices()[:1]).init().params
  groups = optim.param_groups(params)
  flat = {jax.tree_util.keystr(k, simple=True, separator="/"): g
          for k, g in jax.tree_util.tree_flatten_with_path(groups)[0]}
  assert flat["wte/embedding"] == flat["wpe"] == "embedding"
  assert flat["lm_head/kernel"] == "head"
  assert flat["blocks/0/attn/qkv/kernel"] == flat["blocks/1/mlp/down/kernel"] == "matrix"
  assert flat["norm_f/scale"] == flat["blocks/0/norm1/scale"] == "vector"


@pytest.mark.slow
def test_muon_learns_and_its_matrix_updates_are_orthogonal():
  cfg = tiny_config(**{"optim.name": "muon", "optim.schedule": "wsd", "optim.warmup_steps": 2,
                       "train.max_steps": 30, "optim.weight_decay": 0.0})
  p = programs.build(cfg, 256, jax.devices()[:1])
  state, losses = p.init(), []
  batch = random_batch(cfg, seed=3)  # the same batch each step: the loss falls fast
  for _ in range(30):
    before = np.asarray(state.params["blocks"][0]["mlp"]["down"]["kernel"])  # the step donates
    state, metrics = p.train_step(state, batch)
    losses.append(float(metrics["loss"]))
    if len(losses) == 1:  # all singular values of Muon's first update of a matrix are alike
      update = np.asarray(state.params["blocks"][0]["mlp"]["down"]["kernel"]) - before
      s = jnp.linalg.svd(update, compute_uv=False)
      assert float(s[-1] / s[0]) > 0.5, s
  assert np.mean(losses[-5:]) < losses[0] - 0.5, losses


def test_muons_looped_newton_schulz_equals_optaxs_unrolled_one():
  """The loop gives optax's updates bit for bit, and its state the same layout (checkpoints)."""
  import optax

  rng = np.random.default_rng(0)
  params = {"a": jnp.asarray(rng.normal(size=(96, 288)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(256, 96)), jnp.float32)}
  unrolled = optax.contrib.scale_by_muon(ns_steps=5, beta=0.95, nesterov=True,
                                         weight_dimension_numbers=optim._matrix_dims)
  looped = optim.scale_by_muon(5, 0.95)
  s_unrolled, s_looped = unrolled.init(params), looped.init(params)
  assert jax.tree.structure(s_unrolled) == jax.tree.structure(s_looped)
  assert [x.shape for x in jax.tree.leaves(s_unrolled)] == [x.shape for x in jax.tree.leaves(s_looped)]
  for _ in range(3):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    u_unrolled, s_unrolled = jax.jit(unrolled.update)(grads, s_unrolled)
    u_looped, s_looped = jax.jit(looped.update)(grads, s_looped)
    assert_trees_equal((u_looped, s_looped), (u_unrolled, s_unrolled))


@pytest.mark.slow
def test_muon_accumulation_equals_one_big_batch():
  big = tiny_config(**{"optim.name": "muon", "train.batch_size": 8})
  small = tiny_config(**{"optim.name": "muon", "train.batch_size": 4, "train.grad_accum": 2})
  p_big, p_small = (programs.build(c, 256, jax.devices()[:1]) for c in (big, small))
  state_big, state_small = p_big.init(), p_small.init()
  for seed in (5, 6):
    batch = random_batch(big, seed=seed)
    state_big, _ = p_big.train_step(state_big, batch)
    for half in split_batch(batch, 2):
      state_small, _ = p_small.train_step(state_small, half)
  assert int(state_small.step) == int(state_big.step) == 2
  for a, b in zip(jax.tree.leaves(state_big.params), jax.tree.leaves(state_small.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


@pytest.mark.slow
def test_muon_state_goes_through_a_checkpoint(tmp_path):
  from jaxtrain.checkpoints import store
  cfg = tiny_config(**{"optim.name": "muon", "optim.schedule": "wsd"})
  p = programs.build(cfg, 256, jax.devices()[:1])
  state = p.init()
  for seed in range(3):
    state, _ = p.train_step(state, random_batch(cfg, seed=seed))
  ckpts = store.Checkpoints(str(tmp_path))
  ckpts.save(state)
  restored = testing.restore(ckpts, 3, p.abstract, p.shardings)
  ckpts.close()
  assert_trees_equal(restored.arrays(), state.arrays())
  batch = random_batch(cfg, seed=9)
  b, _ = p.train_step(restored, batch)
  a, _ = p.train_step(state, batch)
  assert_trees_equal(a.arrays(), b.arrays())


def _grouped_params():
  return {"wte": {"embedding": jnp.ones((4, 3))}, "lm_head": {"kernel": jnp.ones((3, 4))},
          "blocks": {"up": {"kernel": jnp.ones((3, 3))}}, "norm": {"scale": jnp.ones((3,))}}


@pytest.mark.slow
def test_muon_weight_decay_is_set_per_group():
  params = _grouped_params()
  grads = jax.tree.map(jnp.zeros_like, params)  # no gradient: each update is decay alone
  def decay(**kw):
    o = _optimizer(name="muon", schedule="constant", warmup_steps=0, lr=0.1, matrix_lr=0.1,
                   weight_decay=0.5, **kw).transformation()
    updates, _ = o.update(grads, o.init(params), params)
    return [round(float(jax.tree.leaves(updates[k])[0].ravel()[0]), 6)
            for k in ("wte", "lm_head", "blocks", "norm")]
  # default: matrices and the head decay at weight_decay; embeddings and norms do not
  assert decay() == [0.0, -0.05, -0.05, 0.0]
