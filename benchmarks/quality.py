"""Validation loss against wall time: real `python -m jaxtrain` runs on one corpus, side by side.

Each run is a command line (a config file and overrides); it runs to its own `train.max_steps`,
and its wall time counts from the command's start to its exit, start-up included. The report
has each run's final and best val loss, steps, tokens/s and wall time, medians over seeds, and a
plot of val loss against time. Runs go one after another, never together, so each has the
machine to itself; the background load is sampled and recorded.

    python benchmarks/quality.py --data=../shared/data/tinyshakespeare.txt --seeds=1 \
        --run "nanogpt_layout=configs/shakespeare_char_nanogpt.py" \
        --run "recipe=configs/shakespeare_char.py" \
        --run "recipe_adamw=configs/shakespeare_char.py --config.optim.name=adamw"
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402  (after the path above)

CHILDREN: list[int] = []  # the run going on, for the load sampler


def run_once(args: list[str], data: str, seed: int, workdir: Path) -> dict:
  cmd = [sys.executable, "-m", "jaxtrain", "--jax_platforms=cpu", *args, f"--config.seed={seed}",
         f"--config.data.path={data}", f"--config.workdir={workdir}", "--config.headless=True",
         "--config.sample.num_samples=0"]
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  CHILDREN[:] = [proc.pid]
  _, stderr = proc.communicate()
  wall = time.perf_counter() - start
  CHILDREN.clear()
  if proc.returncode != 0:
    raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}: {stderr[-2000:]}")
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  evals = [(x["elapsed_s"], x["step"], x["val_loss"]) for x in lines if "val_loss" in x]
  train = [x for x in lines if x.get("tokens_per_sec")]
  return {"wall_s": wall, "final_val": evals[-1][2], "best_val": min(e[2] for e in evals),
          "steps": evals[-1][1], "evals": evals,
          "tokens_per_sec": statistics.median(x["tokens_per_sec"] for x in train) if train else None}


def plot(path: Path, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, runs in results.items():
    for i, r in enumerate(runs):
      # elapsed_s counts from the first step; shift by start-up so the x axis is wall time
      startup = r["wall_s"] - r["evals"][-1][0]
      ax.plot([t + startup for t, _, _ in r["evals"]], [v for _, _, v in r["evals"]],
              label=name if i == 0 else None, color=f"C{list(results).index(name)}", alpha=0.8)
  ax.set_xlabel("wall time from command start (s)")
  ax.set_ylabel("val loss")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--run", action="append", required=True,
                  help='"name=config.py --config.x=y ...": one per configuration')
  ap.add_argument("--data", required=True, help="the corpus every run trains on")
  ap.add_argument("--seeds", type=int, default=1)
  ap.add_argument("--name", default="quality")
  ap.add_argument("--out", default=None, help="default: benchmarks/results/<date>-<name>")
  opts = ap.parse_args()
  out = Path(opts.out) if opts.out else common.results_dir(opts.name)
  out.mkdir(parents=True, exist_ok=True)
  specs = {}
  for spec in opts.run:
    name, _, command = spec.partition("=")
    config, *overrides = shlex.split(command)
    specs[name] = [f"--config={config}", *overrides]
  results: dict[str, list[dict]] = {name: [] for name in specs}
  loadavg_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as tmp, common.LoadSampler(lambda: list(CHILDREN)) as load:
    for seed in range(opts.seeds):
      for name, args in specs.items():
        r = run_once(args, os.path.abspath(opts.data), seed, Path(tmp) / f"{name}-{seed}")
        results[name].append(r)
        print(f"{name} seed {seed}: val {r['final_val']:.4f} (best {r['best_val']:.4f}) after "
              f"{r['steps']} steps in {r['wall_s']:.1f} s", flush=True)
  load_summary = {"loadavg_before": loadavg_before, "loadavg_after": os.getloadavg(),
                  "sampler": load.summary()}
  rows = []
  for name, runs in results.items():
    med = lambda key, runs=runs: statistics.median(r[key] for r in runs)
    rows.append([name, f"{med('final_val'):.4f}", f"{med('best_val'):.4f}", runs[0]["steps"],
                 f"{med('tokens_per_sec'):,.0f}", f"{med('wall_s'):.1f}",
                 " ".join(specs[name])])
  machine = common.machine_info()
  report = {"machine": machine, "load": load_summary, "seeds": opts.seeds, "data": opts.data,
            "runs": {name: {"command": specs[name], "results": results[name]} for name in specs}}
  (out / "quality.json").write_text(json.dumps(report, indent=1))
  table = common.markdown_table(["run", "final val (median)", "best val", "steps", "tokens/s",
                                 "wall s (median)", "command"], rows)
  text = (f"# Val loss against wall time ({common.timestamp()})\n\n{common.cpu_line(machine)}\n"
          f"{common.load_line(load_summary)}\n\ncorpus: {opts.data}; seeds: {opts.seeds}\n\n"
          f"{table}\n")
  (out / "quality.md").write_text(text)
  plot(out / "quality.png", results)
  print(text)
  print(f"wrote {out}/quality.json, quality.md, quality.png")


if __name__ == "__main__":
  main()
