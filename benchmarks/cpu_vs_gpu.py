"""Training speed of the same configs on every JAX platform here: the CPU, and a GPU if any.

  python benchmarks/cpu_vs_gpu.py                        # nano, small (and gpt2_124m on a GPU)
  python benchmarks/cpu_vs_gpu.py --configs=nano --platforms=cpu --steps=20

Every (platform, config) row runs in a fresh worker process with JAX_PLATFORMS set to that
platform, so its peak host memory (ru_maxrss) and peak device memory are its own. A row builds
its steps as `python -m jaxtrain` does (`jaxtrain.core.programs.build`; on the CPU, the cores split
into XLA devices by `jaxtrain.system.startup.settle`; on a GPU, one device), then times: the trace +
lower + compile of the train step (the persistent compile cache off unless --compile-cache),
warm-up steps, then the median of the timed steps. Batches are random int32 tokens [B, T+1]:
no corpus is read. grad_accum is forced to 1, so one step is one micro-batch of the config's
batch_size x seq_len (--batch-size overrides B). Each platform's f32 and bf16 matmul peaks are
measured in the same run (`jaxtrain.measure.estimate.time_matmul`); MFU is against the measured peak of
the config's dtype and, for a GPU that jaxtrain.measure.estimate knows, against its datasheet peak.
Writes cpu_vs_gpu.{json,md,png} to --out (default: benchmarks/results/<date>-cpu_vs_gpu/).

Default steps: 1 warm-up + 5 timed on a CPU, 3 + 20 on a GPU. The default run on a 2-core CPU
without a GPU takes about 3 to 6 minutes, nearly all of it `small` (64 x 256 tokens per step,
20 to 50 s per step on 2 shared cores, ~6.5 GiB of RAM); a GPU adds a minute or two.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# jaxtrain from the checkout (installed or not), and this directory's modules however we start.
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402
import step_worker as sw  # noqa: E402
from reports import log  # noqa: E402

from jaxtrain.system.startup import cuda_installed  # noqa: E402

NAME = "cpu_vs_gpu"
DEFAULT_CONFIGS = ("nano", "small")
GPU_CONFIGS = ("gpt2_124m",)  # GPU-sized: in the default run on GPU platforms only
DEFAULTS = {
    "cpu": {"steps": 5, "warmup": 1, "peak_size": 2048, "peak_repeats": 5},
    "gpu": {"steps": 20, "warmup": 3, "peak_size": 8192, "peak_repeats": 10},
}
PEAK_DTYPES = ("float32", "bfloat16")
NO_GPU = "no GPU platform available on this machine"


def _fmt_gflops(gflops: float) -> str:
  return f"{gflops / 1e3:,.1f} TFLOP/s" if gflops >= 1e3 else f"{gflops:,.1f} GFLOP/s"


def probe(platform: str, args, dtypes: list[str], machine: dict, sampler: common.LoadSampler,
          active: list) -> dict:
  """Starts `platform` in a worker: can it start, what device is it, its matmul peaks."""
  sampler.label = f"{platform}/probe"
  log(f"\n== platform {platform}")
  try:
    worker = common.Worker(f"{platform}-probe", sw.StepWorker, platform)
  except common.WorkerError as e:
    log(f"  not available: {sw.reason(e)}")
    return {"available": False, "reason": sw.reason(e)}
  active.append(worker)
  try:
    info = worker.call("device_info", dtypes=dtypes)
    kind = sw.platform_kind(info["platform"])
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
          + f"; other processes {reports.others(run['cpu'])} of the machine")
  finally:
    worker.close()
    active.remove(worker)
  return dict(info, available=True, kind=kind, matmul_peak=peaks)


def bench_row(platform: str, pinfo: dict, name: str, steps: int, warmup: int, args,
              sampler: common.LoadSampler, active: list) -> dict:
  log(f"\n== {sw.config_name(name)} on {platform} ({pinfo['device_name']})")
  overrides = {"train.batch_size": args.batch_size} if args.batch_size else {}
  if args.cpu_devices:
    overrides["mesh.cpu_devices"] = args.cpu_devices
  row = {"platform": platform, "device": pinfo["device_name"], "config": sw.config_name(name),
         "steps": steps, "warmup": warmup}
  worker = None
  try:
    worker = common.Worker(f"{platform}-{row['config']}", sw.StepWorker, platform,
                           args.compile_cache, sw.config_path(name), overrides)
    active.append(worker)
    row.update(sw.measure(worker, {"config_path": sw.config_path(name), "overrides": overrides},
                       steps, warmup, sampler, f"{platform}/{row['config']}"))
  except common.WorkerError as e:
    log(f"  failed: {sw.reason(e)}")
    row.update(status="failed", reason=sw.reason(e))
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
  return reports.markdown_table(
      ["config", "platform", "device", "dtype", "micro-batch B x T", "compile s",
       "median step ms (p10-p90)", "tokens/s", "MFU % (measured peak)", "MFU % (datasheet)",
       "others' CPU %", "status"], rows)


def memory_table(results: list[dict]) -> str:
  rows = []
  for r in results:
    if r["status"] != "ok":
      continue
    m, b = r["memory"], reports.fmt_bytes
    host = f"{b(m['host_peak_bytes'])} ({b(m['host_peak_after_compile_bytes'])})"
    device = "null (CPU)" if m["device_peak_bytes"] is None else b(m["device_peak_bytes"])
    rows.append([r["config"], r["platform"], f"{r['param_count']:,}", host,
                 b(m["host_added_bytes"]), device, b(r["estimate_bytes"]),
                 b(r["xla_plan_bytes"])])
  return reports.markdown_table(
      ["config", "platform", "params", "host peak RSS (by the end of compiling)",
       "host RSS added by the row", "device peak", "jaxtrain estimate", "XLA buffer plan"], rows)


def speedup_table(ups: list[dict]) -> str:
  return reports.markdown_table(
      ["config", "platform", "tokens/s over CPU", "compile time over CPU"],
      [[u["config"], u["platform"], f"{u['tokens_per_s_speedup']:,.1f}x",
        f"{u['compile_time_ratio']:.2f}x"] for u in ups])


def markdown(report: dict) -> str:
  m = report["machine"]
  lines = [
      f"# Training step: CPU vs GPU ({report['timestamp']})", "",
      f"- {reports.cpu_line(m)}",
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
    lines += [f"- load: {reports.load_line(report['load'])}", "", "No row ran."]
    return "\n".join(lines) + "\n"
  lines += [f"- load: {reports.load_line(report['load'])}", "", "## Speed", "",
            speed_table(report["results"]), "",
            "tokens/s: B x T over the median step. MFU: flops_per_token (6N + 12*L*T*D) x "
            "tokens/s over the matmul peak of the row's dtype, measured in this run on that "
            "platform, or the vendor's dense datasheet peak (GPUs jaxtrain.measure.estimate knows). "
            "others' CPU: share of the whole machine other processes used during that row's timed "
            "steps (with 2 cores, 50 = one core busy elsewhere): a high value means a noisy "
            "measurement.", ""]
  lines += [f"- {r['config']} on {r['platform']}: {r['n_devices']} device(s), mesh data "
            f"{r['mesh']['data']} x fsdp {r['mesh']['fsdp']}; {sw.programs_line(r)}"
            for r in report["results"] if r["status"] == "ok"]
  lines += ["", "## Memory (per device)", "", memory_table(report["results"]), "",
            "host peak RSS: ru_maxrss of the row's own worker process (includes jax itself), at "
            "the end and, in brackets, right after compiling (XLA's compiler can set the peak "
            "for small models); added by the row: the end peak minus the RSS just before the "
            "state was built (state, batches, compiler, step buffers). device "
            "peak: memory_stats()['peak_bytes_in_use'] on a GPU; null on CPU, where device memory "
            "is host RAM. jaxtrain estimate: jaxtrain.measure.estimate.memory_estimate; XLA buffer plan: "
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
  args.out = args.out or str(reports.results_dir(NAME))
  args.platforms_requested = args.platforms
  if args.platforms == "auto":
    args.platforms = ["cpu"] + (["cuda"] if cuda_installed() else [])
  else:
    args.platforms = [s.strip() for s in args.platforms.split(",") if s.strip()]
  if args.configs is not None:
    args.configs = [s.strip() for s in args.configs.split(",") if s.strip()]
    if not args.configs:
      p.error("--configs is empty")
    missing = [c for c in args.configs if not os.path.isfile(sw.config_path(c))]
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
  from jaxtrain.config.loading import load_config  # configs only: no jax in this process

  return sorted({load_config(sw.config_path(n)).model.dtype for n in names})


def gpu_summary(platforms: dict, args) -> dict:
  for name, p in platforms.items():
    if p["available"] and p["kind"] == "gpu":
      return {"name": p["device_kind"], "platform": name, "note": None}
  tried = {name: p["reason"] for name, p in platforms.items()
           if not p["available"] and sw.platform_kind(name) == "gpu"}
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
  machine = reports.machine_info()
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

  if args.configs is None:
    notes.append(f"{', '.join(GPU_CONFIGS)} is GPU-sized and runs on GPU platforms only in the "
                 f"default run; pass --configs={','.join(GPU_CONFIGS)} --platforms=cpu to time "
                 "it on the CPU.")
  if args.batch_size:
    notes.append(f"--batch-size={args.batch_size}: every config ran at this micro-batch size, "
                 "not its own.")
  report = {
      "benchmark": NAME,
      "timestamp": reports.timestamp(),
      "args": vars(args), "machine": machine,
      "data": "random int32 tokens [B, T+1], uniform over the vocabulary; no corpus is read",
      "grad_accum": "forced to 1: one step is one micro-batch of B x T tokens",
      "platforms": platforms, "gpu": gpu_summary(platforms, args),
      "load": reports.load_record(loadavg_before, sampler, samples=True),
      "results": results, "speedups": speedups(results), "notes": notes,
  }
  md = markdown(report)
  log("\n" + md)
  chart = {}
  for r in results:
    if r["status"] == "ok":
      chart.setdefault(r["config"], {})[r["platform"]] = r["tokens_per_s"]
  title = (f"training tokens/s: {reports.machine_name(machine)} vs "
           f"{report['gpu']['name'] or 'no GPU'}")
  reports.write(out_dir, NAME, report, md, chart=(
      lambda path: reports.bar_chart(path, chart, ylabel="tokens/s (median step)", title=title))
      if chart else None)
  if not chart:
    log("no chart: no row ran")
  failed = [f"{r['config']} on {r['platform']}" for r in results if r["status"] == "failed"]
  unavailable = [p for p, v in platforms.items() if not v["available"]]
  if failed:
    log(f"error: failed rows: {', '.join(failed)}")
  if args.platforms_requested != "auto" and unavailable:
    log(f"error: requested platform(s) not available: {', '.join(unavailable)}")
  return 1 if failed or not chart or (args.platforms_requested != "auto" and unavailable) else 0


if __name__ == "__main__":
  sys.exit(main())
