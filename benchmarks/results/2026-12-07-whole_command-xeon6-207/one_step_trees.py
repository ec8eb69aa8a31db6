"""Cold one-step nano commands of several source trees, in alternating rounds: wall, to the first
step's line, CPU, peak RSS and each run's phases (benchmarks/command_runs.py reads them).

    python one_step_trees.py ROUNDS LABEL=TREE [LABEL=TREE ...]

Each TREE is a checkout (a `git worktree` at a commit); each run gets a fresh HOME, as
whole_command.py's cold runs do. Prints a JSON line a run, then the medians.
"""

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

import command_runs as cr  # noqa: E402


def main() -> None:
  rounds, trees = int(sys.argv[1]), [t.split("=", 1) for t in sys.argv[2:]]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PYTHONUNBUFFERED": "1"}
  rows = {label: [] for label, _ in trees}
  scratch = Path(tempfile.mkdtemp(prefix="one-step-trees-"))
  for i in range(rounds):
    for label, path in trees if i % 2 == 0 else trees[::-1]:
      home = scratch / f"{label}-{i}"
      argv = [sys.executable, "-m", "jaxtrain", "--config=configs/nano.py", "--jax_platforms=cpu",
              f"--config.workdir={home}/run", "--config.headless=True",
              "--config.train.max_steps=1"]
      r = cr.check(cr.run(argv, Path(path), cr.fresh_home(dict(env, PYTHONPATH=path), home)), label)
      row = {"wall": r["wall_s"], "cpu": r["cpu_s"], "first": cr.at(r["lines"], cr.FIRST_STEP),
             "rss": r["max_rss_mib"], "phases": cr.jaxtrain_phases(r), "time": cr.summary_phases(r)}
      rows[label].append(row)
      print(label, json.dumps(row), flush=True)
  for label, runs in rows.items():
    print(label, "median wall", statistics.median(r["wall"] for r in runs), "first",
          statistics.median(r["first"] for r in runs), "cpu", statistics.median(r["cpu"] for r in runs))


if __name__ == "__main__":
  main()
