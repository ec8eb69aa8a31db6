"""Training speed of the same configs on every JAX platform here: the CPU, and a GPU if any.

  python benchmarks/cpu_vs_gpu.py                        # nano, small (and gpt2_124m on a GPU)
  python benchmarks/cpu_vs_gpu.py --configs=nano --platforms=cpu --steps=20

Every (platform, config) row runs in a fresh worker process with JAX_PLATFORMS set to that
platform, so its peak host memory (ru_maxrss) and peak device memory are its own. A row builds
its steps as `python -m jaxtrain` does (`jaxtrain.core.programs.build`; on the CPU, the cores split
into XLA devices by `jaxtrain.system.cpu.split_cpu`; on a GPU, one device), then times: the trace +
lower + compile of the train step (the persistent compile cache off unless --compile-cache),
warm-up steps, then the median of the timed steps. Batches are random int32 tokens [B, T+1]:
no corpus is read. grad_accum is forced to 1, so one step is one micro-batch of the config's
batch_size x seq_len (--batch-size overrides B). Each platform's f32 and bf16 matmul peaks are
measured in the same run (`jaxtrain.loop.estimate.time_matmul`); MFU is against the measured peak of
the config's dtype and, for a GPU that jaxtrain.loop.estimate knows, against its datasheet peak.
Writes cpu_vs_gpu.{json,md,png} to --out (default: benchmarks/results/<date>-cpu_vs_gpu/).

Default steps: 1 warm-up + 5 timed on a CPU, 3 + 20 on a GPU. The default run on a 2-core CPU
without a GPU takes about 3 to 6 minutes, nearly all of it `small` (64 x 256 tokens per step,
20 to 50 s per step on 2 shared cores, ~6.5 GiB of RAM); a GPU adds a minute or two.
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# jaxtrain from the checkout (installed or not), and this directory's modules however we start.
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)

from jaxtrain.system.allocator import cuda_installed  # noqa: E402

NAME = "cpu_vs_gpu"
SEED = 0
N_BATCHES = 4  # distinct random batches, cycled
DEFAULT_CONFIGS = ("nano", "small")
GPU_CONFIGS = ("gpt2_124m",)  # GPU-sized: in the default run on GPU platforms only
DEFAULTS = {
    "cpu": {"steps": 5, "warmup": 1, "peak_size": 2048, "peak_repeats": 5},
    "gpu": {"steps": 20, "warmup": 3, "peak_size": 8192, "peak_repeats": 10},
}
PEAK_DTYPES = ("float32", "bfloat16")
NO_GPU = "no GPU platform available on this machine"


def _rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load(config_path: str, overrides: dict):
  """The row's config: one micro-batch per step (grad_accum 1), `overrides` on top."""
  from jaxtrain.config import defaults as config

  return config.load_config(config_path, **{"train.grad_accum": 1, **overrides})


class StepWorker:
  """jaxtrain's train step on one platform, built by `jaxtrain.core.programs.build` as `python -m
  jaxtrain` builds it, in a worker process of its own.

  Given a config, the process sets up its CPU by jaxtrain's rule for that config
  (`cpu.split_cpu`: how many XLA devices, single-threaded matmuls for small steps). That has
  to happen before jax starts its backend, hence here, first thing in a fresh process.
  """

  def __init__(self, platform: str, compile_cache: bool = False, config_path: str | None = None,
               overrides: dict | None = None):
    os.environ["JAX_PLATFORMS"] = platform
    import jax

    from jaxtrain.core import cpu
    from jaxtrain.system import runtime

    if config_path:
      cpu.split_cpu(load(config_path, overrides or {}))
    if compile_cache:
      runtime.enable_compile_cache()
    else:  # a cache hit would time reading a file, not compiling
      jax.config.update("jax_enable_compilation_cache", False)
    runtime.check_platform()  # a platform that cannot start fails here, with a one-line reason
    self.devices = jax.devices()

  def device_info(self, dtypes: list[str]) -> dict:
    import jax

    from jaxtrain.loop import estimate

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

    from jaxtrain.config import defaults as config
    from jaxtrain.config import validate as validation
    from jaxtrain.core import model as model_lib
    from jaxtrain.core import programs
    from jaxtrain.loop import estimate

    self.state = self.batches = self.step_fn = None  # a previous setup's buffers go first
    cfg = load(config_path, overrides)  # its data is never read: the steps see random tokens
    validation.validate(cfg)
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
            "config_grad_accum": config.load_config(config_path).train.grad_accum,
            "estimate_bytes": mem.total, "estimate": vars(mem), "available_bytes": have,
            "available_what": what}
    _, too_big = estimate.memory_report(mc, B, 1, devices, fsdp)
    if too_big:
      return dict(info, skipped=f"jaxtrain.loop.estimate: {too_big}")
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

def log(msg: str) -> None:
  print(msg, flush=True)


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
          + ("; single-threaded matmuls" if "multi_thread_eigen=false" in info["xla_flags"]
             else ""))


def _fmt_gflops(gflops: float) -> str:
  return f"{gflops / 1e3:,.1f} TFLOP/s" if gflops >= 1e3 else f"{gflops:,.1f} GFLOP/s"


def _pct(cpu: dict | None) -> str:
  return "n/a (too short to see)" if cpu is None else f"{cpu['other_pct']:.0f}%"


def measure(worker: common.Worker, setup: dict, steps: int, warmup: int,
            sampler: common.LoadSampler, label: str) -> dict:
  """setup (compile), warm-up, timed steps and memory in `worker`: one result row."""
  sampler.label = f"{label}/compile"
  info = worker.call("setup", **setup)
  B, T = info["batch_size"], info["seq_len"]
  log(f"  {info['param_count']:,} params, {info['flops_per_token'] / 1e6:.2f} MFLOP/token, "
      f"{info['dtype']}, micro-batch {B} x {T}, {info['n_devices']} device(s): mesh "
      f"data={info['mesh']['data']} fsdp={info['mesh']['fsdp']}; {programs_line(info)}; "
      f"memory estimate {common.fmt_bytes(info['estimate_bytes'])} "
      f"per device ({common.fmt_bytes(info['available_bytes'])} {info['available_what']})")
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
      f"tokens/s, last loss {loss:.4f}; other processes {_pct(cpu)} of the machine; host peak "
      f"RSS {common.fmt_bytes(memory['host_peak_bytes'])}, device peak "
      f"{common.fmt_bytes(memory['device_peak_bytes'])}")
  memory["host_added_bytes"] = memory["host_peak_bytes"] - memory["host_before_bytes"]
  return dict(info, status="ok", warmup_s=warmup_s, step_times_s=times, stats=stats,
              tokens_per_s=tokens_per_s, loss=loss, cpu=cpu,
              other_pct=cpu["other_pct"] if cpu else None, memory=memory)


def probe(platform: str, args, dtypes: list[str], machine: dict, sampler: common.LoadSampler,
          active: list) -> dict:
  """Starts `platform` in a worker: can it start, what device is it, its matmul peaks."""
  sampler.label = f"{platform}/probe"
  log(f"\n== platform {platform}")
  try:
    worker = common.Worker(f"{platform}-probe", StepWorker, platform)
  except common.WorkerError as e:
    log(f"  not available: {reason(e)}")
    return {"available": False, "reason": reason(e)}
  active.append(worker)
  try:
    info = worker.call("device_info", dtypes=dtypes)
    kind = platform_kind(info["platform"])
    info["device_name"] = machine["cpu_model"] if kind == "cpu" else info["device_kind"]
    log(f"  {info['device_count']} x {info['device_kind']} ({info['platform']}), jax {info['jax']}")
    n = args.peak_size or DEFAULTS[kind]["peak_size"]
    repeats = args.peak_repeats or DEFAULTS[kind]["peak_repeats"]
    peaks = {}
    for dtype in dtypes:
      if kind == "cpu" and dtype == "float16":
        continue  # jaxtrain refuses float16 on CPU
      sampler.label = f"{platform}/peak-{dtype}"
      before = common.cpu_snapshot(sampler.pids())
      run = worker.call("peak", dtype=dtype, n=n, repeats=repeats)
      run["cpu"] = common.cpu_share(before, common.cpu_snapshot(sampler.pids()))
      peaks[dtype] = run
      published = info["published_peak_flops"].get(dtype)
      log(f"  {dtype} matmul {n}^3: {_fmt_gflops(run['gflops'])} (median of {repeats})"
          + (f"; datasheet {published / 1e12:,.1f} TFLOP/s" if published else "")
          + f"; other processes {_pct(run['cpu'])} of the machine")
  finally:
    worker.close()
    active.remove(worker)
  return dict(info, available=True, kind=kind, matmul_peak=peaks)


def bench_row(platform: str, pinfo: dict, name: str, steps: int, warmup: int, args,
              sampler: common.LoadSampler, active: list) -> dict:
  log(f"\n== {config_name(name)} on {platform} ({pinfo['device_name']})")
  overrides = {"train.batch_size": args.batch_size} if args.batch_size else {}
  if args.cpu_devices:
    overrides["mesh.cpu_devices"] = args.cpu_devices
  row = {"platform": platform, "device": pinfo["device_name"], "config": config_name(name),
         "steps": steps, "warmup": warmup}
  worker = None
  try:
    worker = common.Worker(f"{platform}-{row['config']}", StepWorker, platform,
                           args.compile_cache, config_path(name), overrides)
    active.append(worker)
    row.update(measure(worker, {"config_path": config_path(name), "overrides": overrides},
                       steps, warmup, sampler, f"{platform}/{row['config']}"))
  except common.WorkerError as e:
    log(f"  failed: {reason(e)}")
    row.update(status="failed", reason=reason(e))
  finally:
    if worker is not None:
      worker.close()
      active.remove(worker)
  if row["status"] == "ok":
    dtype = row["dtype"]
    measured = pinfo["matmul_peak"].get(dtype, {}).get("gflops")
    published = pinfo["published_peak_flops"].get(dtype)
    flops = row["flops_per_token"] * row["tokens_per_s"]
    row.update(achieved_flops=flops, peak_measured_flops=measured * 1e9 if measured else None,
               peak_published_flops=published,
               mfu_measured=flops / (measured * 1e9) if measured else None,
               mfu_published=flops / published if published else None)
  return row


def speedups(results: list[dict]) -> list[dict]:
  ok = {(r["config"], r["platform"]): r for r in results if r["status"] == "ok"}
  out = []
  for (name, platform), r in ok.items():
    cpu = ok.get((name, "cpu"))
    if platform != "cpu" and cpu:
      out.append({"config": name, "platform": platform, "over": "cpu",
                  "tokens_per_s_speedup": r["tokens_per_s"] / cpu["tokens_per_s"],
                  "compile_time_ratio": ((r["lower_s"] + r["compile_s"])
                                         / (cpu["lower_s"] + cpu["compile_s"]))})
  return out


def _pct_or(x: float | None) -> str:
  return "n/a" if x is None else f"{100 * x:.1f}"


def speed_table(results: list[dict]) -> str:
  rows = []
  for r in results:
    head = [r["config"], r["platform"], r["device"]]
    if r["status"] != "ok":
      rows.append(head + [r.get("dtype", "-"), "-", "-", "-", "-", "-", "-", "-",
                          f"{r['status']}: {r['reason']}"])
      continue
    s = r["stats"]
    rows.append(head + [
        r["dtype"], f"{r['batch_size']} x {r['seq_len']}",
        f"{r['lower_s'] + r['compile_s']:.1f}",
        f"{s['median_s'] * 1e3:,.1f} ({s['p10_s'] * 1e3:,.1f}-{s['p90_s'] * 1e3:,.1f})",
        f"{r['tokens_per_s']:,.0f}", _pct_or(r["mfu_measured"]),
        _pct_or(r["mfu_published"]) if r["mfu_published"] else "n/a (no datasheet peak)",
        "?" if r["other_pct"] is None else f"{r['other_pct']:.0f}", "ok"])
  return common.markdown_table(
      ["config", "platform", "device", "dtype", "micro-batch B x T", "compile s",
       "median step ms (p10-p90)", "tokens/s", "MFU % (measured peak)", "MFU % (datasheet)",
       "others' CPU %", "status"], rows)


def memory_table(results: list[dict]) -> str:
  rows = []
  for r in results:
    if r["status"] != "ok":
      continue
    m, b = r["memory"], common.fmt_bytes
    host = f"{b(m['host_peak_bytes'])} ({b(m['host_peak_after_compile_bytes'])})"
    device = "null (CPU)" if m["device_peak_bytes"] is None else b(m["device_peak_bytes"])
    rows.append([r["config"], r["platform"], f"{r['param_count']:,}", host,
                 b(m["host_added_bytes"]), device, b(r["estimate_bytes"]),
                 b(r["xla_plan_bytes"])])
  return common.markdown_table(
      ["config", "platform", "params", "host peak RSS (by the end of compiling)",
       "host RSS added by the row", "device peak", "jaxtrain estimate", "XLA buffer plan"], rows)


def speedup_table(ups: list[dict]) -> str:
  return common.markdown_table(
      ["config", "platform", "tokens/s over CPU", "compile time over CPU"],
      [[u["config"], u["platform"], f"{u['tokens_per_s_speedup']:,.1f}x",
        f"{u['compile_time_ratio']:.2f}x"] for u in ups])


def markdown(report: dict) -> str:
  m = report["machine"]
  lines = [
      f"# Training step: CPU vs GPU ({report['timestamp']})", "",
      f"- {common.cpu_line(m)}",
      f"- GPU: {report['gpu']['name'] or report['gpu']['note']}",
      f"- software: python {m['python']}, "
      + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v and k != "torch"),
      "- data: random int32 tokens [B, T+1], uniform over the vocabulary (no corpus is read); "
      "grad_accum forced to 1, so a step is one micro-batch of B x T tokens",
      "- compile: trace + lower + compile of the train step `jaxtrain.core.programs.build` makes, as "
      "`python -m jaxtrain` runs it; persistent compile cache "
      + ("ON (times may be cache hits)" if report["args"]["compile_cache"] else "off"),
  ]
  for platform, p in report["platforms"].items():
    if not p["available"]:
      lines.append(f"- {platform}: not available ({p['reason']})")
      continue
    peaks = ", ".join(f"{dt} {_fmt_gflops(v['gflops'])}" for dt, v in p["matmul_peak"].items())
    published = ", ".join(f"{dt} {v / 1e12:,.1f} TFLOP/s" for dt, v in
                          p["published_peak_flops"].items() if v)
    lines.append(f"- {platform}: {p['device_count']} x {p['device_name']}; measured matmul peak "
                 f"({peaks})"
                 + (f"; datasheet {published}" if published else "; no datasheet peak"))
  if not report["results"]:
    lines += [f"- load: {common.load_line(report['load'])}", "", "No row ran."]
    return "\n".join(lines) + "\n"
  lines += [f"- load: {common.load_line(report['load'])}", "", "## Speed", "",
            speed_table(report["results"]), "",
            "tokens/s: B x T over the median step. MFU: flops_per_token (6N + 12*L*T*D) x "
            "tokens/s over the matmul peak of the row's dtype, measured in this run on that "
            "platform, or the vendor's dense datasheet peak (GPUs jaxtrain.loop.estimate knows). "
            "others' CPU: share of the whole machine other processes used during that row's timed "
            "steps (with 2 cores, 50 = one core busy elsewhere): a high value means a noisy "
            "measurement.", ""]
  lines += [f"- {r['config']} on {r['platform']}: {r['n_devices']} device(s), mesh data "
            f"{r['mesh']['data']} x fsdp {r['mesh']['fsdp']}; {programs_line(r)}"
            for r in report["results"] if r["status"] == "ok"]
  lines += ["", "## Memory (per device)", "", memory_table(report["results"]), "",
            "host peak RSS: ru_maxrss of the row's own worker process (includes jax itself), at "
            "the end and, in brackets, right after compiling (XLA's compiler can set the peak "
            "for small models); added by the row: the end peak minus the RSS just before the "
            "state was built (state, batches, compiler, step buffers). device "
            "peak: memory_stats()['peak_bytes_in_use'] on a GPU; null on CPU, where device memory "
            "is host RAM. jaxtrain estimate: jaxtrain.loop.estimate.memory_estimate; XLA buffer plan: "
            "arguments + temporaries of the compiled step.", ""]
  if report["speedups"]:
    lines += ["## GPU over CPU", "", speedup_table(report["speedups"]), ""]
  elif report["gpu"]["name"] is None:
    lines += [f"No GPU over CPU speedup: {report['gpu']['note']}.", ""]
  for note in report["notes"]:
    lines.append(f"Note: {note}")
  return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--configs", default=None,
                 help="comma list of config names (configs/<name>.py) or paths; default: "
                      f"{','.join(DEFAULT_CONFIGS)} on every platform, plus "
                      f"{','.join(GPU_CONFIGS)} on GPUs")
  p.add_argument("--platforms", default="auto",
                 help="comma list of JAX platforms, each in its own processes (cpu, cuda, gpu); "
                      "auto: cpu, and cuda if a CUDA jax plugin is installed")
  p.add_argument("--steps", type=int, default=None, help="timed steps (default: 5 CPU, 20 GPU)")
  p.add_argument("--warmup", type=int, default=None,
                 help="untimed steps after compiling (default: 1 CPU, 3 GPU)")
  p.add_argument("--batch-size", type=int, default=None,
                 help="micro-batch size B for every config (default: each config's)")
  p.add_argument("--peak-size", type=int, default=None,
                 help="n of the n x n matmul peak (default: 2048 CPU, 8192 GPU)")
  p.add_argument("--peak-repeats", type=int, default=None,
                 help="timed matmuls for the peak (default: 5 CPU, 10 GPU)")
  p.add_argument("--cpu-devices", type=int, default=0,
                 help="XLA devices the CPU is split into (jaxtrain's mesh.cpu_devices; 0: its auto "
                      "choice for each config's batch)")
  p.add_argument("--compile-cache", action="store_true",
                 help="use jaxtrain's persistent compile cache (compile times may be cache hits)")
  p.add_argument("--out", default=None,
                 help=f"output directory (default: benchmarks/results/<date>-{NAME}/)")
  args = p.parse_args(argv)
  args.out = args.out or str(common.results_dir(NAME))
  args.platforms_requested = args.platforms
  if args.platforms == "auto":
    args.platforms = ["cpu"] + (["cuda"] if cuda_installed() else [])
  else:
    args.platforms = [s.strip() for s in args.platforms.split(",") if s.strip()]
  if args.configs is not None:
    args.configs = [s.strip() for s in args.configs.split(",") if s.strip()]
    if not args.configs:
      p.error("--configs is empty")
    missing = [c for c in args.configs if not os.path.isfile(config_path(c))]
    if missing:
      p.error(f"--configs: no config file for {missing} (looked in {ROOT / 'configs'})")
  for name in ("steps", "batch_size", "peak_size", "peak_repeats"):
    value = getattr(args, name)
    if value is not None and value < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1")
  if args.warmup is not None and args.warmup < 0:
    p.error("--warmup must be >= 0")
  if not args.platforms:
    p.error("--platforms is empty")
  return args


def config_dtypes(names: list[str]) -> list[str]:
  from jaxtrain.config.defaults import load_config  # configs only: no jax in this process

  return sorted({load_config(config_path(n)).model.dtype for n in names})


def gpu_summary(platforms: dict, args) -> dict:
  for name, p in platforms.items():
    if p["available"] and p["kind"] == "gpu":
      return {"name": p["device_kind"], "platform": name, "note": None}
  tried = {name: p["reason"] for name, p in platforms.items()
           if not p["available"] and platform_kind(name) == "gpu"}
  if tried:
    note = NO_GPU + " (" + "; ".join(f"{k}: {v}" for k, v in tried.items()) + ")"
  elif cuda_installed():
    note = f"no GPU platform was requested (--platforms={args.platforms_requested})"
  else:
    note = NO_GPU + " (no CUDA jax plugin is installed: pip install -e '.[cuda12]')"
  return {"name": None, "platform": None, "note": note}


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  common.use_jaxtrain_environment()
  loadavg_before = os.getloadavg()  # before we start anything: the machine as we found it
  out_dir = Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  machine = common.machine_info()
  log(f"{machine['cpu_model']}, {machine['cores_available']} cores, {machine['mem_gib']} GiB; "
      f"platforms {','.join(args.platforms)}; loadavg {loadavg_before[0]:.2f} "
      f"{loadavg_before[1]:.2f} {loadavg_before[2]:.2f}")
  all_configs = args.configs or list(DEFAULT_CONFIGS + GPU_CONFIGS)
  dtypes = list(PEAK_DTYPES) + [d for d in config_dtypes(all_configs) if d not in PEAK_DTYPES]

  active: list[common.Worker] = []
  sampler = common.LoadSampler(lambda: [os.getpid()] + [w.pid for w in list(active)])
  platforms, results, notes = {}, [], []
  with sampler:
    for platform in args.platforms:
      pinfo = platforms[platform] = probe(platform, args, dtypes, machine, sampler, active)
      if not pinfo["available"]:
        continue
      kind = pinfo["kind"]
      steps = args.steps or DEFAULTS[kind]["steps"]
      warmup = DEFAULTS[kind]["warmup"] if args.warmup is None else args.warmup
      names = args.configs or list(DEFAULT_CONFIGS + (GPU_CONFIGS if kind == "gpu" else ()))
      for name in names:
        results.append(bench_row(platform, pinfo, name, steps, warmup, args, sampler, active))
    sampler.label = "done"
  loadavg_after = os.getloadavg()

  if args.configs is None:
    notes.append(f"{', '.join(GPU_CONFIGS)} is GPU-sized and runs on GPU platforms only in the "
                 f"default run; pass --configs={','.join(GPU_CONFIGS)} --platforms=cpu to time "
                 "it on the CPU.")
  if args.batch_size:
    notes.append(f"--batch-size={args.batch_size}: every config ran at this micro-batch size, "
                 "not its own.")
  report = {
      "benchmark": NAME,
      "timestamp": common.timestamp(),
      "args": vars(args), "machine": machine,
      "data": "random int32 tokens [B, T+1], uniform over the vocabulary; no corpus is read",
      "grad_accum": "forced to 1: one step is one micro-batch of B x T tokens",
      "platforms": platforms, "gpu": gpu_summary(platforms, args),
      "load": {"loadavg_before": loadavg_before, "loadavg_after": loadavg_after,
               "sampler": sampler.summary(), "samples": sampler.samples},
      "results": results, "speedups": speedups(results), "notes": notes,
  }
  (out_dir / f"{NAME}.json").write_text(json.dumps(report, indent=1) + "\n")
  md = markdown(report)
  (out_dir / f"{NAME}.md").write_text(md)
  chart = {}
  for r in results:
    if r["status"] == "ok":
      chart.setdefault(r["config"], {})[r["platform"]] = r["tokens_per_s"]
  if chart:
    gpu = report["gpu"]["name"] or "no GPU"
    common.bar_chart(str(out_dir / f"{NAME}.png"), chart, ylabel="tokens/s (median step)",
                     title=f"training tokens/s: {machine['cpu_model']} "
                           f"({machine['cores_available']} cores) vs {gpu}")
  log("\n" + md)
  log(f"wrote {out_dir / NAME}.json, .md" + (" and .png" if chart else " (no chart: no row ran)"))
  failed = [f"{r['config']} on {r['platform']}" for r in results if r["status"] == "failed"]
  unavailable = [p for p, v in platforms.items() if not v["available"]]
  if failed:
    log(f"error: failed rows: {', '.join(failed)}")
  if args.platforms_requested != "auto" and unavailable:
    log(f"error: requested platform(s) not available: {', '.join(unavailable)}")
  return 1 if failed or not chart or (args.platforms_requested != "auto" and unavailable) else 0


if __name__ == "__main__":
  sys.exit(main())
