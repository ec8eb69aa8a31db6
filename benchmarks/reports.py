"""What every benchmark reports, rendered one way: the machine it ran on, the background load, a
dated result folder holding `<name>.json`, `<name>.md` (Markdown tables) and `<name>.png` (a
chart), and the lines it prints meanwhile.

Imports neither jax nor torch; matplotlib only when a chart is drawn.
"""

import datetime
import json
import os
import platform
import re
import subprocess
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import common

from jaxtrain.system import fmt

RESULTS = Path(__file__).resolve().parent / "results"


def results_dir(name: str) -> Path:
  """Where a benchmark writes by default: benchmarks/results/<today>-<name>/."""
  return RESULTS / f"{datetime.date.today().isoformat()}-{name}"


def timestamp() -> str:
  return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def log(msg: str) -> None:
  print(msg, flush=True)


def write(out_dir: str | Path, name: str, report: dict, md: str,
          chart: Callable[[Path], None] | None = None) -> list[Path]:
  """`report` as `<name>.json`, `md` as `<name>.md` and, given `chart(path)`, `<name>.png` in
  `out_dir` (made if missing); says what it wrote."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = [out / f"{name}.json", out / f"{name}.md"]
  paths[0].write_text(json.dumps(report, indent=1) + "\n")
  paths[1].write_text(md)
  if chart is not None:
    paths.append(out / f"{name}.png")
    chart(paths[-1])
  log("wrote " + ", ".join(str(p) for p in paths))
  return paths


# ---- the machine ---------------------------------------------------------------------------

def _version(package: str) -> str | None:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return None


def _lscpu_model() -> str | None:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  found = re.search(r"^Model name:\s*(.*)$", out, re.M)
  return found.group(1).strip() if found else None


def machine_info() -> dict:
  cpuinfo = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
  model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
  flags = set((re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M) or ["", ""])[1].split())
  mem = re.search(r"^MemTotal:\s*(\d+) kB", open("/proc/meminfo").read(), re.M)
  # A VM may name the CPU just "AMD EPYC"; family/model/stepping still tell the generation.
  ids = {k: re.search(rf"^{k}\s*:\s*(\S+)", cpuinfo, re.M)
         for k in ("cpu family", "model", "stepping")}
  return {
      "cpu_model": model.group(1).strip() if model else platform.processor(),
      "lscpu_model": _lscpu_model(),
      "cpu_family_model_stepping": "/".join(m.group(1) if m else "?" for m in ids.values()),
      "cpu_flags": {f: f in flags for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")},
      "cpu_count": os.cpu_count(),
      "cores_available": common.available_cores(),
      "mem_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
      "python": platform.python_version(),
      "platform": platform.platform(),
      "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "numpy", "torch")},
      "env": {k: v for k, v in os.environ.items() if k.startswith("MIMALLOC_") or k in (
          "XLA_FLAGS", "GLIBC_TUNABLES", "LD_PRELOAD", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
          "JAX_PLATFORMS")},
  }


def cpu_name(m: dict) -> str:
  """The CPU as /proc/cpuinfo and lscpu name it, with its family/model/stepping."""
  return (f"{m['cpu_model']} (lscpu: {m['lscpu_model']}; family/model/stepping "
          f"{m.get('cpu_family_model_stepping', '?')})")


# (vendor's family, model) -> the short name a result folder carries, for the CPU kinds met so far
CPU_TAGS = {("25", "1"): "zen3", ("25", "17"): "zen4", ("26", "2"): "zen5",
            ("6", "207"): "emerald-rapids"}


def cpu_tag(m: dict) -> str:
  """The CPU kind in a result folder's name: zen4, or family25-model17 for a kind not met yet."""
  family, model = m.get("cpu_family_model_stepping", "?/?/?").split("/")[:2]
  return CPU_TAGS.get((family, model), f"family{family}-model{model}")


def machine_name(m: dict, gpu: str | None = None) -> str:
  """What a chart title calls the machine: the GPU if one ran, else the CPU and its cores."""
  return gpu or f"{m['cpu_model']} ({m['cores_available']} cores)"


def cpu_line(m: dict) -> str:
  """The report's CPU line, from `machine_info()`."""
  return (f"CPU: {cpu_name(m)}, {m['cores_available']} cores available of {m['cpu_count']}, "
          f"{m['mem_gib']} GiB RAM")


# ---- the load ------------------------------------------------------------------------------

def load_record(loadavg_before: tuple, sampler: common.LoadSampler, samples: bool = False) -> dict:
  """The report's "load": loadavg before and now, the sampler's summary (and its samples)."""
  load = {"loadavg_before": loadavg_before, "loadavg_after": os.getloadavg(),
          "sampler": sampler.summary()}
  return dict(load, samples=sampler.samples) if samples else load


def load_line(load: dict) -> str:
  a = load["sampler"]["all"]
  return (f"loadavg {load['loadavg_before'][0]:.2f} just before the run, "
          f"{load['loadavg_after'][0]:.2f} after; sampled every {load['sampler']['interval_s']} s "
          f"over the run: machine busy {a['busy_pct']['mean']}%, ours {a['own_pct']['mean']}%, "
          f"other processes {a['other_pct']['mean']}% (max {a['other_pct']['max']}%), "
          f"steal {a['steal_pct']['mean']}%")


def others(cpu: dict | None) -> str:
  """Other processes' share of the machine in a `common.cpu_share` span, for a progress line."""
  return "n/a (too short to see)" if cpu is None else f"{cpu['other_pct']:.0f}%"


# ---- tables and charts ---------------------------------------------------------------------

def fmt_bytes(n: float | None) -> str:
  return "n/a" if n is None else fmt.nbytes(n)


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
  lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def bar_chart(path: str | Path, values: dict[str, dict[str, float]], ylabel: str,
              title: str) -> None:
  """One panel per group (own y scale: shapes differ by orders of magnitude), one bar per series."""
  plt = pyplot()
  groups = list(values)
  fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups) + 1, 3.6), squeeze=False)
  for ax, group in zip(axes[0], groups, strict=True):
    names, heights = list(values[group]), list(values[group].values())
    bars = ax.bar(names, heights, color=[f"C{i}" for i in range(len(names))])
    ax.bar_label(bars, labels=[f"{h:,.0f}" for h in heights], fontsize=8)
    ax.set_title(group)
    ax.margins(y=0.15)
  axes[0][0].set_ylabel(ylabel)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def line_chart(path: str | Path, lines: dict[str, list[tuple[list[float], list[float]]]],
               xlabel: str, ylabel: str) -> None:
  """One colour per name, one line per (xs, ys) of it (seeds), the name in the legend once."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (name, curves) in enumerate(lines.items()):
    for j, (xs, ys) in enumerate(curves):
      ax.plot(xs, ys, label=name if j == 0 else None, color=f"C{i}", alpha=0.8)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
