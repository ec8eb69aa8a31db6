"""CPU training speed, side by side: jaxtrain against a PyTorch reference of the same model.

  python benchmarks/jax_vs_torch.py --shapes=small,large --rounds=3 --steps=10
  python benchmarks/jax_vs_torch.py --torch=nanogpt --nanogpt_dir=../nanoGPT --shapes=large

The PyTorch side is benchmarks/torch_reference.py (--torch=reference, the default), or nanoGPT
itself (--torch=nanogpt: its own model.py, optimizer and train.py step; see torch_nanogpt.py).

Each framework lives in its own worker process (own thread pool, pinned to the same cores). After
warm-up they take turns, one block of `--steps` timed steps at a time, for `--rounds` rounds, so
background load that comes and goes hits both alike. Both train on the same token batches from
the same initial parameters (jaxtrain's, copied into torch), so their losses must agree. The f32
matmul peak is measured in the same run and in the same workers; MFU is against the higher of the
two. Writes jax_vs_torch.{json,md,png} to --out (default:
benchmarks/results/<date>-jax_vs_torch_<label>/, or <date>-jax_vs_nanogpt_<label>/ with
--torch=nanogpt, the label defaulting to the shapes) and prints the table.
"""

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# jaxtrain from the checkout (installed or not), and this directory's modules however we start.
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402
import torch_nanogpt  # noqa: E402
from reports import log  # noqa: E402
from sides import SEED, JaxSide, TorchSide  # noqa: E402

from jaxtrain.system import allocator  # noqa: E402

NAME = "jax_vs_torch"
TORCH_HINT = ("PyTorch is not installed, so only the jaxtrain side runs. For a CPU build: "
              "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu "
              "(or pip install torch)")
INIT_LOSS_TOLERANCE = 0.3  # ~ln(vocab): logits start near zero (std ~0.02*sqrt(d_model))
SAME_PARAMS_LOSS_TOLERANCE = 1e-4
REFERENCE_SIDE = {"name": "reference", "description": "benchmarks/torch_reference.py"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shapes", default="small,large",
                 help=f"comma list of {', '.join(common.SHAPES)} (default: small,large)")
  p.add_argument("--steps", type=int, default=10, help="timed steps per framework per round")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps first (jax compiles here)")
  p.add_argument("--rounds", type=int, default=3, help="alternations of jax and torch blocks")
  p.add_argument("--pause", type=float, default=0.5,
                 help="seconds of quiet before each round, so neither framework's idle threads "
                      "spin into the other's round")
  p.add_argument("--cpu-devices", type=int, default=0,
                 help="XLA CPU devices for jaxtrain (its mesh.cpu_devices); 0: jaxtrain's own "
                      "choice for each shape")
  p.add_argument("--threads", type=int, default=common.available_cores(),
                 help="cores (and threads) each framework gets (default: all available)")
  p.add_argument("--out", default=None,
                 help=f"output directory (default: benchmarks/results/<date>-{NAME}_<label>/)")
  p.add_argument("--label", default=None,
                 help="names the default output directory (default: the shapes, e.g. small)")
  p.add_argument("--no-torch", action="store_true", help="time the jaxtrain side only")
  p.add_argument("--torch", choices=("reference", "nanogpt"), default="reference",
                 help="the PyTorch side: reference (benchmarks/torch_reference.py) or nanogpt "
                      "(nanoGPT's own model.py and train step, from --nanogpt_dir)")
  p.add_argument("--nanogpt_dir", "--nanogpt-dir", default=None,
                 help="a nanoGPT checkout (its model.py); required with --torch=nanogpt")
  p.add_argument("--peak-size", type=int, default=2048, help="n of the n x n f32 matmul peak")
  p.add_argument("--peak-repeats", type=int, default=10)
  p.add_argument("--torch-allocator", choices=("glibc", "jaxtrain"), default="glibc",
                 help="glibc (with huge pages, as before): PyTorch as its users start it; "
                      "jaxtrain: under jaxtrain's own allocator setup (mimalloc), for comparison")
  args = p.parse_args(argv)
  args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
  unknown = [s for s in args.shapes if s not in common.SHAPES]
  if unknown or not args.shapes:
    p.error(f"--shapes: unknown {unknown}; choose from {', '.join(common.SHAPES)}")
  args.label = args.label or "_".join(args.shapes)
  error = torch_nanogpt.check_args(args.torch, args.nanogpt_dir, args.no_torch)
  if error:  # one line, no usage
    print(f"jax_vs_torch.py: error: {error}", file=sys.stderr)
    raise SystemExit(2)
  prefix = "jax_vs_nanogpt" if args.torch == "nanogpt" else NAME
  args.out = args.out or str(reports.results_dir(f"{prefix}_{args.label}"))
  for name in ("steps", "rounds", "threads", "peak_size", "peak_repeats"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1")
  if args.warmup < 0:
    p.error("--warmup must be >= 0")
  if args.warmup == 0:
    print("note: --warmup=0: jax's first timed step includes compiling", file=sys.stderr)
  return args


def check(ok: bool, msg: str) -> None:
  if not ok:
    raise SystemExit(f"error: {msg}")


def _other_pct(rounds: list[dict]) -> float | None:
  """Others' share of the machine during these timed blocks, weighted by block length."""
  timed = [(r["cpu"]["other_pct"], r["total_s"]) for r in rounds if r["cpu"]]
  total = sum(t for _, t in timed)
  return round(sum(p * t for p, t in timed) / total, 1) if total else None


def bench_shape(shape: common.Shape, workers: dict, args, sampler: common.LoadSampler) -> dict:
  log(f"\n== {shape.name}: {shape.describe()}")
  sampler.label = f"{shape.name}/setup"
  hyper = common.Hyper.from_config(common.gpt2_config(shape))
  jx = workers["jax"].call("setup", shape=shape)
  ln_v = math.log(shape.vocab_size)
  log(f"  jax:   {jx['param_count']:,} params, {jx['flops_per_token'] / 1e6:.2f} MFLOP/token, "
      f"initial loss {jx['init_loss']:.4f} (ln {shape.vocab_size} = {ln_v:.4f})")
  check(abs(jx["init_loss"] - ln_v) < INIT_LOSS_TOLERANCE, f"jax initial loss {jx['init_loss']}")
  infos = {"jax": {k: v for k, v in jx.items() if k != "params"}}
  if "torch" in workers:
    th = workers["torch"].call("setup", shape=shape, hyper=hyper, jax_params=jx["params"])
    infos["torch"] = dict(th, side=args.torch)
    log(f"  torch: {th['param_count']:,} params, initial loss {th['own_init_loss']:.4f} with its "
        f"own init, {th['init_loss']:.4f} with jaxtrain's params "
        f"(|diff| {abs(th['init_loss'] - jx['init_loss']):.1e}), {th['num_threads']} threads")
    check(th["param_count"] == jx["param_count"],
          f"parameter counts differ: jax {jx['param_count']}, torch {th['param_count']}")
    check(abs(th["own_init_loss"] - ln_v) < INIT_LOSS_TOLERANCE,
          f"torch initial loss {th['own_init_loss']}")
    tolerance = (torch_nanogpt.LOSS_TOLERANCE if args.torch == "nanogpt"
                 else SAME_PARAMS_LOSS_TOLERANCE)
    infos["torch"]["same_params_loss_tolerance"] = tolerance
    check(abs(th["init_loss"] - jx["init_loss"]) < tolerance,
          f"same params, different loss: jax {jx['init_loss']}, torch {th['init_loss']} "
          f"(tolerance {tolerance})")

  times = {fw: [] for fw in workers}
  rounds = {fw: [] for fw in workers}
  if args.warmup:
    for fw, w in workers.items():
      sampler.label = f"{shape.name}/warmup"
      t0 = time.perf_counter()
      w.call("run", n=args.warmup)
      infos[fw]["warmup_s"] = time.perf_counter() - t0
      log(f"  warm-up {fw:5s} {args.warmup} steps: {infos[fw]['warmup_s']:.1f} s"
          + (" (includes compiling)" if fw == "jax" else ""))
  for r in range(args.rounds):
    order = list(workers) if r % 2 == 0 else list(workers)[::-1]  # neither always goes first
    for fw in order:
      # The other framework's worker threads spin a while after its last step before they
      # sleep: each round starts once they have gone quiet, as they would in a real run.
      time.sleep(args.pause)
      sampler.label = f"{shape.name}/{fw}"
      before = common.cpu_snapshot(sampler.pids())
      res = workers[fw].call("run", n=args.steps)
      cpu = common.cpu_share(before, common.cpu_snapshot(sampler.pids()))
      times[fw] += res["times_s"]
      median = common.summarize(res["times_s"])["median_s"]
      rounds[fw].append({"median_s": median, "total_s": sum(res["times_s"]), "loss": res["loss"],
                         "cpu": cpu})
      log(f"  round {r + 1}/{args.rounds} {fw:5s} {args.steps} steps: median "
          f"{median * 1e3:8.1f} ms/step, last loss {res['loss']:.4f}, other processes "
          f"{reports.others(cpu)} of the machine")
    sampler.label = f"{shape.name}/between"

  out = {"shape": dataclasses.asdict(shape), "hyper": dataclasses.asdict(hyper),
         "param_count": jx["param_count"], "flops_per_token": jx["flops_per_token"],
         "tokens_per_step": shape.tokens_per_step, "frameworks": {}}
  for fw in workers:
    stats = common.summarize(times[fw])
    out["frameworks"][fw] = dict(infos[fw], step_times_s=times[fw], rounds=rounds[fw],
                                 stats=stats, other_pct=_other_pct(rounds[fw]),
                                 tokens_per_s=shape.tokens_per_step / stats["median_s"])
  return out


def add_mfu(results: list[dict], peak_gflops: float) -> None:
  for res in results:
    fws = res["frameworks"]
    for fw in fws.values():
      fw["mfu"] = res["flops_per_token"] * fw["tokens_per_s"] / (peak_gflops * 1e9)
    if "torch" in fws:
      res["jax_over_torch_speed"] = fws["jax"]["tokens_per_s"] / fws["torch"]["tokens_per_s"]


def shown(name: str, fw: dict) -> str:
  """A framework's name in the table and chart: nanoGPT's torch side says so."""
  return "nanogpt" if fw.get("side") == "nanogpt" else name


def table(results: list[dict]) -> str:
  rows = []
  for res in results:
    for name, fw in res["frameworks"].items():
      medians = [r["median_s"] * 1e3 for r in fw["rounds"]]
      ratio = res.get("jax_over_torch_speed")
      rows.append([res["shape"]["name"], shown(name, fw), f"{fw['stats']['median_s'] * 1e3:.1f}",
                   f"{min(medians):.1f}-{max(medians):.1f}", f"{fw['tokens_per_s']:,.0f}",
                   f"{100 * fw['mfu']:.1f}",
                   "-" if ratio is None else (f"{ratio:.2f}" if name == "jax" else "1 (ref)"),
                   "?" if fw["other_pct"] is None else f"{fw['other_pct']:.0f}"])
  return reports.markdown_table(["shape", "framework", "median step ms", "round medians ms",
                                "tokens/s", "MFU %", "jax/torch speed", "others' CPU %"], rows)


def markdown(report: dict) -> str:
  m, peak = report["machine"], report["matmul_peak"]
  peaks = ", ".join(f"{fw} {p['gflops']:.1f}" for fw, p in peak["by_framework"].items())
  side = report.get("torch_side") or {"name": None, "description": "none (jaxtrain only)"}
  nano = side["name"] == "nanogpt"
  lines = [
      f"# jaxtrain vs {'nanoGPT (PyTorch)' if nano else 'PyTorch'}, CPU training step "
      f"({report['timestamp']})", "",
      f"- PyTorch side: {side['description']}"
      + (f"; first losses from the same parameters agree within {torch_nanogpt.LOSS_TOLERANCE} "
         "(not 1e-4: nanoGPT's GELU is exact erf, jaxtrain's tanh-approximate)" if nano else ""),
      f"- machine: {reports.cpu_name(m)}, {m['cores_available']} cores "
      f"available, avx2={m['cpu_flags']['avx2']}, avx512f={m['cpu_flags']['avx512f']}, "
      f"{m['mem_gib']} GiB; python {m['python']}, "
      + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
      "- jaxtrain with its own CPU setup per shape: "
      + "; ".join(f"{r['shape']['name']}: {r['frameworks']['jax']['cpu_devices']} XLA CPU devices"
                  + (", single-threaded matmuls" if r["frameworks"]["jax"].get(
                     "step_compiler_options", {}).get("xla_cpu_multi_thread_eigen") is False else "")
                  + (", no YNNPACK fusions" if "xla_cpu_experimental_ynn_fusion_type" in
                     r["frameworks"]["jax"].get("step_compiler_options", {}) else "")
                  + (", gradients all-reduced at once" if r["frameworks"]["jax"].get(
                      "one_allreduce") else "")
                  for r in report["results"])
      + "; memory: jaxtrain "
      + report.get("allocators", {}).get("jax", "?") + ", PyTorch "
      + report.get("allocators", {}).get("torch", "?"),
      f"- threads per framework: {report['args']['threads']}; warm-up {report['args']['warmup']}, "
      f"{report['args']['rounds']} rounds x {report['args']['steps']} steps each, alternating, "
      f"{report['args']['pause']} s pause before each round",
      f"- f32 matmul peak ({peak['n']}^3, GFLOP/s, best of the runs before and after): {peaks}; "
      f"MFU uses {peak['gflops']:.1f}",
      f"- load: {reports.load_line(report['load'])}", "",
      table(report["results"]), "",
      "jax/torch speed: jaxtrain tokens/s over PyTorch tokens/s (above 1: jaxtrain is faster). "
      "MFU: flops_per_token (6N + 12*L*T*D) x tokens/s over the matmul peak. others' CPU: share "
      "of the whole machine that other processes used during that row's timed blocks (with 2 "
      "cores, 50 = one core busy elsewhere); a row with a high value is not a clean measurement.",
      "",
  ]
  for res in report["results"]:
    losses = ", ".join(f"{shown(fw, v)} {v['rounds'][-1]['loss']:.4f}"
                       for fw, v in res["frameworks"].items())
    lines.append(f"- {res['shape']['name']}: {res['param_count']:,} params, "
                 f"{res['flops_per_token'] / 1e6:.2f} MFLOP/token; last loss: {losses}")
  if report.get("torch_skipped"):
    lines += ["", f"Note: {report['torch_skipped']}"]
  return "\n".join(lines) + "\n"


def measure_peaks(workers: dict, peaks: dict, args, sampler: common.LoadSampler,
                  when: str) -> None:
  sampler.label = "peak"
  for fw, w in workers.items():
    before = common.cpu_snapshot(sampler.pids())
    run = w.call("peak", n=args.peak_size, repeats=args.peak_repeats)
    run.update(when=when, cpu=common.cpu_share(before, common.cpu_snapshot(sampler.pids())))
    peaks[fw].append(run)
    log(f"f32 matmul {args.peak_size}^3 with {fw} ({when}): {run['gflops']:.1f} GFLOP/s (median "
        f"of {args.peak_repeats}), other processes {reports.others(run['cpu'])} of the machine")


def torch_worker(args, side: dict, environ: dict) -> common.Worker:
  log(f"PyTorch side: {side['description']}")
  factory = ((torch_nanogpt.NanoGPTSide, args.threads, args.nanogpt_dir, SEED)
             if args.torch == "nanogpt" else (TorchSide, args.threads))
  return common.Worker("torch", *factory, environ=environ)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  # Each framework as its users start it: jaxtrain with the allocator `python -m jaxtrain` sets up
  # for itself (jaxtrain/system/allocator.py); PyTorch with glibc, huge pages on (--torch-allocator).
  jax_env = common.jaxtrain_environment()
  torch_env = dict(jax_env)
  if args.torch_allocator == "glibc":  # nothing preloaded, whatever this process has
    torch_env.update({k: None for k in [*torch_env, *os.environ]
                      if k == "LD_PRELOAD" or k.startswith("MIMALLOC_")})
  allocators = {fw: allocator.describe(common.environ_with(e))
                for fw, e in (("jax", jax_env), ("torch", torch_env))}
  loadavg_before = os.getloadavg()  # before we start anything: the machine as we found it
  use_torch = not args.no_torch
  torch_side = (torch_nanogpt.describe(args.nanogpt_dir) if args.torch == "nanogpt"
                else REFERENCE_SIDE)
  torch_skipped = None
  if use_torch and importlib.util.find_spec("torch") is None:
    torch_skipped, use_torch = TORCH_HINT, False
    log(TORCH_HINT)
  out_dir = Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  machine = reports.machine_info()
  log(f"{machine['cpu_model']}, {machine['cores_available']} cores, {args.threads} threads per "
      f"framework; loadavg {loadavg_before[0]:.2f} {loadavg_before[1]:.2f} {loadavg_before[2]:.2f}")

  workers: dict[str, common.Worker] = {}
  sampler = common.LoadSampler(lambda: [os.getpid()] + [w.pid for w in list(workers.values())])
  try:
    with sampler:
      log("starting workers" + (" (jax, torch)" if use_torch else " (jax)"))
      shapes = [common.SHAPES[s] for s in args.shapes]
      workers["jax"] = common.Worker("jax", JaxSide, args.threads, shapes[0], args.cpu_devices,
                                     environ=jax_env)
      if use_torch:
        workers["torch"] = torch_worker(args, torch_side, torch_env)
      peaks = {fw: [] for fw in workers}
      measure_peaks(workers, peaks, args, sampler, "before")
      results = []
      for i, shape in enumerate(shapes):
        if i:  # a fresh jax worker, set up for this shape
          workers["jax"].close()
          workers["jax"] = common.Worker("jax", JaxSide, args.threads, shape, args.cpu_devices,
                                         environ=jax_env)
        results.append(bench_shape(shape, workers, args, sampler))
      measure_peaks(workers, peaks, args, sampler, "after")
      sampler.label = "done"
  finally:
    for w in workers.values():
      w.close()

  # Background load only ever slows a matmul down: the best measurement is the closest to peak.
  best = {fw: max(runs, key=lambda r: r["gflops"]) for fw, runs in peaks.items()}
  peak_fw = max(best, key=lambda fw: best[fw]["gflops"])
  add_mfu(results, best[peak_fw]["gflops"])
  report = {
      "benchmark": NAME, "timestamp": reports.timestamp(),
      "args": vars(args), "machine": machine, "torch_skipped": torch_skipped,
      "torch_side": torch_side if use_torch else None,
      "allocators": allocators,
      "matmul_peak": {"dtype": "float32", "n": args.peak_size, "gflops": best[peak_fw]["gflops"],
                      "from": peak_fw, "by_framework": best, "all": peaks},
      "load": reports.load_record(loadavg_before, sampler, samples=True),
      "results": results,
  }
  md = markdown(report)
  log("\n" + md)
  chart = {r["shape"]["name"]: {shown(fw, v): v["tokens_per_s"] for fw, v in r["frameworks"].items()}
           for r in results}
  reports.write(out_dir, NAME, report, md, chart=lambda path: reports.bar_chart(
      path, chart, ylabel="tokens/s (median step)",
      title=f"training tokens/s, {reports.machine_name(machine)}, f32"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
