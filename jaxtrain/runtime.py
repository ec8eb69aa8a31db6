"""Process-level JAX setup, done once before any other JAX work: compile cache and platform."""

import dataclasses
import importlib.util
import os
import sys
import types
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxtrain import allocator, arch
from jaxtrain.config import default_cache_dir
from jaxtrain.errors import UserError


def enable_compile_cache() -> None:
  """Persistent XLA cache: a restart compiles nothing it compiled before."""
  if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR wins if set
    jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "xla"))
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
    # CPU collectives go through gloo (jax's default); GPUs use NCCL.
    jax.distributed.initialize(initialization_timeout=distributed.timeout_s, **kwargs)
  except Exception as e:
    first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    raise UserError(f"joining the multi-process run failed ({first}); check "
                    "distributed.coordinator_address (host:port of process 0, reachable from every "
                    "process), num_processes and process_id") from None


def any_process(flag: bool) -> bool:
  """True if `flag` is True on any process (a collective: every process must call it)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils

  return bool(np.any(multihost_utils.process_allgather(np.array(flag))))


def barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def cpu_device_count(cfg: ml_collections.ConfigDict, cores: int | None = None) -> int:
  """How many XLA devices to split this host's CPU cores into (`mesh.cpu_devices`, 0: auto).

  One XLA CPU device runs its program's large matmuls on every core, but its many small
  matmuls and elementwise ops keep about one core busy; two devices' programs run side by side
  (data parallel, 1.5x faster for nano-sized models on 2 cores). Auto: the most devices, up to
  the core count, that split this process's share of the batch evenly.
  """
  if cfg.mesh.cpu_devices:
    return cfg.mesh.cpu_devices
  cores = cores or len(os.sched_getaffinity(0))
  rows = cfg.train.batch_size // max(cfg.distributed.num_processes, 1)
  return max(d for d in range(1, min(cores, rows) + 1) if rows % d == 0)


def split_cpu(cfg: ml_collections.ConfigDict) -> None:
  """Applies `cpu_device_count` when the run is on CPU and nothing has started a backend yet,
  and `use_cpu_step_options`."""
  from jax._src import xla_bridge

  use_cpu_step_options(cfg)
  if xla_bridge.backends_are_initialized() or jax.config.jax_num_cpu_devices != -1:
    return  # too late to change, or --jax_num_cpu_devices was given: that wins
  platforms = (jax.config.jax_platforms or "").split(",")[0]
  has_cuda = allocator.cuda_installed()
  if platforms == "cpu" or (not platforms and not has_cuda):
    n = cpu_device_count(cfg)
    jax.config.update("jax_num_cpu_devices", n)
    flags = os.environ.get("XLA_FLAGS", "")
    if n > 1 and _flops_per_device_step(cfg, n) < SMALL_STEP_FLOPS and "multi_thread_eigen" not in flags:
      # Small steps: each device's matmuls on one thread. Devices that each spread small
      # matmuls over every core keep waiting on each other (nano-sized, 2 cores: 1.25x faster).
      os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


_STEP_OPTIONS: dict | None = None  # chosen once per process by use_cpu_step_options


def use_cpu_step_options(cfg: ml_collections.ConfigDict | None) -> None:
  """Chooses the XLA options of this process's train and eval steps on CPU (none elsewhere).

  Every step: XLA's memory-optimizing scheduler, which orders the program's ops to keep fewer
  buffers live. Same results bit for bit; step time 0.90x at the 0.8M-param benchmark model,
  0.95x for configs/nano.py, 0.91x for the 10.7M one (its temporaries 2.08 -> 1.97 GiB a device).
  Steps of >= 1e11 FLOPs also: matmuls through Eigen and their neighbours through XLA's own
  fused kernels, not YNNPACK fusions: 0.95x the step time for configs/small.py, 0.90x for the
  10.7M-param model. Smaller steps gained nothing from that (configs/nano.py 1.00x, the 0.8M
  model 1.005x) and compile slower without YNN, so they, tests' toy models and the init program
  keep it (A/B in one process, benchmarks/README.md). Either option given in XLA_FLAGS wins.
  """
  global _STEP_OPTIONS
  flags = os.environ.get("XLA_FLAGS", "")
  options = {}
  if "scheduler_type" not in flags:
    options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
  if (cfg is not None and "ynn_fusion_type" not in flags
      and _flops_per_device_step(cfg, 1) >= EIGEN_STEP_FLOPS):
    options["xla_cpu_experimental_ynn_fusion_type"] = ""
  _STEP_OPTIONS = options


def step_compiler_options() -> dict:
  if _STEP_OPTIONS is None:  # no config seen (tests, notebooks): what any small step gets
    use_cpu_step_options(None)
  if not _STEP_OPTIONS or jax.devices()[0].platform != "cpu":
    return {}
  return dict(_STEP_OPTIONS)


EIGEN_STEP_FLOPS = 1e11
SMALL_STEP_FLOPS = 1e11  # measured crossover on 2 cores: below it single-threaded matmuls win


def _flops_per_device_step(cfg: ml_collections.ConfigDict, n_devices: int) -> float:
  # Built directly: ModelConfig.from_config would ask which backend runs, and so start it.
  fields = {f.name for f in dataclasses.fields(arch.ModelConfig)} - {"vocab_size", "attention"}
  mc = arch.ModelConfig(vocab_size=cfg.model.vocab_size or 256, attention="xla",
                        **{f: cfg.model[f] for f in fields})
  return arch.flops_per_step(mc, cfg.train.batch_size) / n_devices


def init_cpu_lapack() -> None:
  """Sets up jaxlib's CPU LAPACK kernels without importing all of scipy.linalg (the CLI does this
  first thing, while no other thread imports).

  jaxlib takes the BLAS and LAPACK it calls from scipy's `scipy.linalg.cython_blas` and
  `cython_lapack`, and the call of every `jax.export`ed program (`aot`) sets that up. Importing
  them imports the whole `scipy.linalg` package first: 0.19 s of a 3 s restart. Under a bare
  stand-in for that package only the two modules load (0.02 s); every module added is then
  dropped again, so that a later `import scipy.linalg` is the usual one. Where anything fails,
  nothing is set up and jax does it the usual way when it needs to.
  """
  if "scipy.linalg" in sys.modules:
    return
  try:
    import scipy
    from jax._src.lib import lapack  # jax's own module: no public way to set this up alone
  except Exception:  # not there, or broken: jax imports what it needs when it needs it
    return
  package = types.ModuleType("scipy.linalg")
  package.__path__ = [str(Path(scipy.__file__).parent / "linalg")]
  sys.modules["scipy.linalg"] = package
  try:
    lapack._lapack.initialize()
  except Exception:  # it sets itself up only once it got everything: jax retries when needed
    pass
  finally:  # the stand-in and what was imported under it (none of it was there before it)
    for name in [n for n in sys.modules if n == "scipy.linalg" or n.startswith("scipy.linalg.")]:
      del sys.modules[name]


def setup(cfg: ml_collections.ConfigDict) -> str:
  enable_compile_cache()
  split_cpu(cfg)
  init_distributed(cfg.distributed)
  return check_platform()
