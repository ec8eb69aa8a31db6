"""The pure train and eval steps: determinism, learning, accumulation, non-finite handling."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain import steps
from jaxtrain.testing import (assert_trees_close, assert_trees_equal, init, random_batch,
                              split_batch, tiny_config)

train_step = jax.jit(steps.train_step)
eval_step = jax.jit(steps.eval_step)


def test_train_step_is_deterministic():
  cfg = tiny_config(**{"model.dropout": 0.1})  # dropout too: its key comes from the state
  batch = random_batch(cfg)
  a, ma = train_step(init(cfg), batch)
  b, mb = train_step(init(cfg), batch)
  assert_trees_equal(a.arrays(), b.arrays())
  assert_trees_equal(ma, mb)
  assert int(a.step) == 1


def test_different_seeds_give_different_params():
  a, b = init(tiny_config(seed=0)), init(tiny_config(seed=1))
  assert not np.array_equal(a.params["wte"]["embedding"], b.params["wte"]["embedding"])


def test_overfitting_one_batch_drives_the_loss_down():
  cfg = tiny_config(**{"optim.lr": 1e-2, "optim.warmup_steps": 0, "train.max_steps": 200})
  batch = random_batch(cfg)
  state = init(cfg)
  first = float(eval_step(state, batch)["loss"])
  for _ in range(150):
    state, _ = train_step(state, batch)
  last = float(eval_step(state, batch)["loss"])
  assert first > 5.0  # ~ln(256) for an untrained model
  assert last < 0.5 * first, (first, last)


def test_grad_accumulation_equals_one_big_batch():
  k = 4
  big = tiny_config(**{"train.batch_size": 16, "train.grad_accum": 1})
  acc = tiny_config(**{"train.batch_size": 4, "train.grad_accum": k})
  batches = [random_batch(big, seed=s) for s in range(2)]
  s_big, s_acc = init(big), init(acc)
  assert_trees_equal(s_big.params, s_acc.params)  # same seed, same init
  for batch in batches:  # two optimizer steps, so Adam's moments matter too
    s_big, _ = train_step(s_big, batch)
    for micro in split_batch(batch, k):
      s_acc, _ = train_step(s_acc, micro)
  assert int(s_big.step) == int(s_acc.step) == 2
  assert_trees_close(s_big.params, s_acc.params, atol=1e-6)


def test_micro_steps_do_not_advance_the_optimizer_step():
  cfg = tiny_config(**{"train.grad_accum": 3, "train.batch_size": 4})
  state = init(cfg)
  before = state.params
  for i in range(3):
    state, _ = train_step(state, random_batch(cfg, seed=i))
    assert int(state.step) == (1 if i == 2 else 0)
    if i < 2:
      assert_trees_equal(state.params, before)  # only accumulating


def test_eval_step_matches_loss_fn():
  cfg = tiny_config()
  state, batch = init(cfg), random_batch(cfg)
  expected = steps.loss_fn(state.params, state.graphdef, jnp.asarray(batch["tokens"]))
  np.testing.assert_allclose(float(eval_step(state, batch)["loss"]), float(expected), rtol=1e-6)


def _poison(state):
  """A state whose next loss is NaN: one embedding row becomes NaN."""
  emb = state.params["wte"]["embedding"].at[0].set(jnp.nan)
  params = jax.tree.map(lambda x: x, state.params)
  params["wte"]["embedding"] = emb
  return state.replace(params=params)


def test_nonfinite_step_is_dropped_when_skipping_is_on():
  cfg = tiny_config(**{"train.skip_nonfinite": True, "train.grad_accum": 2, "train.batch_size": 4})
  state = init(cfg)
  for i in range(2):
    state, _ = train_step(state, random_batch(cfg, seed=i))
  good = state
  # A micro-batch with NaN gradients: the whole optimizer step it belongs to is dropped.
  bad_grads_state = _poison(good)
  batch = random_batch(cfg, seed=5)
  batch["tokens"][:, 0] = 0  # every sequence reads the NaN row
  s1, m1 = train_step(bad_grads_state, batch)
  s2, m2 = train_step(s1.replace(params=good.params), random_batch(cfg, seed=6))
  assert not np.isfinite(float(m1["loss"]))
  assert int(s2.step) == 2 and int(m2["skipped"]) == 1
  assert_trees_equal(s2.params, good.params)
  # The accumulator is clean afterwards: the next step learns normally.
  for i in range(2):
    s2, m = train_step(s2, random_batch(cfg, seed=7 + i))
  assert int(s2.step) == 3 and int(m["skipped"]) == 1
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(s2.params))
  assert not np.array_equal(s2.params["norm_f"]["scale"], good.params["norm_f"]["scale"])
