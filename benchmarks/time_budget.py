"""How close `python -m jaxtrain --config.train.time_budget=B` ends to B, from a cold compile cache
and from a warm one.

    python benchmarks/time_budget.py --data=/work/shared/data/tinyshakespeare.txt
    python benchmarks/time_budget.py --configs=nano --budgets=20s --rounds=1

For each config, budget and round: a cold run (an empty XLA compile cache) and then a warm one
(the cache the cold run left), each a real command in a new workdir. The tokenized corpus is
cached before any of them (tokenizing is a first-run cost of its own, not a compile). A run's wall
time is from spawning the process to its exit, as `time` measures it; its steps are the
train.max_steps of its config.json; the plan's line, each moved end (budget.json) and the run's
last lines are kept in the JSON. The target: every wall time within 5% of its budget. The
machine's load is sampled throughout, and each run's share of it reported beside it.
`--data`: the text file the configs that need one train on (configs/shakespeare_char.py:
Tiny Shakespeare); nano reads the Python standard library. Extra `--config.*` arguments go to
every run. Writes time_budget.{json,md,png} to --out (default:
benchmarks/results/<date>-time-budget/).
"""

import argparse
import json
import os
import re
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

NAME = "time-budget"
TARGET = 0.05  # |wall - budget| / budget
PLAN = re.compile(r"time budget \S+: train\.max_steps=(\d+) fit .*?(\d+\.\d+)s spent so far")
FIRST_STEP = re.compile(r"compiled and ran the first step in (\d+\.\d+)s")


def command(config: str, workdir: Path, args, extra: list[str]) -> list[str]:
  data = [f"--config.data.path={args.data}"] if "shakespeare" in config and args.data else []
  return [sys.executable, "-m", "jaxtrain", f"--config={config}", "--jax_platforms=cpu",
          f"--config.workdir={workdir}", "--config.headless=True", *data, *extra]


def environ(scratch: Path, xla: Path) -> dict:
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAXTRAIN_CACHE=str(scratch / "cache"),
             JAX_COMPILATION_CACHE_DIR=str(xla))
  return env


def tokenize(config: str, scratch: Path, args, extra: list[str]) -> None:
  """The corpus tokenized into the shared token cache, by a one-step run whose compile cache is
  thrown away."""
  xla = scratch / "xla-tokenize"
  res = subprocess.run(command(config, scratch / "tokenize", args,
                               [*extra, "--config.train.max_steps=1",
                                "--config.sample.num_samples=0"]),
                       cwd=ROOT, env=environ(scratch, xla), capture_output=True, text=True)
  if res.returncode:
    raise SystemExit(f"error: {config}: the tokenizing run failed:\n{res.stdout[-2000:]}"
                     f"{res.stderr[-2000:]}")
  shutil.rmtree(xla, ignore_errors=True)
  shutil.rmtree(scratch / "tokenize", ignore_errors=True)


def one_run(config: str, budget: str, state: str, xla: Path, scratch: Path, args,
            extra: list[str]) -> dict:
  """One budgeted command, timed from spawn to exit."""
  workdir = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
  shutil.rmtree(workdir)  # a new run's workdir does not exist yet
  cmd = command(config, workdir, args, [*extra, f"--config.train.time_budget={budget}"])
  t0 = time.perf_counter()
  res = subprocess.run(cmd, cwd=ROOT, env=environ(scratch, xla), capture_output=True, text=True)
  wall = time.perf_counter() - t0
  budget_s = fmt.parse_duration(budget)
  out = res.stdout + res.stderr
  plan, first = PLAN.search(out), FIRST_STEP.search(out)
  row = {"config": config, "budget": budget, "budget_s": budget_s, "cache": state,
         "exit": res.returncode, "wall_s": round(wall, 2),
         "wall_over_budget": round(wall / budget_s, 4),
         "within_target": abs(wall / budget_s - 1) <= TARGET,
         "planned_steps": int(plan.group(1)) if plan else None,
         "spent_at_plan_s": float(plan.group(2)) if plan else None,
         "first_step_after_s": float(first.group(1)) if first else None,
         "error": next((line for line in out.splitlines() if line.startswith("error:")), None),
         "tail": out.splitlines()[-12:]}
  if (workdir / "config.json").exists():
    row["steps"] = json.loads((workdir / "config.json").read_text())["train"]["max_steps"]
  if (workdir / "budget.json").exists():
    row["ends"] = json.loads((workdir / "budget.json").read_text())["ends"]
  shutil.rmtree(workdir, ignore_errors=True)
  return row


def measure(args, extra: list[str], scratch: Path, sampler: common.LoadSampler) -> list[dict]:
  """Every config, budget and round: cold, then warm on the cache the cold run left."""
  rows = []
  for config in args.configs:
    for r in range(args.rounds):
      for budget in args.budgets:
        xla = scratch / f"xla-{Path(config).stem}-{budget}-{r}"
        for state in ("cold", "warm"):
          sampler.label = f"{config} {budget} {state} {r}"
          load_before = os.getloadavg()[0]
          row = one_run(config, budget, state, xla, scratch, args, extra)
          row.update(round=r, loadavg_before=round(load_before, 2), label=sampler.label)
          rows.append(row)
          reports.log(f"{config} {budget} {state}: wall {row['wall_s']:.1f} s "
                      f"({100 * (row['wall_over_budget'] - 1):+.1f}%), steps {row.get('steps')}, "
                      f"exit {row['exit']}, loadavg {load_before:.1f}"
                      + (f"; {row['error']}" if row["error"] else ""))
        shutil.rmtree(xla, ignore_errors=True)
  return rows


def markdown(report: dict) -> str:
  m = report["machine"]
  by_label = report["load"]["sampler"]["by_label"]
  rows = []
  for row in report["runs"]:
    share = by_label.get(row["label"], {})
    others = (share.get("other_pct") or {}).get("mean")
    ends = " -> ".join(f"{end}@{start}" for start, end in row.get("ends", []))
    rows.append([row["config"], row["budget"], row["cache"], f"{row['wall_s']:.1f}",
                 f"{100 * (row['wall_over_budget'] - 1):+.1f}%",
                 "yes" if row["within_target"] else "NO", row.get("steps", "-"),
                 row["spent_at_plan_s"] if row["spent_at_plan_s"] is not None else "-",
                 ends or (row["error"] or "-")[:90], f"{row['loadavg_before']:.1f}",
                 "-" if others is None else f"{others:.0f}%"])
  met = sum(r["within_target"] for r in report["runs"])
  return "\n".join([
      f"# Time budgets: wall time against budget ({report['timestamp']})", "",
      f"- {reports.cpu_line(m)}; python {m['python']}, jax {m['versions']['jax']}",
      f"- commit {report['commit']}; extra arguments: {' '.join(report['extra']) or 'none'}",
      f"- load: {reports.load_line(report['load'])}",
      f"- within {TARGET:.0%} of the budget: {met} of {len(report['runs'])} runs", "",
      reports.markdown_table(
          ["config", "budget", "compile cache", "wall s", "vs budget", "within 5%", "steps",
           "spent at plan s", "ends (end@from step)", "loadavg before", "others' CPU"], rows), "",
      "wall: spawn to exit of `python -m jaxtrain ... --config.train.time_budget=B`; cold: an "
      "empty XLA compile cache (the tokenized corpus cached); warm: the cache the cold run just "
      "left. steps: the run's train.max_steps; spent at plan: the seconds of the budget used when "
      "the plan was made (start-up, compiles, the measurement); ends: budget.json, each end with "
      "the step it took over at; others' CPU: other processes' share of the machine during the "
      "run (LoadSampler).", ""])


def chart(report: dict, path: Path) -> None:
  plt = reports.pyplot()
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  configs = sorted({r["config"] for r in report["runs"]})
  for i, config in enumerate(configs):
    for state, marker in (("cold", "o"), ("warm", "s")):
      for trained, shape in ((True, marker), (False, "x")):
        runs = [r for r in report["runs"] if r["config"] == config and r["cache"] == state
                and (r["exit"] == 0) == trained]
        if runs:
          ax.scatter([r["budget_s"] for r in runs],
                     [100 * (r["wall_over_budget"] - 1) for r in runs], marker=shape,
                     color=f"C{i}", label=f"{Path(config).stem}, {state} cache"
                     + ("" if trained else ": too short (exit 2)"))
  ax.axhspan(-100 * TARGET, 100 * TARGET, color="green", alpha=0.1, label="within 5%")
  ax.axhline(0, color="gray", lw=0.8)
  ax.set_xscale("log")
  budgets = sorted({r["budget_s"] for r in report["runs"]})
  ax.set_xticks(budgets, [fmt.duration(b) for b in budgets])
  ax.minorticks_off()
  ax.set_xlabel("time budget")
  ax.set_ylabel("wall time vs budget, %")
  ax.set_title(reports.machine_name(report["machine"]), fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default="configs/shakespeare_char.py,configs/nano.py",
                 help="comma-separated config files")
  p.add_argument("--budgets", default="20s,45s,2m", help="comma-separated time budgets")
  p.add_argument("--data", default=None, help="the text file of configs/shakespeare_char.py")
  p.add_argument("--rounds", type=int, default=1, help="cold and warm runs of each, this often")
  p.add_argument("--out", default=None,
                 help=f"output directory (default: benchmarks/results/<date>-{NAME}/)")
  args, extra = p.parse_known_args(argv)
  bad = [a for a in extra if not a.startswith("--config.")]
  if bad:
    p.error(f"unrecognized arguments {bad}; only --config.* overrides are passed on")
  args.configs, args.budgets = args.configs.split(","), args.budgets.split(",")
  if any("shakespeare" in c for c in args.configs) and not args.data:
    p.error("--data=PATH is needed for configs/shakespeare_char.py (Tiny Shakespeare)")
  if any(fmt.parse_duration(b) is None for b in args.budgets):
    p.error(f"--budgets={','.join(args.budgets)}: each must be a duration, e.g. 45s or 2m")
  args.out = args.out or str(reports.results_dir(NAME))
  return args, extra


def main(argv: list[str] | None = None) -> int:
  args, extra = parse_args(argv)
  loadavg_before = os.getloadavg()
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-time-budget-"))
  try:
    for config in args.configs:
      tokenize(config, scratch, args, extra)
    with common.LoadSampler(common.ours) as sampler:
      rows = measure(args, extra, scratch, sampler)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip()
  walls = [abs(r["wall_over_budget"] - 1) for r in rows]
  report = {"benchmark": NAME, "timestamp": reports.timestamp(), "configs": args.configs,
            "budgets": args.budgets, "rounds": args.rounds, "extra": extra,
            "commit": commit + (" + uncommitted changes" if dirty else ""),
            "machine": reports.machine_info(), "target": TARGET,
            "load": reports.load_record(loadavg_before, sampler, samples=True),
            "summary": {"runs": len(rows), "within_target": sum(r["within_target"] for r in rows),
                        "median_abs_error": round(statistics.median(walls), 4),
                        "max_abs_error": round(max(walls), 4)},
            "runs": rows}
  md = markdown(report)
  print("\n" + md)
  reports.write(args.out, "time_budget", report, md, lambda path: chart(report, path))
  return 0


if __name__ == "__main__":
  sys.exit(main())
