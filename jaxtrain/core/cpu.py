"""The CPU policy: the XLA options of CPU train steps, chosen from a step's FLOPs, dtype and
devices and from what this CPU is (`CPU_KINDS`: the choices measured on each kind of CPU met so
far; a short probe, cached, where a choice was never measured). How many XLA devices the cores
become is the process's start-up decision (system/startup.py). Measured on 2 cores:
benchmarks/results/, docs/cpu-speed.md."""

import dataclasses
import math

import jax
import ml_collections

from jaxtrain.core import model as model_lib
from jaxtrain.system import machine, measured

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


def step_flops(cfg: ml_collections.ConfigDict) -> float:
  """Training FLOPs of one micro-batch, from the config alone (vocab 256 where it is 0)."""
  mc = model_lib.ModelConfig.from_config(cfg.model, cfg.model.vocab_size or 256)
  return model_lib.flops_per_step(mc, cfg.train.batch_size)


def cpu_step_options(flops: float, xla_flags: str = "", dtype: str = "float32",
                     kind: CpuKind | None = None, devices: int = 1) -> dict:
  """XLA compile options for a CPU train or eval step of `flops` FLOPs (one micro-batch) in
  `dtype` over `devices` XLA CPU devices, on a CPU of `kind` (default: this one). An option the
  user put in XLA_FLAGS wins.

  Every step: the memory-optimizing scheduler (same results bit for bit). Several devices whose
  share of the step is under the kind's `large_step_flops`: each device's matmuls on one thread
  (devices that each spread small matmuls over every core keep waiting on each other). Steps
  from the kind's `no_ynn_flops` on: no YNNPACK fusions (matmuls through Eigen), except bfloat16
  steps where the kind's `bf16_ynn` (or `bf16_ynn_probe`) says YNNPACK runs them faster.
  """
  kind = kind or cpu_kind()
  options = {}
  if "scheduler_type" not in xla_flags:
    options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
  if devices > 1 and flops / devices < kind.large_step_flops and "multi_thread_eigen" not in xla_flags:
    options["xla_cpu_multi_thread_eigen"] = False
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
