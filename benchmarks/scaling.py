"""Data-parallel and FSDP scaling of jaxtrain's train step over 1, 2, 4, ... devices.

  python benchmarks/scaling.py                         # nano on 1, 2 and 4 virtual CPU devices
  python benchmarks/scaling.py --platforms=cuda        # real GPUs: 1, 2, 4, ... up to all of them

Each (device count, config) runs in a fresh worker process; on the CPU it splits the machine into
that many virtual devices as a run with mesh.cpu_devices=N does (jaxtrain.system.startup.settle,
before jax starts). The mesh (data=N or fsdp=N), the init, the jitted step and the global batch
come from jaxtrain.core.programs.build, as in `python -m jaxtrain`. The global batch is the same for
every N, so each device gets batch/N rows, and every row trains on the same random-token batches
from the same init, so their losses agree.
Virtual CPU devices share this machine's cores: no real speedup is expected there, and the CPU
table shows what sharding costs. Writes scaling.{json,md,png} to --out (default:
benchmarks/results/<date>-scaling/); the default run takes about a minute on 2 cores.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402
import step_worker as sw  # noqa: E402
from reports import log  # noqa: E402

from jaxtrain.system.startup import cuda_installed  # noqa: E402

NAME = "scaling"
MODES = {"dp": lambda n: {"mesh.data": n, "mesh.fsdp": 1},
         "fsdp": lambda n: {"mesh.data": 1, "mesh.fsdp": n}}
NO_GPU = "not run: no GPU"


def device_counts(requested: list[int] | None, available: int | None) -> list[int]:
  """The requested counts that fit, or 1, 2, 4, ... up to what there is."""
  if requested:
    return [n for n in requested if available is None or n <= available]
  counts, n = [], 1
  while n <= available:
    counts.append(n)
    n *= 2
  return counts


def run_count(platform: str, n: int, name: str, args, sampler: common.LoadSampler,
              active: list) -> list[dict]:
  """Every mode of config `name` at `n` devices, in one worker process."""
  rows = []
  label = f"{platform} x{n} {sw.config_name(name)}"
  base = {"train.batch_size": args.batch_size} if args.batch_size else {}
  if platform == "cpu":
    base["mesh.cpu_devices"] = n  # the CPU set up as jaxtrain sets up n devices
  worker = None
  try:
    worker = common.Worker(label, sw.StepWorker, platform, args.compile_cache,
                           sw.config_path(name), base)
    active.append(worker)
    for mode in (["single"] if n == 1 else args.modes):
      log(f"\n== {sw.config_name(name)} on {platform}, {n} device(s), {mode}")
      overrides = {**base, **(MODES["dp"](1) if mode == "single" else MODES[mode](n))}
      row = {"platform": platform, "config": sw.config_name(name), "mode": mode, "devices": n}
      setup = {"config_path": sw.config_path(name), "overrides": overrides, "n_devices": n}
      try:
        row.update(sw.measure(worker, setup, args.steps, args.warmup, sampler, f"{label}/{mode}"))
      except common.WorkerError as e:
        log(f"  failed: {sw.reason(e)}")
        row.update(status="failed", reason=sw.reason(e))
      rows.append(row)
  except common.WorkerError as e:  # the process itself did not start
    log(f"  {label} failed to start: {sw.reason(e)}")
    rows.append({"platform": platform, "config": sw.config_name(name), "mode": "*",
                 "devices": n, "status": "failed", "reason": sw.reason(e)})
  finally:
    if worker is not None:
      worker.close()
      active.remove(worker)
  return rows


def add_speedups(rows: list[dict]) -> None:
  base = {(r["platform"], r["config"]): r for r in rows
          if r["status"] == "ok" and r["devices"] == 1}
  for r in rows:
    one = base.get((r["platform"], r["config"]))
    if r["status"] == "ok" and one:
      r["speedup_vs_1"] = r["tokens_per_s"] / one["tokens_per_s"]
      r["efficiency"] = r["speedup_vs_1"] / r["devices"]
      r["loss_diff_vs_1"] = abs(r["loss"] - one["loss"])


def table(rows: list[dict]) -> str:
  out = []
  for r in rows:
    head = [r["config"], r["platform"], r["mode"], r["devices"]]
    if r["status"] != "ok":
      out.append(head + ["-"] * 9 + [f"{r['status']}: {r['reason']}"])
      continue
    s = r["stats"]
    out.append(head + [
        f"{r['mesh']['data']} x {r['mesh']['fsdp']}",
        f"{r['batch_size']} ({r['batch_size'] // r['devices']})",
        f"{r['lower_s'] + r['compile_s']:.1f}",
        f"{s['median_s'] * 1e3:,.1f} ({s['p10_s'] * 1e3:,.1f}-{s['p90_s'] * 1e3:,.1f})",
        f"{r['tokens_per_s']:,.0f}",
        f"{r['speedup_vs_1']:.2f}" if "speedup_vs_1" in r else "-",
        f"{100 * r['efficiency']:.0f}" if "efficiency" in r else "-",
        reports.fmt_bytes(r["estimate_bytes"]),
        "?" if r["other_pct"] is None else f"{r['other_pct']:.0f}",
        f"ok, loss {r['loss']:.4f}"])
  return reports.markdown_table(
      ["config", "platform", "mode", "devices", "mesh data x fsdp", "global batch (per device)",
       "compile s", "median step ms (p10-p90)", "tokens/s", "speedup vs 1", "efficiency %",
       "est. memory/device", "others' CPU %", "status"], out)


def markdown(report: dict) -> str:
  m = report["machine"]
  lines = [
      f"# Scaling over devices: data parallel and FSDP ({report['timestamp']})", "",
      f"- {reports.cpu_line(m)}; jax {m['versions']['jax']}",
      "- data: random int32 tokens [B, T+1]; the same global batch B for every device count "
      "(each device gets B/N rows); grad_accum forced to 1",
      f"- steps: {report['args']['warmup']} warm-up + {report['args']['steps']} timed per row; "
      "compile: trace + lower + compile, persistent cache "
      + ("ON" if report["args"]["compile_cache"] else "off"),
      f"- load: {reports.load_line(report['load'])}",
  ]
  for platform, p in report["platforms"].items():
    lines.append(f"- {platform}: " + (p["note"] if not p["ran"] else
                                      f"device counts {p['device_counts']}; {p['note']}"))
  lines += ["", table(report["results"]), "",
            "speedup vs 1: tokens/s over the 1-device row of the same platform and config; "
            "efficiency: speedup / devices. The 1-device row is the baseline of both modes. "
            "Every row trains on the same batches from the same init: the losses agree up to the "
            "order of floating-point sums. est. memory/device: jaxtrain.measure.estimate.memory_estimate "
            "(FSDP splits params, gradients and optimizer state). others' CPU: share of the whole "
            "machine other processes used during the row's timed steps.", ""]
  lines += [f"- {r['config']} {r['mode']} x{r['devices']}: {sw.programs_line(r)}"
            for r in report["results"] if r["status"] == "ok"]
  return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--configs", default="nano", help="comma list of config names or paths")
  p.add_argument("--devices", default=None,
                 help="comma list of device counts (default: 1,2,4 on CPU; 1,2,4,... up to all "
                      "GPUs)")
  p.add_argument("--modes", default="dp,fsdp", help="comma list of dp and fsdp")
  p.add_argument("--platforms", default="auto",
                 help="comma list of cpu, cuda; auto: cpu, and cuda if a CUDA jax is installed")
  p.add_argument("--steps", type=int, default=10, help="timed steps per row")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  p.add_argument("--batch-size", type=int, default=None,
                 help="global batch for every row (default: each config's); must divide by "
                      "every device count")
  p.add_argument("--compile-cache", action="store_true",
                 help="use jaxtrain's persistent compile cache (compile times may be cache hits)")
  p.add_argument("--out", default=None,
                 help=f"output directory (default: benchmarks/results/<date>-{NAME}/)")
  args = p.parse_args(argv)
  args.out = args.out or str(reports.results_dir(NAME))
  args.configs = [s.strip() for s in args.configs.split(",") if s.strip()]
  missing = [c for c in args.configs if not os.path.isfile(sw.config_path(c))]
  if missing or not args.configs:
    p.error(f"--configs: no config file for {missing or 'any'}")
  args.modes = [s.strip() for s in args.modes.split(",") if s.strip()]
  if not args.modes or set(args.modes) - set(MODES):
    p.error(f"--modes: choose from {', '.join(MODES)}")
  try:
    args.devices = [int(s) for s in args.devices.split(",")] if args.devices else None
  except ValueError:
    p.error("--devices: a comma list of integers, e.g. 1,2,4")
  if args.devices and min(args.devices) < 1:
    p.error("--devices must be >= 1")
  args.platforms_requested = args.platforms
  args.platforms = (["cpu"] + (["cuda"] if cuda_installed() else [])
                    if args.platforms == "auto" else
                    [s.strip() for s in args.platforms.split(",") if s.strip()])
  if args.steps < 1 or args.warmup < 0:
    p.error("--steps must be >= 1 and --warmup >= 0")
  from jaxtrain.config.loading import load_config  # configs only: no jax in this process

  counts = args.devices or [1, 2, 4]
  for name in args.configs:
    batch = args.batch_size or load_config(sw.config_path(name)).train.batch_size
    bad = [n for n in counts if batch % n]
    if bad:
      p.error(f"{name}: global batch {batch} does not divide by {bad} devices; pass "
              "--batch-size=<a multiple of every device count>")
  return args


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  common.use_jaxtrain_environment()
  loadavg_before = os.getloadavg()
  out_dir = Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  machine = reports.machine_info()
  log(f"{machine['cpu_model']}, {machine['cores_available']} cores; platforms "
      f"{','.join(args.platforms)}; loadavg {loadavg_before[0]:.2f}")
  active: list[common.Worker] = []
  sampler = common.LoadSampler(lambda: [os.getpid()] + [w.pid for w in list(active)])
  platforms, rows = {}, []
  with sampler:
    for platform in args.platforms:
      if platform == "cpu":
        counts = device_counts(args.devices or [1, 2, 4], None)
        note = (f"virtual devices (mesh.cpu_devices=N, set up by jaxtrain.system.startup.settle) "
                f"sharing this machine's {machine['cores_available']} cores: no real speedup is "
                "expected, the table shows the overhead of sharding (a gain over 1 device only "
                "means that one device's ops did not keep every core busy)")
      else:
        sampler.label = f"{platform}/probe"
        try:
          probe = common.Worker(f"{platform}-probe", sw.StepWorker, platform)
        except common.WorkerError as e:
          log(f"{platform}: {NO_GPU} ({sw.reason(e)})")
          platforms[platform] = {"ran": False, "note": f"{NO_GPU} ({sw.reason(e)})"}
          continue
        try:
          info = probe.call("device_info", dtypes=[])
        finally:
          probe.close()
        counts = device_counts(args.devices, info["device_count"])
        note = f"{info['device_count']} x {info['device_kind']} available"
      platforms[platform] = {"ran": True, "device_counts": counts, "note": note}
      for n in counts:
        for name in args.configs:
          rows += run_count(platform, n, name, args, sampler, active)
    sampler.label = "done"
  if all(p == "cpu" for p in platforms):
    platforms["gpu"] = {"ran": False, "note": NO_GPU + (
        " (no CUDA jax plugin installed)" if not cuda_installed()
        else f" (not requested: --platforms={args.platforms_requested})")}
  add_speedups(rows)
  report = {
      "benchmark": NAME,
      "timestamp": reports.timestamp(),
      "args": vars(args), "machine": machine, "platforms": platforms,
      "load": reports.load_record(loadavg_before, sampler, samples=True),
      "results": rows,
  }
  md = markdown(report)
  log("\n" + md)
  chart, ran = {}, [p for p, v in platforms.items() if v["ran"]]
  for r in rows:
    if r["status"] != "ok":
      continue
    modes = args.modes if r["mode"] == "single" else [r["mode"]]  # 1 device: both baselines
    for mode in modes:
      group = f"{r['config']} {mode}" + ("" if len(ran) == 1 else f" {r['platform']}")
      chart.setdefault(group, {})[f"{r['devices']} dev"] = r["tokens_per_s"]
  title = (f"scaling: {reports.machine_name(machine)}"
           + (", virtual CPU devices" if "cpu" in args.platforms else ""))
  reports.write(out_dir, NAME, report, md, chart=(
      lambda path: reports.bar_chart(path, chart, ylabel="tokens/s (median step)", title=title))
      if chart else None)
  failed = [r for r in rows if r["status"] == "failed"]
  return 1 if failed or not chart else 0


if __name__ == "__main__":
  sys.exit(main())
