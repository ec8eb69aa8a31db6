"""The lowered-step cache: same numbers as plain jit, one file per program, a new key per config."""

import jax
import numpy as np

from jaxtrain import config, sharding, steps
from jaxtrain.testing import assert_trees_equal, model_config, random_batch, tiny_config


def _steps(cfg, key):
  mc = model_config(cfg)
  mesh = sharding.make_mesh(cfg)
  abstract = steps.abstract_state(cfg, mc)
  state = sharding.init_sharded(lambda: steps.init_state(cfg, mc), abstract, mesh, key)
  train, evaluate = sharding.jit_steps(abstract, mesh, key)
  return state, train, evaluate, mesh


def test_cached_steps_match_plain_jit_and_reuse_their_files(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path))
  cfg = tiny_config(**{"train.grad_accum": 2, "train.batch_size": 4})
  key = {"config": cfg.to_dict(), "batch_shape": [4, cfg.model.seq_len + 1]}
  batches = [random_batch(cfg, seed=i) for i in range(4)]

  plain_state, plain_train, plain_eval, mesh = _steps(cfg, None)
  cached_state, cached_train, cached_eval, _ = _steps(cfg, key)
  assert_trees_equal(jax.device_get(cached_state.arrays()), jax.device_get(plain_state.arrays()))
  for b in batches:
    b = sharding.global_batch(b, mesh)
    plain_state, pm = plain_train(plain_state, b)
    cached_state, cm = cached_train(cached_state, b)
    assert_trees_equal(jax.device_get(cm), jax.device_get(pm))
  assert_trees_equal(jax.device_get(cached_state.arrays()), jax.device_get(plain_state.arrays()))
  b = sharding.global_batch(batches[0], mesh)
  assert float(cached_eval(cached_state, b)["loss"]) == float(plain_eval(plain_state, b)["loss"])

  files = sorted(p.name.split("-")[0] for p in (tmp_path / "aot").iterdir())
  assert files == ["eval_step", "init_state", "train_step"]
  mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "aot").iterdir()}
  _steps(cfg, key)  # loaded, not written again
  assert {p: p.stat().st_mtime_ns for p in (tmp_path / "aot").iterdir()} == mtimes
  other = config.override(cfg.copy_and_resolve_references(), **{"optim.lr": 0.5})
  _steps(other, {"config": other.to_dict(), "batch_shape": key["batch_shape"]})
  assert len(list((tmp_path / "aot").glob("train_step-*.bin"))) == 2  # a new program, a new key


def test_train_step_reports_exactly_the_declared_metrics():
  cfg = tiny_config()
  state = steps.init_state(cfg, model_config(cfg))
  _, metrics = jax.jit(steps.train_step)(state, random_batch(cfg))
  assert tuple(sorted(metrics)) == tuple(sorted(steps.TRAIN_METRICS))
  assert tuple(jax.jit(steps.eval_step)(state, random_batch(cfg))) == steps.EVAL_METRICS
  assert all(np.ndim(v) == 0 for v in metrics.values())
