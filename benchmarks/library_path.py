"""The library path against the command line: nano's tokens/s, and where a time budget with
model.size=auto ends, from `python -m jaxtrain`; from a script that imports jaxtrain and then uses
jax before `jt.run` (`script`); from one that used jax before it imported jaxtrain
(`script_jax_first`); and from a Jupyter kernel (nbclient) that imports jaxtrain and then uses jax
(`notebook`). Alternating rounds, the order turning each round, with the machine's load.

    python benchmarks/library_path.py --data=/work/shared/data/tinyshakespeare.txt
    python benchmarks/library_path.py --parts=speed --steps=300 --rounds=3

speed: nano for --steps steps, samples off; a run's tokens/s is the median of its logged readings
(metrics.jsonl); its first line names its devices and allocator. budget:
configs/shakespeare_char.py on --data with model.size=auto and train.time_budget=--budget; the
wall time of `python -m jaxtrain` from spawn to exit, of `jt.run` from its call to its return
(where the library's budget counts from). The token cache and the speed probe of model.size=auto
are made first, in a cache of the benchmark's own. Target: the library's tokens/s within 5% of the
command line's, every budget's wall time within 5% of the budget. Writes
library_path.{json,md,png} to --out (default: benchmarks/results/<date>-library-path-<cpu>/).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

from jaxtrain.system import fmt  # noqa: E402
from jaxtrain.tools import runs  # noqa: E402

MODES = ("cli", "script", "script_jax_first", "notebook")
TARGET = 0.05
USE_JAX = "import jax\njax.numpy.zeros(1).block_until_ready()  # jax used before the run\n"
RUN = ("import json, time\nimport jaxtrain as jt\n" + USE_JAX +
       "cfg = jt.load_config({config!r}, **{overrides!r})\nt = time.time()\nresult = jt.run(cfg)\n"
       "print('RESULT ' + json.dumps({{'run_s': time.time() - t, 'wall_s': result.wall_s}}), "
       "flush=True)\n")
NOTEBOOK = """
import json, os, sys, tempfile
import nbformat
from nbclient import NotebookClient
spec = tempfile.mkdtemp()
os.makedirs(spec + "/kernels/bench")
json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
           "display_name": "bench", "language": "python"}, open(spec + "/kernels/bench/kernel.json", "w"))
os.environ["JUPYTER_PATH"] = spec
cells = ["import jaxtrain as jt\\n" + sys.argv[1], sys.argv[2]]
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
out = NotebookClient(nb, kernel_name="bench", timeout=3600).execute()
for cell in out.cells:
  for o in cell.outputs:
    print(o.get("text", ""), end="")
"""


def command(mode: str, config: str, overrides: dict) -> list[str]:
  if mode == "cli":
    return [sys.executable, "-m", "jaxtrain", f"--config={config}",
            *(f"--config.{k}={v}" for k, v in overrides.items())]
  run = RUN.format(config=config, overrides=overrides)
  if mode == "notebook":
    return [sys.executable, "-c", NOTEBOOK, USE_JAX, run]
  return [sys.executable, "-c", (USE_JAX if mode == "script_jax_first" else "") + run]


def one_run(part: str, mode: str, config: str, overrides: dict, env: dict, scratch: Path) -> dict:
  """One run, from spawn to exit: what its first lines say, its speed and its wall time."""
  workdir = Path(tempfile.mkdtemp(prefix=f"{part}-{mode}-", dir=scratch)) / "run"
  overrides = {"workdir": str(workdir), "headless": True, **overrides}
  t0 = time.perf_counter()
  res = subprocess.run(command(mode, config, overrides), cwd=ROOT, env=env, capture_output=True,
                       text=True)
  lines = (res.stdout + res.stderr).splitlines()
  result = next((json.loads(x[7:]) for x in lines if x.startswith("RESULT ")), {})
  header = next((x for x in lines if x.startswith("jaxtrain ")), "")
  row = {"part": part, "mode": mode, "exit": res.returncode,
         "process_s": round(time.perf_counter() - t0, 2), "run_s": result.get("run_s"),
         "devices": next((p.split(" (")[0] for p in header.split(" | ") if p.startswith("cpu x")), "?"),
         "allocator": header.rsplit(" | ", 1)[-1], "notes": [x for x in lines if x.startswith("note:")],
         "tokens_per_sec": runs.read(workdir).median_speed() if (workdir / "config.json").exists() else None,
         "tail": lines[-6:]}
  row["wall_s"] = row["process_s"] if mode == "cli" else round(row["run_s"] or 0, 2)
  shutil.rmtree(workdir.parent, ignore_errors=True)
  return row


def warm_up(args, env: dict, scratch: Path) -> None:
  """The token caches, and model.size=auto's speed probe (a dry run, with a budget the probe
  leaves room in), before anything is timed."""
  for cmd in ([sys.executable, "-m", "jaxtrain", "--config=nano", "--dry_run",
               f"--config.workdir={scratch / 'warm'}"],
              [sys.executable, "-m", "jaxtrain", "--config=shakespeare_char", "--dry_run",
               f"--config.data.path={args.data}", "--config.train.time_budget=10m",
               "--config.model.size=auto", f"--config.workdir={scratch / 'warm'}"]):
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode:
      raise SystemExit(f"error: the warm-up failed: {res.stderr[-2000:]}")


def measure(args, env: dict, scratch: Path, sampler: common.LoadSampler) -> list[dict]:
  parts = {"speed": ("nano", {"train.max_steps": args.steps, "sample.num_samples": 0}),
           "budget": ("shakespeare_char", {"data.path": args.data, "model.size": "auto",
                                           "train.time_budget": args.budget})}
  rows = []
  for r in range(args.rounds):
    order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
    for part in args.parts:
      for mode in order:
        sampler.label = f"{part} {mode} {r}"
        load = os.getloadavg()[0]
        row = one_run(part, mode, *parts[part], env, scratch)
        row.update(round=r, loadavg_before=round(load, 2), label=sampler.label)
        rows.append(row)
        speed = f"{row['tokens_per_sec']:,.0f} tok/s" if row["tokens_per_sec"] else "-"
        reports.log(f"{part} {mode} round {r}: exit {row['exit']}, {row['devices']}, "
                    f"{row['allocator']}, {speed}, wall {row['wall_s']} s, loadavg {load:.1f}")
  return rows


def summary(rows: list[dict], budget_s: float) -> dict:
  out = {}
  for part in sorted({r["part"] for r in rows}):
    for mode in MODES:
      mine = [r for r in rows if r["part"] == part and r["mode"] == mode and r["exit"] == 0]
      if not mine:
        continue
      speeds = [r["tokens_per_sec"] for r in mine if r["tokens_per_sec"]]
      walls = [r["wall_s"] for r in mine]
      out[f"{part} {mode}"] = {
          "runs": len(mine), "median_tokens_per_sec": statistics.median(speeds) if speeds else None,
          "median_wall_s": statistics.median(walls),
          "max_budget_error": max(abs(w / budget_s - 1) for w in walls) if part == "budget" else None}
  for key, s in out.items():
    cli = out.get(key.split()[0] + " cli", {}).get("median_tokens_per_sec")
    s["vs_cli"] = round(s["median_tokens_per_sec"] / cli, 3) if cli and s["median_tokens_per_sec"] else None
  return out


def markdown(report: dict) -> str:
  m, by_label = report["machine"], report["load"]["sampler"]["by_label"]
  rows = []
  for r in report["runs"]:
    others = ((by_label.get(r["label"], {}).get("other_pct")) or {}).get("mean")
    rows.append([r["part"], r["mode"], r["round"], r["exit"], r["devices"], r["allocator"],
                 f"{r['tokens_per_sec']:,.0f}" if r["tokens_per_sec"] else "-", f"{r['wall_s']:.1f}",
                 f"{r['loadavg_before']:.1f}", "-" if others is None else f"{others:.0f}%"])
  sums = [[k, s["runs"], f"{s['median_tokens_per_sec']:,.0f}" if s["median_tokens_per_sec"] else "-",
           s["vs_cli"] or "-", f"{s['median_wall_s']:.1f}",
           "-" if s["max_budget_error"] is None else f"{100 * s['max_budget_error']:.1f}%"]
          for k, s in report["summary"].items()]
  return "\n".join([
      f"# The library path against the command line ({report['timestamp']})", "",
      f"- {reports.cpu_line(m)}; python {m['python']}, jax {m['versions']['jax']}",
      f"- commit {report['commit']}; nano {report['steps']} steps; budget {report['budget']} "
      f"(shakespeare_char, model.size=auto)", f"- load: {reports.load_line(report['load'])}", "",
      reports.markdown_table(["part mode", "runs", "median tok/s", "vs cli", "median wall s",
                              "largest wall vs budget"], sums), "",
      reports.markdown_table(["part", "mode", "round", "exit", "devices", "allocator", "tok/s",
                              "wall s", "loadavg before", "others' CPU"], rows), "",
      "cli: `python -m jaxtrain`, wall from spawn to exit; script: `import jaxtrain`, jax used, "
      "`jt.run`; script_jax_first: jax used, then `import jaxtrain`, `jt.run`; notebook: a "
      "Jupyter kernel running `import jaxtrain`, jax used, `jt.run`; the library's wall: `jt.run`'s "
      "call to its return. tok/s: the median of the run's logged readings. others' CPU: other "
      "processes' share of the machine over the run (a notebook's kernel, a grandchild of this "
      "script, counts there).", ""])


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--parts", default="speed,budget")
  p.add_argument("--data", default=None, help="the text file of configs/shakespeare_char.py")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--budget", default="45s")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  args.parts = args.parts.split(",")
  if "budget" in args.parts and not args.data:
    p.error("--data=PATH is needed for the budget part (Tiny Shakespeare)")
  machine = reports.machine_info()
  out = args.out or reports.results_dir(f"library-path-{reports.cpu_tag(machine)}")
  loadavg_before = os.getloadavg()
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-library-path-"))
  # Each process as a user starts it: no CPU device count of this one's own.
  env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
  env.update(PYTHONUNBUFFERED="1", JAXTRAIN_CACHE=str(scratch / "cache"),
             PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  try:
    warm_up(args, env, scratch)
    with common.LoadSampler(common.ours) as sampler:
      rows = measure(args, env, scratch, sampler)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  report = {"benchmark": "library-path", "timestamp": reports.timestamp(), "commit": commit,
            "machine": machine, "steps": args.steps, "budget": args.budget,
            "load": reports.load_record(loadavg_before, sampler, samples=True),
            "summary": summary(rows, fmt.parse_duration(args.budget)), "runs": rows}
  md = markdown(report)
  print("\n" + md)
  shown = {"speed": ("median tok/s", "median_tokens_per_sec"),
           "budget": (f"wall s (budget {args.budget})", "median_wall_s")}
  values = {f"{part}: {shown[part][0]}": {k.split()[1].replace("_", "\n"): s[shown[part][1]]
                                           for k, s in report["summary"].items() if k.startswith(part)}
            for part in args.parts}
  reports.write(out, "library_path", report, md, lambda path: reports.bar_chart(
      path, values, "", reports.machine_name(machine)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
