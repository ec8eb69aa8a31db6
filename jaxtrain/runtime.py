"""Process-level JAX setup, done once before any other JAX work: compile cache, CPU devices,
platform, processes; the collectives between processes; and the XLA options of CPU train
steps."""

import importlib.util
import os

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxtrain import allocator, peers
from jaxtrain import model as model_lib
from jaxtrain.errors import UserError
from jaxtrain.paths import cache_dir

# CPU steps of at least this many FLOPs compile without YNNPACK fusions (matmuls through Eigen);
# below it per device, several CPU devices each run their matmuls on one thread. Measured on 2 cores:
# benchmarks/results/.
LARGE_CPU_STEP_FLOPS = 1e11


def enable_compile_cache() -> None:
  """Persistent XLA cache: a restart compiles nothing it compiled before."""
  if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR wins if set
    jax.config.update("jax_compilation_cache_dir", os.path.join(cache_dir(), "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


_NO_CUDA = ("this jax has no working CUDA backend{why}; install one with `pip install -e "
            "'.[cuda12]'` (or '.[cuda13]'; needs an NVIDIA driver), or pass --jax_platforms=cpu")


def check_platform() -> str:
  """Touches the backend so a missing one fails here with a fix, not deep inside a step."""
  wanted = jax.config.jax_platforms or ""
  wants_gpu = any(p in wanted for p in ("cuda", "gpu"))
  if wants_gpu and not (allocator.cuda_installed() or importlib.util.find_spec("jaxlib.cuda")):
    raise UserError(f"--jax_platforms={wanted}: " + _NO_CUDA.format(why=" (no CUDA plugin installed)"))
  try:
    return jax.devices()[0].platform
  except Exception as e:  # jax raises RuntimeError or AssertionError depending on the platform
    first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
    if wants_gpu:
      raise UserError(f"--jax_platforms={wanted}: " + _NO_CUDA.format(why=f" ({first})")) from None
    raise UserError(f"jax could not start {wanted or 'its default platform'} ({first}); "
                    "pass --jax_platforms=cpu") from None


def wants_distributed(distributed: ml_collections.ConfigDict) -> bool:
  explicit = bool(distributed.coordinator_address) or distributed.num_processes > 1
  under_srun = int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_STEP_ID" in os.environ
  return explicit or under_srun


def init_distributed(distributed: ml_collections.ConfigDict) -> None:
  """Joins a multi-process run: explicit `distributed.*` fields, or Slurm's environment (srun)."""
  if not wants_distributed(distributed):
    return
  kwargs = {}
  if distributed.coordinator_address:
    kwargs["coordinator_address"] = distributed.coordinator_address
  if distributed.num_processes:
    kwargs["num_processes"] = distributed.num_processes
  if distributed.process_id >= 0:
    kwargs["process_id"] = distributed.process_id
  try:
    # CPU collectives go through gloo (jax's default); GPUs use NCCL. The heartbeat timeout bounds
    # how long a survivor can stay blocked without an error on a process that vanished (jax then
    # ends it with its own report); a collective that fails ends it at once (peers.py).
    jax.distributed.initialize(initialization_timeout=distributed.timeout_s,
                               heartbeat_timeout_seconds=distributed.timeout_s, **kwargs)
  except Exception as e:
    first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    raise UserError(f"joining the multi-process run failed ({first}); check "
                    "distributed.coordinator_address (host:port of process 0, reachable from every "
                    "process), distributed.num_processes and distributed.process_id") from None


def any_process(flag: bool) -> bool:
  """True if `flag` is True on any process (a collective: every process must call it)."""
  if jax.process_count() == 1:
    return flag
  with peers.ends_if_lost():
    return bool(np.any(multihost_utils.process_allgather(np.array(flag))))


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


def cpu_device_count(cfg: ml_collections.ConfigDict, cores: int | None = None) -> int:
  """How many XLA devices to split this host's CPU cores into (`mesh.cpu_devices`, 0: auto).

  One XLA CPU device runs its large matmuls on every core, but its many small matmuls and
  elementwise ops keep about one core busy; several devices' programs run side by side (data
  parallel). Auto: the most devices, up to the core count, that split this process's share of
  the batch evenly.
  """
  if cfg.mesh.cpu_devices:
    return cfg.mesh.cpu_devices
  cores = cores or len(os.sched_getaffinity(0))
  rows = cfg.train.batch_size // max(cfg.distributed.num_processes, 1)
  return max(d for d in range(1, min(cores, rows) + 1) if rows % d == 0)


def step_flops(cfg: ml_collections.ConfigDict) -> float:
  """Training FLOPs of one micro-batch, from the config alone (vocab 256 where it is 0)."""
  mc = model_lib.ModelConfig.from_config(cfg.model, cfg.model.vocab_size or 256)
  return model_lib.flops_per_step(mc, cfg.train.batch_size)


def split_cpu(cfg: ml_collections.ConfigDict) -> None:
  """On CPU, splits the cores into `cpu_device_count` XLA devices; small steps also get
  single-threaded matmuls. Only before JAX starts its backends, and never over the user's own
  --jax_num_cpu_devices or XLA_FLAGS."""
  platform = (jax.config.jax_platforms or "").split(",")[0]
  if jax.config.jax_num_cpu_devices != -1:
    return
  if platform != "cpu" and (platform or allocator.cuda_installed()):
    return
  n = cpu_device_count(cfg)
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:  # the backend already started (a notebook, a test): it stays as it is
    return
  flags = os.environ.get("XLA_FLAGS", "")
  if n > 1 and step_flops(cfg) / n < LARGE_CPU_STEP_FLOPS and "multi_thread_eigen" not in flags:
    # Small steps: each device's matmuls on one thread. Devices that each spread small
    # matmuls over every core keep waiting on each other.
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


def cpu_step_options(flops: float, xla_flags: str = "") -> dict:
  """XLA compile options for a CPU train or eval step of `flops` FLOPs (one micro-batch).

  Every step: XLA's memory-optimizing scheduler (fewer buffers live at once, same results bit
  for bit). Large steps also: matmuls through Eigen and their neighbours through XLA's own fused
  kernels instead of YNNPACK fusions (faster there; slower compiles and no gain for small steps).
  An option the user put in XLA_FLAGS wins.
  """
  options = {}
  if "scheduler_type" not in xla_flags:
    options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
  if flops >= LARGE_CPU_STEP_FLOPS and "ynn_fusion_type" not in xla_flags:
    options["xla_cpu_experimental_ynn_fusion_type"] = ""
  return options


def setup(cfg: ml_collections.ConfigDict) -> str:
  """Compile cache, CPU devices, processes; returns the platform ("cpu", "gpu", ...)."""
  enable_compile_cache()
  split_cpu(cfg)
  init_distributed(cfg.distributed)
  return check_platform()
