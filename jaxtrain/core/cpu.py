"""The CPU policy: how many XLA devices a host's cores become, and the XLA options of CPU train
steps, both chosen from a step's FLOPs. Measured on 2 cores: benchmarks/results/."""

import os

import jax
import ml_collections

from jaxtrain.core import model as model_lib
from jaxtrain.system import allocator

# CPU steps of at least this many FLOPs compile without YNNPACK fusions (matmuls through Eigen);
# below it per device, several CPU devices each run their matmuls on one thread.
LARGE_CPU_STEP_FLOPS = 1e11


def cpu_device_count(cfg: ml_collections.ConfigDict, cores: int | None = None) -> int:
  """How many XLA devices to split this host's CPU cores into (`mesh.cpu_devices`, 0: auto).

  One XLA CPU device runs its large matmuls on every core, but its many small matmuls and
  elementwise ops keep about one core busy; several devices' programs run side by side (data
  parallel). A count the config asks for is kept, and a batch that does not split over it is a
  config error (mesh.check_devices): `mesh.cpu_devices`, or `mesh.data` x `mesh.fsdp` where
  neither is -1. Auto: the most devices, up to the core count, that split this process's share
  of the batch evenly (and a set `mesh.data` or `mesh.fsdp` too); `split_note` says when that
  leaves cores out.
  """
  if cfg.mesh.cpu_devices:
    return cfg.mesh.cpu_devices
  processes = max(cfg.distributed.num_processes, 1)
  data, fsdp = cfg.mesh.data, cfg.mesh.fsdp
  if data > 0 and fsdp > 0:  # the whole mesh is given: that many devices over the processes
    return max(data * fsdp // processes, 1)
  multiple = max(data, fsdp, 1)  # the axis that is set; the other (-1) takes the devices left
  cores = cores or len(os.sched_getaffinity(0))
  rows = cfg.train.batch_size // processes
  fitting = [d for d in range(multiple, min(cores, rows) + 1, multiple) if rows % d == 0]
  return max(fitting, default=multiple)


def split_note(cfg: ml_collections.ConfigDict, cores: int | None = None) -> str | None:
  """The line that says the automatic split leaves cores out because the batch does not split
  over them (None where it uses them all, or where the count was asked for)."""
  cores = cores or len(os.sched_getaffinity(0))
  processes = max(cfg.distributed.num_processes, 1)
  rows = cfg.train.batch_size // processes
  n = cpu_device_count(cfg, cores)
  if cfg.mesh.cpu_devices or max(cfg.mesh.data, cfg.mesh.fsdp) > 1 or n >= min(cores, rows):
    return None  # asked for, or a set mesh axis that the count must be a multiple of
  b = cfg.train.batch_size
  whole = cores * processes  # a batch that splits over every core of every process
  sizes = sorted({x for x in (b - b % whole, b - b % whole + whole) if x > 0})
  return (f"note: train.batch_size={b} does not split over the {cores} CPU cores"
          f"{' of each process' if processes > 1 else ''}: training on {n} device"
          f"{'s' if n > 1 else ''} (mesh.cpu_devices=0, auto, takes the most that split the batch); "
          f"--config.train.batch_size={' or '.join(map(str, sizes))} uses every core")


def step_flops(cfg: ml_collections.ConfigDict) -> float:
  """Training FLOPs of one micro-batch, from the config alone (vocab 256 where it is 0)."""
  mc = model_lib.ModelConfig.from_config(cfg.model, cfg.model.vocab_size or 256)
  return model_lib.flops_per_step(mc, cfg.train.batch_size)


def split_cpu(cfg: ml_collections.ConfigDict) -> str | None:
  """On CPU, splits the cores into `cpu_device_count` XLA devices; small steps also get
  single-threaded matmuls. Only before JAX starts its backends, and never over the user's own
  --jax_num_cpu_devices or XLA_FLAGS. Returns `split_note`'s line where it split the cores."""
  platform = (jax.config.jax_platforms or "").split(",")[0]
  if jax.config.jax_num_cpu_devices != -1:
    return None
  if platform != "cpu" and (platform or allocator.cuda_installed()):
    return None
  n = cpu_device_count(cfg)
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:  # the backend already started (a notebook, a test): it stays as it is
    return None
  flags = os.environ.get("XLA_FLAGS", "")
  if n > 1 and step_flops(cfg) / n < LARGE_CPU_STEP_FLOPS and "multi_thread_eigen" not in flags:
    # Small steps: each device's matmuls on one thread. Devices that each spread small
    # matmuls over every core keep waiting on each other.
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
  return split_note(cfg)


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
