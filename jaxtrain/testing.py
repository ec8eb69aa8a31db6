"""Helpers that keep unit tests of models and steps short: a tiny config, batches, tree checks, and
a checkpoint round trip."""

import jax
import ml_collections
import numpy as np

from jaxtrain.checkpoints.store import Checkpoints, Damaged
from jaxtrain.config.defaults import default_config
from jaxtrain.config.loading import override
from jaxtrain.core import model as model_lib
from jaxtrain.core import programs, steps


def tiny_config(**overrides) -> ml_collections.ConfigDict:
  """A ~30k-parameter model that compiles in a second or two on a laptop CPU.

  Overrides use dotted names: `tiny_config(**{"train.grad_accum": 2, "model.pos": "learned"})`.
  """
  cfg = default_config()
  cfg.workdir = "runs/tiny"
  cfg.model.n_layers = 2
  cfg.model.n_heads = 4
  cfg.model.d_model = 32
  cfg.model.seq_len = 32
  cfg.train.batch_size = 8
  cfg.train.max_steps = 20
  cfg.train.log_every = 5
  cfg.train.eval_every = 10
  cfg.train.eval_steps = 2
  cfg.train.checkpoint_every = 10
  cfg.optim.warmup_steps = 2
  cfg.optim.lr = 3e-3
  cfg.sample.num_samples = 1
  cfg.sample.max_new_tokens = 16
  return override(cfg, **overrides)


def model_config(cfg: ml_collections.ConfigDict, vocab_size: int = 256) -> model_lib.ModelConfig:
  return model_lib.ModelConfig.from_config(cfg.model, cfg.model.vocab_size or vocab_size, cfg.ext)


def init(cfg: ml_collections.ConfigDict, vocab_size: int = 256) -> steps.TrainState:
  """A fresh train state for `cfg`, on the default device, made as a run makes it."""
  return programs.build(cfg, cfg.model.vocab_size or vocab_size, jax.devices()[:1]).init()


def random_batch(cfg: ml_collections.ConfigDict, seed: int = 0, vocab_size: int = 256,
                 batch_size: int | None = None) -> dict:
  """`{"tokens": int32[B, seq_len + 1]}` of uniform random tokens."""
  rng = np.random.default_rng(seed)
  B = batch_size or cfg.train.batch_size
  return {"tokens": rng.integers(0, vocab_size, (B, cfg.model.seq_len + 1)).astype(np.int32)}


def split_batch(batch: dict, k: int) -> list[dict]:
  """`k` micro-batches whose concatenation is `batch`."""
  parts = {name: np.split(np.asarray(v), k) for name, v in batch.items()}
  return [{name: parts[name][i] for name in batch} for i in range(k)]


def assert_trees_equal(a, b) -> None:
  """Same structure and bit-for-bit equal leaves."""
  assert jax.tree.structure(a) == jax.tree.structure(b), "tree structures differ"
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, f"{jax.tree_util.keystr(path)}: dtype/shape"
    assert np.array_equal(x, y, equal_nan=True), f"{jax.tree_util.keystr(path)} differs"


def assert_trees_close(a, b, atol: float = 1e-6, rtol: float = 0.0) -> None:
  assert jax.tree.structure(a) == jax.tree.structure(b), "tree structures differ"
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=rtol,
                               err_msg=jax.tree_util.keystr(path))


def restore(ckpts: Checkpoints, step: int, state: steps.TrainState,
            shardings: steps.TrainState | None = None, iterator=None) -> steps.TrainState:
  """Step `step` of `ckpts` read into `state`'s structure, once pending saves are written; raises
  Damaged if its arrays fail their checksums (an `iterator` is repositioned in place)."""
  ckpts.manager.wait_until_finished()
  restored, saved = ckpts.read(step, state, shardings, iterator)
  problem = ckpts.verify(restored, saved)
  if problem:
    raise Damaged(problem)
  return restored
