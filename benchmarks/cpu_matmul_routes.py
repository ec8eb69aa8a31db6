"""Matmul GFLOP/s on this CPU per dtype and route: jax under each XLA CPU option that could move a
matmul (per-jit compile options), torch (oneDNN), and oneMKL through ctypes where the `mkl` wheel
is installed, on 1 and 2 threads, at 2048^3 and at a recipe's shape (3072 x 96 x 288: the q/k/v
projection of configs/shakespeare_char.py's batch).

    python benchmarks/cpu_matmul_routes.py --rounds=5 --round-s=0.4

bfloat16 means bfloat16 inputs; jax and MKL accumulate and return float32
(`preferred_element_type`), torch.mm returns bfloat16. Each (framework, threads) pair is a worker
process of its own, pinned to its first cores before its framework starts its thread pool; the
parent runs every route once per round (workers and routes in rotating order), each for about
--round-s seconds of products, and reports the median over rounds with the load meanwhile. The
XLA CPU flags this jaxlib knows (`XLA_FLAGS=--help`) are recorded with their defaults. Writes
cpu_matmul_routes.{json,md,png} to --out (default benchmarks/results/<date>-cpu_matmul_routes/).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "cpu_matmul_routes"
SHAPES = {"2048^3": (2048, 2048, 2048), "3072x96x288": (3072, 96, 288)}  # M, K, N
DTYPES = ("float32", "bfloat16")
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
DOT = "LIBRARY_FUSION_TYPE_DOT"
# name: per-jit compile options. Each library route is tried alone, YNNPACK's fusions off where
# they would otherwise take the dot first.
JAX_OPTIONS = {
    "default": {},
    "ynn off (Eigen)": NO_YNN,
    "ynn individual dot": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "ynn dot": {"xla_cpu_experimental_ynn_fusion_type": DOT},
    "xnn dot": {**NO_YNN, "xla_cpu_experimental_xnn_fusion_type": DOT},
    "xnn graph greedy": {**NO_YNN,
                         "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY"},
    "onednn dot fusion": {**NO_YNN, "xla_cpu_experimental_onednn_fusion_type": DOT},
    "use_onednn": {**NO_YNN, "xla_cpu_use_onednn": True},
    "use_onednn + custom call": {**NO_YNN, "xla_cpu_use_onednn": True,
                                 "xla_cpu_experimental_onednn_custom_call": True},
    "no xnnpack": {"xla_cpu_use_xnnpack": False},
    "fast math": {"xla_cpu_enable_fast_math": True},
    "vector width 512": {"xla_cpu_prefer_vector_width": 512},
    "preset fast runtime": {"xla_cpu_opt_preset": "CPU_OPT_PRESET_FAST_RUNTIME"},
    "Eigen single-threaded": {**NO_YNN, "xla_cpu_multi_thread_eigen": False},
}
ACTIVE: list = []  # the workers alive now: their CPU time is ours, not background load


def xla_cpu_flags() -> dict:
  """{flag: default} for every --xla_cpu_* flag this jaxlib prints for XLA_FLAGS=--help."""
  env = dict(os.environ, XLA_FLAGS="--help", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, text=True,
                       capture_output=True, timeout=120)
  return dict(re.findall(r"--(xla_cpu_\w+)=(\S*)", out.stdout + out.stderr))


def library(hlo: str) -> str:
  """Which library a compiled program's dot went to, from its HLO text."""
  for name, marker in (("YNNPACK", "__ynn"), ("XNNPACK", "__xnn"), ("oneDNN", "onednn")):
    if marker in hlo:
      return name
  return "XLA dot (Eigen)"


def _inputs(shape, seed: int = 0):
  import numpy as np

  m, k, n = shape
  rng = np.random.default_rng(seed)
  return rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)


def _error(got, a, b) -> float:
  """Largest error against the float64 product of the inputs as given, over the largest entry."""
  import numpy as np

  ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def jax_routes(shapes: dict) -> dict:
  import jax
  import jax.numpy as jnp

  routes = {}
  product = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  for shape_name, shape in shapes.items():
    for dtype in DTYPES:
      a, b = (jnp.asarray(x, dtype) for x in _inputs(shape))
      for option, opts in JAX_OPTIONS.items():
        compiled = product.lower(a, b).compile(compiler_options=opts)
        run = lambda c=compiled, a=a, b=b: c(a, b).block_until_ready()
        routes[shape_name, f"jax {dtype}: {option}"] = (run, {
            "library": library(compiled.as_text()), "error": _error(run(), a, b), "options": opts})
  return routes


def torch_routes(shapes: dict, threads: int) -> dict:
  import torch

  torch.set_num_threads(threads)
  routes = {}
  for shape_name, shape in shapes.items():
    for dtype in DTYPES:
      a, b = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in _inputs(shape))
      run = lambda a=a, b=b: torch.mm(a, b)
      routes[shape_name, f"torch {dtype}"] = (run, {
          "library": "oneDNN/MKL (torch.mm)", "error": _error(run().float(), a.float(), b.float())})
  return routes


def mkl_routes(shapes: dict, threads: int) -> dict:
  import jax
  import mkl_gemm
  import ml_dtypes
  import numpy as np

  mkl = mkl_gemm.Mkl(threads)
  via_jax = jax.jit(mkl_gemm.jax_matmul(mkl))
  lib = f"oneMKL {mkl.version()['version']} ({mkl.version()['processor']})"
  routes = {}
  for shape_name, shape in shapes.items():
    for dtype in DTYPES:
      a, b = (x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32) for x in _inputs(shape))
      out = np.empty((shape[0], shape[2]), np.float32)
      run = lambda a=a, b=b, out=out: mkl.matmul(a, b, out)
      routes[shape_name, f"mkl {dtype}"] = (run, {"library": lib, "error": _error(run(), a, b)})
    ja, jb = (jax.numpy.asarray(x, "bfloat16") for x in _inputs(shape))
    run = lambda a=ja, b=jb: via_jax(a, b).block_until_ready()
    routes[shape_name, "jax bfloat16: pure_callback -> mkl"] = (run, {
        "library": lib, "error": _error(run(), ja.astype("float32"), jb.astype("float32"))})
  return routes


class Routes:
  """In a worker pinned to `threads` cores: every route of `framework` at every shape."""

  def __init__(self, framework: str, threads: int, shape_names: list[str]):
    common.pin_cores(threads)  # before any thread pool starts: XLA sizes its pool from this
    os.environ["JAX_PLATFORMS"] = "cpu"
    shapes = {s: SHAPES[s] for s in shape_names}
    self.routes = {"jax": lambda: jax_routes(shapes), "torch": lambda: torch_routes(shapes, threads),
                   "mkl": lambda: mkl_routes(shapes, threads)}[framework]()

  def describe(self) -> list:
    return [[shape, route, info] for (shape, route), (_, info) in self.routes.items()]

  def time(self, shape: str, route: str, seconds: float) -> float:
    """Median seconds of one product over about `seconds` of products (at least 2), after an
    untimed one that wakes the thread pool (it sleeps while the other routes run)."""
    run = self.routes[shape, route][0]
    run()
    times, t_end = [], time.perf_counter() + seconds
    while len(times) < 2 or time.perf_counter() < t_end:
      t0 = time.perf_counter()
      run()
      times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rotate(xs: list, r: int) -> list:
  return xs[r % len(xs):] + xs[:r % len(xs)] if xs else xs


def measure(args, sampler: common.LoadSampler) -> list[dict]:
  """Every route's rows: GFLOP/s per round, their median, and what the route is."""
  workers, rows = [], {}
  try:
    for threads in args.threads:
      for framework in args.frameworks:
        sampler.label = f"start {framework} {threads}t"
        try:
          w = common.Worker(f"{framework}-{threads}t", Routes, framework, threads, args.shapes)
        except common.WorkerError as e:  # torch or mkl not installed: the others still run
          reports.log(f"skipped {framework}: {str(e).strip().splitlines()[-1]}")
          continue
        workers.append(w)
        ACTIVE.append(w)
        for shape, route, info in w.call("describe"):
          rows[threads, shape, route] = {"threads": threads, "shape": shape, "route": route,
                                         "worker": w, "seconds": [], "others": [], **info}
    for r in range(args.rounds):
      for w in _rotate(workers, r):
        for row in _rotate([x for x in rows.values() if x["worker"] is w], r):
          sampler.label = f"{row['threads']}t {row['shape']} {row['route']}"
          before = common.cpu_snapshot([os.getpid(), w.pid])  # this call's own load
          row["seconds"].append(w.call("time", shape=row["shape"], route=row["route"],
                                       seconds=args.round_s))
          share = common.cpu_share(before, common.cpu_snapshot([os.getpid(), w.pid]))
          row["others"].append(share["other_pct"] if share else None)
      reports.log(f"round {r + 1}/{args.rounds} done")
  finally:
    for w in workers:
      w.close()
  out = []
  for (_, shape, _), row in rows.items():
    m, k, n = SHAPES[shape]
    gflops = [2 * m * k * n / s / 1e9 for s in row.pop("seconds")]
    row.pop("worker")
    others = [x for x in row.pop("others") if x is not None]
    out.append({**row, "gflops_per_round": gflops, "gflops": statistics.median(gflops),
                "others_pct": round(statistics.fmean(others), 1) if others else None})
  return out


def markdown(report: dict) -> str:
  m, load = report["machine"], report["load"]
  lines = [f"# Matmul GFLOP/s per dtype and route ({report['when']})", "",
           f"- {reports.cpu_line(m)}; jax {m['versions']['jax']}, torch {m['versions']['torch']}",
           f"- CPU flags: {', '.join(f for f, on in m['cpu_flags'].items() if on)}",
           f"- load: {reports.load_line(load)}",
           f"- {report['args']['rounds']} rounds, each route ~{report['args']['round_s']} s of "
           "products a round, in rotating order; GFLOP/s: median over rounds (p10-p90 of rounds)", ""]
  for shape in report["args"]["shapes"]:
    for threads in report["args"]["threads"]:
      rows = [r for r in report["rows"] if r["shape"] == shape and r["threads"] == threads]
      base = next((r["gflops"] for r in rows if r["route"] == "jax float32: default"), None)
      table = []
      for r in sorted(rows, key=lambda r: -r["gflops"]):
        q = sorted(r["gflops_per_round"])
        spread = f"{q[len(q) // 10]:.0f}-{q[(9 * len(q)) // 10]:.0f}"
        table.append([r["route"], r["library"], f"{r['gflops']:.1f}", spread,
                      f"{r['gflops'] / base:.2f}x" if base else "", f"{r['error']:.1e}", r["others_pct"]])
      lines += [f"## {shape}, {threads} thread{'s' if threads > 1 else ''}", "",
                reports.markdown_table(["route", "library (from the compiled HLO)", "GFLOP/s",
                                        "p10-p90", "vs jax float32 default", "max error / max |C|",
                                        "others' CPU %"], table), ""]
  lines += ["max error: against the float64 product of the inputs as the route got them (bfloat16 "
            "inputs already rounded), over the largest entry. others' CPU %: the share of the whole "
            "machine other processes used while the row's products ran, mean over its rounds (50: one "
            "of 2 cores).", "",
            "XLA CPU flags of this jaxlib (`XLA_FLAGS=--help`), with their defaults: "
            + ", ".join(f"`{k}={v}`" for k, v in report["xla_cpu_flags"].items()), ""]
  return "\n".join(lines)


def chart(path: Path, report: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = [(s, t) for s in report["args"]["shapes"] for t in report["args"]["threads"]]
  fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 9), squeeze=False)
  for ax, (shape, threads) in zip(axes[0], panels, strict=True):
    rows = sorted((r for r in report["rows"] if r["shape"] == shape and r["threads"] == threads),
                  key=lambda r: r["gflops"])
    colors = ["C1" if "bfloat16" in r["route"] else "C0" for r in rows]
    bars = ax.barh([r["route"] for r in rows], [r["gflops"] for r in rows], color=colors)
    ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_title(f"{shape}, {threads} thread(s)", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("GFLOP/s (median of rounds); orange: bfloat16")
  fig.suptitle(reports.machine_name(report["machine"]), fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
  p.add_argument("--threads", default="1,2", help="comma list of thread counts")
  p.add_argument("--frameworks", default="jax,torch,mkl", help="comma list of jax, torch, mkl")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--round-s", type=float, default=0.4, help="seconds of products per route a round")
  p.add_argument("--out", default=str(reports.results_dir(NAME)))
  args = p.parse_args(argv)
  args.shapes, args.frameworks = args.shapes.split(","), args.frameworks.split(",")
  args.threads = [int(t) for t in args.threads.split(",") if int(t) <= common.available_cores()]
  return args


def main() -> None:
  args = parse_args()
  loadavg_before = os.getloadavg()
  with common.LoadSampler(lambda: [os.getpid(), *(w.pid for w in list(ACTIVE))]) as sampler:
    rows = measure(args, sampler)
  report = {"when": reports.timestamp(), "args": vars(args), "rows": rows,
            "xla_cpu_flags": xla_cpu_flags(), "machine": reports.machine_info(),
            "load": reports.load_record(loadavg_before, sampler)}
  md = markdown(report)
  print(md)
  reports.write(args.out, NAME, report, md, lambda path: chart(path, report))


if __name__ == "__main__":
  main()
