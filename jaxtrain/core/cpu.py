"""The CPU policy: how many XLA devices a host's cores become, and the XLA options of CPU train
steps, chosen from a step's FLOPs and dtype and from what this CPU is (`CPU_KINDS`: the choices
measured on each kind of CPU met so far; a short probe, cached, where a choice was never measured).
Measured on 2 cores: benchmarks/results/, docs/cpu-speed.md."""

import collections
import dataclasses
import math
import os

import jax
import ml_collections

from jaxtrain.core import model as model_lib
from jaxtrain.system import allocator, machine, measured, runtime

# CPU steps of at least this many FLOPs compile without YNNPACK fusions (matmuls through Eigen);
# below it per device, several CPU devices each run their matmuls on one thread (Zen 3's choice).
LARGE_CPU_STEP_FLOPS = 1e11


@dataclasses.dataclass(frozen=True)
class CpuKind:
  """The choices measured on one kind of CPU (`measured`: where, in benchmarks/results/).

  `no_ynn_flops`: math.inf: never without YNNPACK's fusions. `bf16_ynn`: bfloat16 matmuls run
  faster through YNNPACK than Eigen, so bfloat16 steps keep its fusions at every size (None:
  never measured here; `bf16_ynn_probe` measures it when it matters).
  """
  name: str
  large_step_flops: float = LARGE_CPU_STEP_FLOPS
  no_ynn_flops: float = LARGE_CPU_STEP_FLOPS
  bf16_ynn: bool | None = None
  measured: str = ""


# (vendor, family, model) as /proc/cpuinfo gives them. A kind measured again gets its own row.
CPU_KINDS = {
    ("AuthenticAMD", 25, 1): CpuKind("AMD Zen 3 (EPYC Milan)",
                                     measured="2026-11-21-cpu-speed-work.md: the thresholds"),
    ("AuthenticAMD", 25, 17): CpuKind("AMD Zen 4 (EPYC Genoa)", no_ynn_flops=math.inf,
                                      bf16_ynn=True, measured="2026-11-28-cpu_policy-zen4"),
    ("GenuineIntel", 6, 207): CpuKind("Intel Xeon 5th gen (Emerald Rapids)",
                                      measured="issue 39's matmuls: nothing new decided"),
    ("AuthenticAMD", 26, 2): CpuKind("AMD Zen 5 (EPYC Turin)", no_ynn_flops=math.inf,
                                     bf16_ynn=True,
                                     measured="2026-11-27-cpu_matmul_routes, -cpu_policy"),
}


def cpu_kind(cpuinfo: str | None = None) -> CpuKind:
  """This CPU's row of CPU_KINDS (or that of the /proc/cpuinfo text `cpuinfo`); an unknown CPU
  gets the defaults (Zen 3's measurements)."""
  vendor, family, model, name = machine.cpu_id(cpuinfo)
  return CPU_KINDS.get((vendor, family, model)) or \
      CpuKind(f"unknown CPU ({name or vendor or 'no /proc/cpuinfo'}, family {family} model {model})")


def cpu_device_count(cfg: ml_collections.ConfigDict, cores: int | None = None) -> int:
  """How many XLA devices to split this host's CPU cores into (`mesh.cpu_devices`, 0: auto).

  One XLA CPU device keeps about one core busy outside its large matmuls; several devices run
  side by side (data parallel). A count the config asks for (`mesh.cpu_devices`, or `mesh.data`
  x `mesh.fsdp` where neither is -1) is kept. Auto: the most devices, up to the core count, that
  split this process's share of the batch evenly (and a set `mesh.data` or `mesh.fsdp` too).
  """
  if cfg.mesh.cpu_devices:
    return cfg.mesh.cpu_devices
  processes = runtime.planned_processes(cfg.distributed)
  data, fsdp = cfg.mesh.data, cfg.mesh.fsdp
  if data > 0 and fsdp > 0:  # the whole mesh is given: that many devices over the processes
    return max(data * fsdp // processes, 1)
  multiple = max(data, fsdp, 1)  # the axis that is set; the other (-1) takes the devices left
  cores = cores or machine.cores()
  rows = cfg.train.batch_size // processes
  fitting = [d for d in range(multiple, min(cores, rows) + 1, multiple) if rows % d == 0]
  return max(fitting, default=multiple)


def split_note(cfg: ml_collections.ConfigDict, cores: int | None = None) -> str | None:
  """The line that says the automatic split leaves cores out because the batch does not split
  over them (None where it uses them all, or where the count was asked for)."""
  cores = cores or machine.cores()
  processes = runtime.planned_processes(cfg.distributed)
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


CHOSEN: set[int] = set()  # the CPU device counts this process's runs set (jaxtrain's, not the user's)


def split_cpu(cfg: ml_collections.ConfigDict) -> str | None:
  """On CPU, splits the cores into `cpu_device_count` XLA devices; small steps also get
  single-threaded matmuls. Never over the user's own --jax_num_cpu_devices or XLA_FLAGS; where
  jax started already, the run takes that many of the devices jaxtrain made (`run_devices`).
  Returns `split_note`'s line where it split the cores, or the line that says the CPU could not
  be split as the command line splits it (jax started before jaxtrain was imported)."""
  if jax.config.jax_num_cpu_devices not in {-1, allocator.early_split(), *CHOSEN} or \
      runtime.planned_platform() != "cpu":
    return None
  n = cpu_device_count(cfg)
  if n in CHOSEN and jax.config.jax_num_cpu_devices == n:  # split so by an earlier run here
    return split_note(cfg)
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:  # the backend already started (a notebook, a test): it stays as it is
    have = jax.local_device_count()
    if have >= n or "device_count" in os.environ.get("XLA_FLAGS", ""):
      return split_note(cfg) if have >= n else None
    return (f"note: jax started before jaxtrain could split the CPU: {have} XLA CPU device"
            f"{'s' * (have > 1)} where `python -m jaxtrain` makes {n} ({machine.cores()}"
            " cores here, data parallel); `import jaxtrain` before anything uses jax (restart the "
            "kernel or script) to train on them")
  CHOSEN.add(n)
  flags = os.environ.get("XLA_FLAGS", "")
  large = cpu_kind().large_step_flops
  if n > 1 and step_flops(cfg) / n < large and "multi_thread_eigen" not in flags:
    # Small steps: each device's matmuls on one thread. Devices that each spread small
    # matmuls over every core keep waiting on each other.
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
  return split_note(cfg)


def run_devices(cfg: ml_collections.ConfigDict) -> list:
  """The devices a run of `cfg` trains on: all of them, but of a CPU that jaxtrain split before
  this run's own split could (`import jaxtrain`, an earlier run), each process's
  `cpu_device_count` first (of a multi-process run, `jax.devices()` lists every process's)."""
  devices = jax.devices()
  if devices[0].platform != "cpu" or \
      jax.config.jax_num_cpu_devices not in {allocator.early_split(), *CHOSEN}:
    return devices
  n, taken = cpu_device_count(cfg), collections.Counter()
  kept = []
  for device in devices:
    if taken[device.process_index] < n:
      taken[device.process_index] += 1
      kept.append(device)
  return kept


def cpu_step_options(flops: float, xla_flags: str = "", dtype: str = "float32",
                     kind: CpuKind | None = None) -> dict:
  """XLA compile options for a CPU train or eval step of `flops` FLOPs (one micro-batch) in
  `dtype`, on a CPU of `kind` (default: this one). An option the user put in XLA_FLAGS wins.

  Every step: the memory-optimizing scheduler (same results bit for bit). Steps from the kind's
  `no_ynn_flops` on: no YNNPACK fusions (matmuls through Eigen), except bfloat16 steps where the
  kind's `bf16_ynn` (or `bf16_ynn_probe`) says YNNPACK runs them faster.
  """
  kind = kind or cpu_kind()
  options = {}
  if "scheduler_type" not in xla_flags:
    options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
  if flops >= kind.no_ynn_flops and "ynn_fusion_type" not in xla_flags:
    keep_ynn = dtype == "bfloat16" and (kind.bf16_ynn if kind.bf16_ynn is not None
                                        else bf16_ynn_probe())
    if not keep_ynn:
      options["xla_cpu_experimental_ynn_fusion_type"] = ""
  return options


def bf16_ynn_probe(n: int = 1024, repeats: int = 3) -> bool:
  """Whether an n^3 bfloat16 matmul (float32 accumulation) runs faster with YNNPACK's fusions
  than through Eigen on this CPU: ~1 s the first time on a CPU model and jax version, then read
  from the cache (system/measured.py)."""

  def probe(_) -> bool:
    a = jax.numpy.ones((n, n), jax.numpy.bfloat16)
    product = jax.jit(lambda x: jax.numpy.matmul(x, x, preferred_element_type=jax.numpy.float32))
    seconds = {}
    for name, options in (("ynn", {}), ("eigen", {"xla_cpu_experimental_ynn_fusion_type": ""})):
      compiled = product.lower(a).compile(compiler_options=options)
      seconds[name] = machine.seconds(lambda c=compiled: c(a).block_until_ready(), repeats)
    return seconds["ynn"] < seconds["eigen"]

  return bool(measured.measured("bf16_ynn", [n], probe).value)
