"""Issue 60's misleading ablation, replayed small: nano with SwiGLU against GELU under one time
budget, where SwiGLU's compile was cached by an earlier run and GELU's was not.

1. unfair: an empty compile cache, a one-step SwiGLU run (its programs cached), then
   `jaxtrain.sweep --nocompile_ahead` of both under the budget: what compare says of it;
2. fair: another empty compile cache, and the sweep as it runs by default, every variant compiled
   before any timed run: what compare says then.

Each phase takes the lock file given (`--lock`, exclusively: the budgets are timings), and is kept
in --root once done (a rerun does the phase left). Writes ablation_replay.json and .md (each
phase's commands, compare's output, each run's steps, compile seconds and best val loss, the
machine and its load) into --out.

    python benchmarks/ablation_replay.py --root=runs/ablation --budget=75s --lock=/work/cpu.lock
"""

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reports  # noqa: E402

from jaxtrain.tools import runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--config.sample.num_samples=0", "--config.train.eval_every=100",
         "--config.train.checkpoint_every=100000", "--jax_platforms=cpu"]


def _run(cmd: list[str], env: dict, log) -> str:
  log(f"$ {' '.join(cmd[1:])}")
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  if out.returncode != 0:
    raise SystemExit(f"failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
  return out.stdout


def phase(name: str, root: Path, budget: str, cached_first: bool, lock: str | None) -> dict:
  """One sweep of mlp=swiglu,gelu under `budget`, from an empty compile cache (SwiGLU's programs
  cached first where `cached_first`), without (cached_first) or with compiles ahead."""
  with tempfile.TemporaryDirectory(prefix="jaxtrain-xla-") as xla, open(lock or os.devnull) as held:
    if lock:
      fcntl.flock(held, fcntl.LOCK_EX)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=xla, PYTHONUNBUFFERED="1")
    commands, t0, load = [], time.time(), os.getloadavg()
    if cached_first:
      warm = [sys.executable, "-m", "jaxtrain", "--config=nano", "--config.model.mlp=swiglu",
              "--config.train.max_steps=1", f"--config.workdir={root / 'earlier_swiglu'}", *SHORT]
      _run(warm, env, reports.log)
      commands.append(warm)
    sweep = [sys.executable, "-m", "jaxtrain.sweep", "--config=nano", "--sweep=model.mlp=swiglu,gelu",
             f"--root={root / name}", f"--config.train.time_budget={budget}", *SHORT,
             *(["--nocompile_ahead"] if cached_first else [])]
    out = _run(sweep, env, reports.log)
    commands.append(sweep)
  compared = out[out.index("\nrun ") + 1:] if "\nrun " in out else out
  reports.log(compared)
  rows = []
  for info in (runs.read(p) for p in sorted((root / name).iterdir()) if (p / "run.json").exists()):
    rows.append({"run": info.path.name, "steps": info.step, "compile_s": info.status.get("compile_s"),
                 "best_val": info.best("val_loss"), "final_val": info.final("val_loss"),
                 "evals": {r["step"]: r["val_loss"] for r in info.evals}})
  return {"name": name, "commands": [" ".join(c[1:]) for c in commands], "compare": compared,
          "runs": rows, "seconds": round(time.time() - t0, 1), "loadavg_before": load}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default="runs/ablation")
  parser.add_argument("--budget", default="75s")
  parser.add_argument("--lock", default=None, help="a lock file each phase holds exclusively")
  parser.add_argument("--out", default=str(ROOT / "benchmarks/results/2026-12-07-extensions"))
  args = parser.parse_args()
  root = Path(args.root).resolve()
  phases = []
  for name, cached_first in (("unfair", True), ("fair", False)):
    done = root / f"{name}.json"  # a phase once done is kept: a rerun does the other
    if not done.exists():
      shutil.rmtree(root / name, ignore_errors=True)
      done.parent.mkdir(parents=True, exist_ok=True)
      done.write_text(json.dumps(phase(name, root, args.budget, cached_first, args.lock)))
    phases.append(json.loads(done.read_text()))
  machine = reports.machine_info()
  md = [f"# SwiGLU against GELU under train.time_budget={args.budget}, nano", "",
        reports.cpu_line(machine), ""]
  for p in phases:
    md += [f"## {p['name']} ({p['seconds']} s, load average before {p['loadavg_before'][0]:.1f})", "",
           *(f"    $ {c}" for c in p["commands"]), "", "```", p["compare"].rstrip(), "```", "",
           "| run | steps | compile s | best val |", "|---|---|---|---|",
           *(f"| {r['run']} | {r['steps']} | {r['compile_s']} | {r['best_val']:.4f} |"
             for r in p["runs"]), ""]
  reports.write(args.out, "ablation_replay", {"machine": machine, "budget": args.budget,
                                              "phases": phases}, "\n".join(md))


if __name__ == "__main__":
  main()
