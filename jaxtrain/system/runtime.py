"""Process-level JAX plumbing: the compile cache, the backend's start, the join of a run's
processes and the collectives between them, and how far dispatches may run ahead of the device.
What this process runs on, and whether it joins others, is system/startup.py's decision."""

import collections
import importlib.util
import os

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxtrain.system import peers
from jaxtrain.system.errors import UserError, first_line
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


_NO_CUDA = ("this jax has no working CUDA backend{why}; install one with `pip install -e "
            "'.[cuda12]'` (or '.[cuda13]'; needs an NVIDIA driver), or pass --jax_platforms=cpu")


def check_platform(cuda_installed: bool) -> str:
  """Starts the backend, so that a missing one fails here with a fix, not deep inside a step;
  returns the platform it started ("cpu", "gpu", ...). `cuda_installed`: a CUDA plugin is."""
  wanted = jax.config.jax_platforms or ""
  wants_gpu = any(p in wanted for p in ("cuda", "gpu"))
  if wants_gpu and not (cuda_installed or importlib.util.find_spec("jaxlib.cuda")):
    raise UserError(f"--jax_platforms={wanted}: " + _NO_CUDA.format(why=" (no CUDA plugin installed)"))
  try:
    return jax.devices()[0].platform
  except Exception as e:  # jax raises RuntimeError or AssertionError depending on the platform
    first = first_line(e)[:160]
    if wants_gpu:
      raise UserError(f"--jax_platforms={wanted}: " + _NO_CUDA.format(why=f" ({first})")) from None
    raise UserError(f"jax could not start {wanted or 'its default platform'} ({first}); "
                    "pass --jax_platforms=cpu") from None


# jax's heartbeat ends a process blocked on a vanished one this long after a CPU collective's own
# timeout (startup.COLLECTIVE_TIMEOUT) stopped it with its one line.
HEARTBEAT_GRACE_S = 30


def init_distributed(distributed: ml_collections.ConfigDict) -> None:
  """Joins a multi-process run: explicit `distributed.*` fields, or Slurm's environment (srun)."""
  try:
    # The heartbeat timeout bounds how long a survivor stays blocked on a vanished process (jax
    # then ends it); a collective that fails ends it at once (peers.py). jax's preemption notifier
    # takes SIGTERM over until the loop's own handler: a SIGTERM raised on one process while
    # another waits in a collective would hang both. Unset fields (None): from the environment.
    pid = distributed.process_id
    jax.distributed.initialize(coordinator_address=distributed.coordinator_address or None,
                               num_processes=distributed.num_processes or None,
                               process_id=pid if pid >= 0 else None,
                               initialization_timeout=distributed.timeout_s,
                               heartbeat_timeout_seconds=distributed.timeout_s + HEARTBEAT_GRACE_S)
  except Exception as e:
    raise UserError(f"joining the multi-process run failed ({first_line(e)[:200]}); check "
                    "distributed.coordinator_address (host:port of process 0, reachable from every "
                    "process), distributed.num_processes and distributed.process_id") from None


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
