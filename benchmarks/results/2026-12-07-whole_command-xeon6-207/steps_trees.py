"""Tokens/s of warm `--config.train.max_steps=STEPS` nano commands of several source trees, in
alternating rounds (each tree's HOME warmed by one run first): the median of each run's logged
steps (metrics.jsonl), and the medians over the rounds.

    python steps_trees.py ROUNDS STEPS LABEL=TREE [LABEL=TREE ...]
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
  rounds, steps, trees = int(sys.argv[1]), int(sys.argv[2]), [t.split("=", 1) for t in sys.argv[3:]]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PYTHONUNBUFFERED": "1"}
  scratch = Path(tempfile.mkdtemp(prefix="steps-trees-"))
  rates = {label: [] for label, _ in trees}
  for i in range(-1, rounds):  # round -1 warms each HOME's caches
    for label, path in trees if i % 2 == 0 else trees[::-1]:
      home = scratch / label
      work = home / f"run{i}"
      argv = [sys.executable, "-m", "jaxtrain", "--config=configs/nano.py", "--jax_platforms=cpu",
              f"--config.workdir={work}", "--config.headless=True",
              f"--config.train.max_steps={steps}", f"--config.train.eval_every={steps}"]
      r = cr.check(cr.run(argv, Path(path), cr.fresh_home(dict(env, PYTHONPATH=path), home)), label)
      rate = cr.metrics_tokens_per_s(work)
      if i >= 0:
        rates[label].append(rate)
      print(label, i, json.dumps({"tokens_per_s": rate, "wall": r["wall_s"]}), flush=True)
  for label, values in rates.items():
    print(label, "median tokens/s", round(statistics.median(values)), [round(v) for v in values])


if __name__ == "__main__":
  main()
