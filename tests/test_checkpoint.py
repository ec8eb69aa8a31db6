"""Checkpoints: a save/restore round trip is exact, and retention keeps latest + best."""

import grain
import jax
import numpy as np
import pytest

from jaxtrain import testing
from jaxtrain.checkpoints import store
from jaxtrain.core import programs
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.testing import assert_trees_equal, init, tiny_config

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too


def test_save_then_restore_gives_an_identical_state(tiny, tmp_path):
  tiny.train.grad_accum = 2  # MultiSteps state, accumulators included
  tiny.model.dropout = 0.1  # the RNG matters
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  p = programs.build(tiny, corpus.tokenizer.vocab_size)
  state = p.init()
  args = (tiny.train.batch_size, tiny.model.seq_len, tiny.seed)
  it = corpus_lib.train_iterator(corpus, *args)
  for _ in range(5):  # ends mid-accumulation: accumulators hold a gradient
    state, _ = p.train_step(state, p.place(next(it)))
  saved = jax.device_get(state.arrays())

  ckpts = store.Checkpoints(tiny.workdir, keep=2)
  ckpts.save(state, it, {"note": "hi"})
  fresh_it = corpus_lib.train_iterator(corpus, *args)
  restored = testing.restore(ckpts, int(state.step), p.abstract, p.shardings, fresh_it)
  ckpts.close()
  assert_trees_equal(jax.device_get(restored.arrays()), saved)
  assert fresh_it.get_state() == it.get_state() == {"next_index": 5}
  np.testing.assert_array_equal(next(fresh_it)["tokens"], next(it)["tokens"])
  assert ckpts.read_meta(int(state.step)) == {"note": "hi"}


def test_retention_keeps_the_latest_and_the_best(tmp_path):
  state = init(tiny_config())
  ckpts = store.Checkpoints(str(tmp_path), keep=2)
  it = iter(grain.MapDataset.range(10).to_iter_dataset())
  for step, val in [(1, 3.0), (2, 1.0), (3, 2.0), (4, None), (5, 2.5), (6, None)]:
    ckpts.save(state.replace(step=jax.numpy.array(step)), it, {}, val_loss=val)
  ckpts.close()
  assert ckpts.all_steps() == [2, 5, 6]  # best (val 1.0) plus the latest two
  assert ckpts.latest_step() == 6


def test_a_partial_checkpoint_is_never_picked(tmp_path):
  state = init(tiny_config())
  ckpts = store.Checkpoints(str(tmp_path), keep=2)
  it = iter(grain.MapDataset.range(10).to_iter_dataset())
  ckpts.save(state.replace(step=jax.numpy.array(3)), it, {})
  ckpts.close()
  # What a kill during a save leaves behind: orbax's temporary directory for a later step.
  (tmp_path / "checkpoints" / "7.orbax-checkpoint-tmp-123").mkdir()
  assert store.Checkpoints(str(tmp_path), keep=2).latest_step() == 3
