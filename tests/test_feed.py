"""The loop keeps the device busy: batches are placed ahead (loop/feed.py), and a step's metrics
are copied back only for the steps that log, once the next step is queued."""

import jax
import numpy as np
import pytest

from jaxtrain import train
from jaxtrain.core import programs
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.loop.feed import DeviceFeed
from jaxtrain.trackers.hooks import Hook


def _iterator(tiny):
  corpus = corpus_lib.prepare(tiny.data)
  return corpus_lib.train_iterator(corpus, tiny.train.batch_size, tiny.model.seq_len, tiny.seed)


def test_the_feed_gives_the_iterators_batches_placed_and_counts_what_was_taken(tiny):
  p = programs.build(tiny, 256, jax.devices()[:1])
  plain, feed = _iterator(tiny), DeviceFeed(_iterator(tiny), p.place, depth=3)
  for i in range(7):
    batch = next(feed)
    feed.fill()
    assert isinstance(batch["tokens"], jax.Array)
    np.testing.assert_array_equal(np.asarray(batch["tokens"]), next(plain)["tokens"])
    # Three batches were read ahead, but a checkpoint must resume at the next one taken.
    assert feed.get_state() == {"next_index": i + 1}
    assert feed.iterator.get_state() == {"next_index": i + 4}
  feed.set_state({"next_index": 2})  # a resume: what was read ahead is dropped
  np.testing.assert_array_equal(np.asarray(next(feed)["tokens"]),
                                next(_iter_at(tiny, 2))["tokens"])


def _iter_at(tiny, index):
  it = _iterator(tiny)
  it.set_state({"next_index": index})
  return it


class _Order(Hook):
  """Records the order of the loop's calls: ("step", n) once step n is queued, ("log", n)."""

  def __init__(self):
    self.events = []

  def on_step(self, step, state):
    self.events.append(("step", step))

  def on_log(self, step, record):
    self.events.append(("log", step))


@pytest.mark.slow
def test_a_log_line_is_read_once_the_next_step_is_queued(tiny):
  cfg = tiny.copy_and_resolve_references()
  cfg.train.max_steps, cfg.train.log_every, cfg.train.eval_every = 12, 3, 100
  cfg.train.checkpoint_every = 100
  cfg.sample.num_samples = 0
  order = _Order()
  train.run(cfg, show_progress=False, hooks=(order,))
  logs = [n for kind, n in order.events if kind == "log"]
  assert logs == [3, 6, 9, 12]
  for n in (3, 6, 9):  # step n's line comes after step n + 1 was queued
    assert order.events.index(("log", n)) == order.events.index(("step", n + 1)) + 1
  # The last step evaluates and saves, which wait for it anyway: its line comes at once.
  assert order.events.index(("log", 12)) == order.events.index(("step", 12)) + 1


@pytest.mark.slow
def test_between_log_steps_nothing_is_copied_back(tiny, monkeypatch):
  cfg = tiny.copy_and_resolve_references()
  cfg.train.max_steps, cfg.train.log_every, cfg.train.eval_every = 12, 4, 100
  cfg.train.checkpoint_every = 100
  cfg.sample.num_samples = 0
  order, copies = _Order(), []
  real_get = jax.device_get

  def device_get(x):  # the real copy, noted with the last step queued when it was asked for
    steps = [n for kind, n in order.events if kind == "step"]
    copies.append(steps[-1] if steps else 0)
    return real_get(x)

  monkeypatch.setattr(jax, "device_get", device_get)
  train.run(cfg, show_progress=False, hooks=(order,))
  during = [n for n in copies if 1 < n < cfg.train.max_steps]
  # Steps 4 and 8 log, each read once step 5 or 9 is queued; no other step copies anything.
  assert during == [5, 9]
