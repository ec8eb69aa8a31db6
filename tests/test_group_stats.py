"""Per-group statistics from the train step: each group's gradient norm, parameter norm and
update-to-parameter ratio, checked against the trees themselves (numpy), with and without
gradient accumulation; and in a run's metrics.jsonl and TensorBoard."""

import functools
import json

import jax
import numpy as np
import pytest

from jaxtrain import train
from jaxtrain.core import programs, stats, steps
from jaxtrain.testing import init, random_batch, tiny_config


def _by_group(tree, mode: str) -> dict[str, np.ndarray]:
  """Each group's leaves as one flat float64 vector (independently of stats.group_stats)."""
  leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)]
  return {g: np.concatenate([leaves[i] for i in idx]) for g, idx in stats.groups(tree, mode).items()}


def _step(mode: str):
  return jax.jit(functools.partial(steps.train_step, stats=mode))


def test_group_names_cover_every_param_once():
  cfg = tiny_config(**{"model.tie_embeddings": False, "model.pos": "learned", "model.qk_norm": True})
  params = init(cfg).params
  n_leaves = len(jax.tree.leaves(params))
  grouped = stats.groups(params, "groups")
  assert set(grouped) == {"embedding", "attention", "mlp", "norms", "head"}
  assert sorted(i for idx in grouped.values() for i in idx) == list(range(n_leaves))
  layers = stats.groups(params, "layers")
  assert set(layers) == {"embedding", "head", "norms", *(f"layer{i}.{g}" for i in range(2)
                                                       for g in ("attention", "mlp", "norms"))}
  assert sorted(i for idx in layers.values() for i in idx) == list(range(n_leaves))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["groups", "layers"])
def test_statistics_equal_the_norms_of_the_trees(mode):
  cfg = tiny_config(**{"optim.warmup_steps": 0})
  state, batch = init(cfg), random_batch(cfg)
  grads = jax.jit(steps.gradients)(state, batch["tokens"], None)[1]
  new, metrics = _step(mode)(state, batch)
  old_p, new_p, g = (_by_group(t, mode) for t in (state.params, new.params, grads))
  names = set(old_p)
  assert {k for k in metrics if stats.is_stat(k)} == {f"{s}/{n}" for s in stats.STATS for n in names}
  for name in names:
    assert float(metrics[f"grad_norm/{name}"]) == pytest.approx(np.linalg.norm(g[name]), rel=1e-4)
    assert float(metrics[f"param_norm/{name}"]) == pytest.approx(np.linalg.norm(old_p[name]), rel=1e-5)
    ratio = np.linalg.norm(new_p[name] - old_p[name]) / np.linalg.norm(old_p[name])
    assert 0 < ratio < 1
    assert float(metrics[f"update_ratio/{name}"]) == pytest.approx(ratio, rel=1e-3)
  # The groups split the global gradient norm.
  total = sum(float(metrics[f"grad_norm/{n}"]) ** 2 for n in names)
  assert total == pytest.approx(float(metrics["grad_norm"]) ** 2, rel=1e-4)


@pytest.mark.slow
def test_with_accumulation_the_ratio_is_of_the_applied_update():
  cfg = tiny_config(**{"train.grad_accum": 2, "optim.warmup_steps": 0})
  built = programs.build(cfg, 256, jax.devices()[:1])
  state, batch = built.init(), random_batch(cfg)
  before = _by_group(state.params, "groups")
  state, first = built.train_step(state, batch)
  state, second = built.train_step(state, random_batch(cfg, seed=1))
  after = _by_group(state.params, "groups")
  assert int(state.step) == 1
  for name in before:
    assert float(first[f"update_ratio/{name}"]) == 0.0  # accumulated only, nothing applied
    ratio = np.linalg.norm(after[name] - before[name]) / np.linalg.norm(before[name])
    assert ratio > 0
    assert float(second[f"update_ratio/{name}"]) == pytest.approx(ratio, rel=1e-3)
    assert float(first[f"grad_norm/{name}"]) > 0 and float(second[f"grad_norm/{name}"]) > 0
  host = [jax.device_get(first), jax.device_get(second)]
  step = stats.combine(host)
  assert step["update_ratio/mlp"] == float(host[1]["update_ratio/mlp"])
  assert step["grad_norm/mlp"] == pytest.approx((float(host[0]["grad_norm/mlp"])
                                                 + float(host[1]["grad_norm/mlp"])) / 2)


@pytest.mark.slow
def test_none_adds_nothing():
  cfg = tiny_config()
  _, metrics = _step("none")(init(cfg), random_batch(cfg))
  assert not any(stats.is_stat(k) for k in metrics)
  built = programs.build(tiny_config(**{"log.group_stats": "none"}), 256, jax.devices()[:1])
  _, metrics = built.train_step(built.init(), random_batch(cfg))
  assert set(metrics) == set(steps.TRAIN_METRICS)


@pytest.mark.slow
def test_a_run_logs_them_on_log_steps(tiny, tmp_path):
  from tensorboard.backend.event_processing import event_accumulator

  tiny.train.max_steps = 6
  tiny.train.log_every = 3
  tiny.log.group_stats = "layers"
  train.run(tiny, show_progress=False)
  workdir = tmp_path / "run"
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  logged = [r for r in records if "loss" in r]
  assert [r["step"] for r in logged] == [3, 6]
  for r in logged:
    assert r["update_ratio/layer1.attention"] > 0 and r["param_norm/embedding"] > 0
    assert {k.split("/")[1] for k in r if k.startswith("grad_norm/")} >= {"layer0.mlp", "norms"}
  acc = event_accumulator.EventAccumulator(str(workdir), size_guidance={"scalars": 0}).Reload()
  ratio = acc.Scalars("update_ratio/layer1.attention")
  assert [e.step for e in ratio] == [3, 6]
  assert ratio[-1].value == pytest.approx(logged[-1]["update_ratio/layer1.attention"], rel=1e-6)
