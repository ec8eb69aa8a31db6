"""jaxtrain's train step on one JAX platform, in a worker process of its own, and the parent's
measurement of one row with it: compile, warm-up, timed steps, memory. cpu_vs_gpu.py and
scaling.py build their rows from these.

The worker builds its steps as `python -m jaxtrain` does (`jaxtrain.core.programs.build`; on the
CPU, the cores split into XLA devices by `jaxtrain.system.startup.settle`) and trains on random int32
tokens [B, T+1]: no corpus is read.
"""

import os
import resource
import time
from pathlib import Path

import common
import reports
from reports import log

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
N_BATCHES = 4  # distinct random batches, cycled


def _rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load(config_path: str, overrides: dict):
  """The row's config: one micro-batch per step (grad_accum 1), `overrides` on top."""
  from jaxtrain.config import loading

  return loading.load_config(config_path, **{"train.grad_accum": 1, **overrides})


class StepWorker:
  """jaxtrain's train step on one platform, built by `jaxtrain.core.programs.build` as `python -m
  jaxtrain` builds it, in a worker process of its own.

  Given a config, the process sets up its CPU by jaxtrain's rule for that config
  (`startup.settle`: how many XLA devices). That has
  to happen before jax starts its backend, hence here, first thing in a fresh process.
  """

  def __init__(self, platform: str, compile_cache: bool = False, config_path: str | None = None,
               overrides: dict | None = None):
    os.environ["JAX_PLATFORMS"] = platform
    import jax

    from jaxtrain.system import runtime, startup

    if config_path:
      startup.settle(load(config_path, overrides or {}), by="benchmarks/step_worker.py")
    if compile_cache:
      runtime.enable_compile_cache()
    else:  # a cache hit would time reading a file, not compiling
      jax.config.update("jax_enable_compilation_cache", False)
    runtime.check_platform(startup.cuda_installed())  # a platform that cannot start fails here
    self.devices = startup.devices()

  def device_info(self, dtypes: list[str]) -> dict:
    import jax

    from jaxtrain.measure import estimate

    d = self.devices[0]
    try:
      from jax.extend import backend as jax_backend

      backend = jax_backend.get_backend().platform_version
    except Exception:  # only informative; it moves between jax versions
      backend = None
    published = {dt: (estimate.published_peak(d.device_kind, dt) if d.platform != "cpu" else None)
                 for dt in dtypes}
    return {"platform": d.platform, "device_kind": d.device_kind, "device_count": len(self.devices),
            "jax": jax.__version__, "backend_version": backend, "pid": os.getpid(),
            "published_peak_flops": published}

  def peak(self, dtype: str, n: int, repeats: int) -> dict:
    return common.measure_matmul_peak(dtype, n, repeats)

  def setup(self, config_path: str, overrides: dict, n_devices: int = 0) -> dict:
    """The row's programs on `n_devices` (0: every CPU device, as a run; one GPU), its state and
    batches, and the train step compiled."""
    import numpy as np

    from jaxtrain.config import loading, validate
    from jaxtrain.core import model as model_lib
    from jaxtrain.core import programs
    from jaxtrain.measure import estimate

    self.state = self.batches = self.step_fn = None  # a previous setup's buffers go first
    cfg = load(config_path, overrides)  # its data is never read: the steps see random tokens
    validate.validate(cfg)
    on_cpu = self.devices[0].platform == "cpu"
    devices = self.devices[:n_devices or (len(self.devices) if on_cpu else 1)]
    p = programs.build(cfg, cfg.model.vocab_size or 256, devices)
    mc, fsdp = p.model_cfg, p.mesh.shape["fsdp"]
    B, T = p.batch_shape[0], mc.seq_len
    mem = estimate.memory_estimate(mc, B, 1, len(devices), fsdp)
    have, what = estimate.available_memory(devices[0])
    info = {"batch_size": B, "seq_len": T, "dtype": mc.dtype, "attention": mc.attention,
            "vocab_size": mc.vocab_size, "param_count": model_lib.param_count(mc),
            "flops_per_token": model_lib.flops_per_token(mc), "n_devices": len(devices),
            "mesh": {"data": p.mesh.shape["data"], "fsdp": fsdp},
            "compiler_options": p.compiler_options, "one_allreduce": p.one_allreduce,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "config_grad_accum": loading.load_config(config_path).train.grad_accum,
            "estimate_bytes": mem.total, "estimate": vars(mem), "available_bytes": have,
            "available_what": what}
    _, too_big = estimate.memory_report(mc, B, 1, devices, fsdp)
    if too_big:
      return dict(info, skipped=f"jaxtrain.measure.estimate: {too_big}")
    self.programs = p
    self.rss_before = _rss_bytes()
    state = p.init()
    rng = np.random.default_rng(SEED)
    self.batches = [p.place({"tokens": rng.integers(0, mc.vocab_size, p.batch_shape,
                                                    dtype=np.int32)}) for _ in range(N_BATCHES)]
    # p.compile_train(), its two stages timed apart
    t0 = time.perf_counter()
    lowered = p.train_step.lower(p.abstract, p.batch_spec())
    t1 = time.perf_counter()
    self.step_fn = lowered.compile()
    t2 = time.perf_counter()
    self.rss_peak_compile = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    self.state, self.i = state, 0
    plan = self.step_fn.memory_analysis()
    # What XLA keeps live for the step: inputs (the donated state is reused as output) + scratch.
    xla_plan = plan.argument_size_in_bytes + plan.temp_size_in_bytes if plan else None
    return dict(info, lower_s=t1 - t0, compile_s=t2 - t1, xla_plan_bytes=xla_plan)

  def run(self, n: int) -> dict:
    import jax

    times, loss = [], None
    for _ in range(n):
      batch = self.batches[self.i % len(self.batches)]
      self.i += 1
      t0 = time.perf_counter()
      self.state, metrics = self.step_fn(self.state, batch)
      jax.block_until_ready((self.state, metrics))
      times.append(time.perf_counter() - t0)
      loss = float(metrics["loss"])
    return {"times_s": times, "loss": loss}

  def memory(self) -> dict:
    on_cpu = self.devices[0].platform == "cpu"
    devices = self.programs.mesh.devices.flat
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devices]
    return {"host_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "host_before_bytes": self.rss_before,
            "host_peak_after_compile_bytes": self.rss_peak_compile,
            "device_peak_bytes": None if on_cpu or None in peaks else max(peaks),
            "device_peak_source": ("null on CPU: device memory is host RAM, see the host columns"
                                   if on_cpu else "max over the mesh's devices of "
                                   "memory_stats()['peak_bytes_in_use']")}


# ---- parent side ---------------------------------------------------------------------------

def reason(e: Exception) -> str:
  """The last line of a worker's traceback: the exception and its message."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  if not lines:
    return type(e).__name__
  last = lines[-1]
  if last.startswith("jaxtrain.system.errors."):  # jaxtrain's own errors already say what to do
    last = last.split(": ", 1)[-1]
  return last[:400]


def config_path(name: str) -> str:
  path = Path(name) if name.endswith(".py") else ROOT / "configs" / f"{name}.py"
  return str(path)


def config_name(name: str) -> str:
  return Path(name).stem if name.endswith(".py") else name


def platform_kind(platform: str) -> str:
  return "cpu" if platform == "cpu" else "gpu"


def programs_line(info: dict) -> str:
  """What `programs.build` chose for a row: XLA options, one all-reduce, threading."""
  return (f"XLA options {info['compiler_options'] or 'none'}"
          + ("; gradients all-reduced as one buffer" if info["one_allreduce"] else "")
          + ("; single-threaded matmuls" if info["compiler_options"].get("xla_cpu_multi_thread_eigen")
             is False else ""))


def measure(worker: common.Worker, setup: dict, steps: int, warmup: int,
            sampler: common.LoadSampler, label: str) -> dict:
  """setup (compile), warm-up, timed steps and memory in `worker`: one result row."""
  sampler.label = f"{label}/compile"
  info = worker.call("setup", **setup)
  B, T = info["batch_size"], info["seq_len"]
  log(f"  {info['param_count']:,} params, {info['flops_per_token'] / 1e6:.2f} MFLOP/token, "
      f"{info['dtype']}, micro-batch {B} x {T}, {info['n_devices']} device(s): mesh "
      f"data={info['mesh']['data']} fsdp={info['mesh']['fsdp']}; {programs_line(info)}; "
      f"memory estimate {reports.fmt_bytes(info['estimate_bytes'])} "
      f"per device ({reports.fmt_bytes(info['available_bytes'])} {info['available_what']})")
  if "skipped" in info:
    why = info.pop("skipped")
    log(f"  skipped: {why}")
    return dict(info, status="skipped", reason=why)
  log(f"  compiled in {info['lower_s'] + info['compile_s']:.1f} s (trace+lower "
      f"{info['lower_s']:.1f} s, compile {info['compile_s']:.1f} s)")
  sampler.label = f"{label}/warmup"
  t0 = time.perf_counter()
  worker.call("run", n=warmup)
  warmup_s = time.perf_counter() - t0
  if warmup:
    log(f"  warm-up {warmup} step(s): {warmup_s:.1f} s")
  # Slow steps get a progress line each; fast ones run in one call.
  chunk = 1 if warmup and warmup_s / warmup > 1.0 else steps
  sampler.label = f"{label}/timed"
  before = common.cpu_snapshot(sampler.pids())
  times, loss = [], None
  while len(times) < steps:
    res = worker.call("run", n=min(chunk, steps - len(times)))
    times += res["times_s"]
    loss = res["loss"]
    if chunk == 1:
      log(f"  step {len(times)}/{steps}: {times[-1]:.2f} s")
  cpu = common.cpu_share(before, common.cpu_snapshot(sampler.pids()))
  sampler.label = f"{label}/memory"
  memory = worker.call("memory")
  stats = common.summarize(times)
  tokens_per_s = B * T / stats["median_s"]
  log(f"  {steps} steps: median {stats['median_s'] * 1e3:,.1f} ms/step, {tokens_per_s:,.0f} "
      f"tokens/s, last loss {loss:.4f}; other processes {reports.others(cpu)} of the machine; host peak "
      f"RSS {reports.fmt_bytes(memory['host_peak_bytes'])}, device peak "
      f"{reports.fmt_bytes(memory['device_peak_bytes'])}")
  memory["host_added_bytes"] = memory["host_peak_bytes"] - memory["host_before_bytes"]
  return dict(info, status="ok", warmup_s=warmup_s, step_times_s=times, stats=stats,
              tokens_per_s=tokens_per_s, loss=loss, cpu=cpu,
              other_pct=cpu["other_pct"] if cpu else None, memory=memory)
