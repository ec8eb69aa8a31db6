"""Process-level JAX plumbing: the compile cache, the collectives between a run's processes, and
how far dispatches may run ahead of the device. What this process runs on, and the join of its
processes, is system/startup.py's decision."""

import collections
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxtrain.system import peers
from jaxtrain.system.paths import cache_dir

# Dispatches queued ahead of the device within one step (micro-batches, eval batches): a few keep
# it busy, and XLA:CPU deadlocked in a cross-device all-reduce with many two-device steps queued.
MAX_IN_FLIGHT = 4


def throttle(results: list | collections.deque) -> None:
  """Waits (without copying anything back) for the dispatch MAX_IN_FLIGHT back in `results`, so
  no more than that many are queued ahead of the device."""
  if len(results) > MAX_IN_FLIGHT:
    jax.block_until_ready(results[-MAX_IN_FLIGHT - 1])


def enable_compile_cache() -> None:
  """Persistent XLA cache: a restart compiles nothing it compiled before."""
  if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR wins if set
    jax.config.update("jax_compilation_cache_dir", os.path.join(cache_dir(), "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def any_process(flag: bool) -> bool:
  """True if `flag` is True on any process (a collective: every process must call it)."""
  if jax.process_count() == 1:
    return flag
  with peers.ends_if_lost():
    return bool(np.any(multihost_utils.process_allgather(np.array(flag))))


def preempted(step: int) -> bool:
  """Whether jax's preemption notifier caught a SIGTERM (on any process of a multi-process run,
  before the training loop took SIGTERM over) and every process has reached `step`: they all
  answer True at the same step (a collective: every process calls it at every step)."""
  if jax.process_count() == 1:
    return False
  with peers.ends_if_lost():
    try:
      return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # processes joined without the coordination service's notifier
      return False


def from_process_0(value: int) -> int:
  """Process 0's `value` on every process (a collective: every process must call it)."""
  if jax.process_count() == 1:
    return value
  with peers.ends_if_lost():
    return int(multihost_utils.broadcast_one_to_all(np.int64(value)))


def host_copy(tree):
  """Host copies of possibly sharded arrays (across processes, too: a collective)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  with peers.ends_if_lost():
    return multihost_utils.process_allgather(tree, tiled=True)


def barrier(name: str) -> None:
  if jax.process_count() > 1:
    with peers.ends_if_lost():
      multihost_utils.sync_global_devices(name)
