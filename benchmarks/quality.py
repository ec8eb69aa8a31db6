"""Validation loss against wall time: real `python -m jaxtrain` runs on one corpus, side by side.

Each run is a command line (a config file and overrides); it runs to its own `train.max_steps`,
or, with `--budget_s`, to as many steps as fit that wall time (measured by a short probe run of
the same command first: start-up, seconds per step and per eval). Wall time counts from the
command's start to its exit, start-up included. The report
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
import re
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
import reports  # noqa: E402

CHILDREN: list[int] = []  # the run going on, for the load sampler
# nanoGPT's CPU recipe for shakespeare_char, as its README gives it (eval_iters 20 to match ours,
# a log line per iteration for its speed, dropout 0 as in the README's line)
NANOGPT_BATCH, NANOGPT_BLOCK = 12, 64
NANOGPT_ARGS = ["train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
                "--eval_iters=20", "--log_interval=1", f"--block_size={NANOGPT_BLOCK}",
                f"--batch_size={NANOGPT_BATCH}", "--n_layer=4", "--n_head=4", "--n_embd=128",
                "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
NANOGPT_NAME = "nanoGPT itself"
PROBE_STEPS = 100


def run_once(args: list[str], data: str | None, seed: int, workdir: Path) -> dict:
  cmd = [sys.executable, "-m", "jaxtrain", "--jax_platforms=cpu", *args, f"--config.seed={seed}",
         *([f"--config.data.path={data}"] if data else []), f"--config.workdir={workdir}",
         "--config.headless=True", "--config.sample.num_samples=0"]
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
  bpb = [x["val_bpb"] for x in lines if x.get("val_bpb") is not None]
  train = [x for x in lines if x.get("tokens_per_sec")]
  return _result(wall, evals, final_bpb=bpb[-1] if bpb else None,
                 train_clock=[(x["step"], x["elapsed_s"]) for x in train],
                 tokens_per_sec=statistics.median(x["tokens_per_sec"] for x in train) if train
                 else None)


def _result(wall: float, evals: list[tuple], **more) -> dict:
  """One run's record from its wall time and its evaluations (elapsed s, step, val loss)."""
  return {"wall_s": wall, "final_val": evals[-1][2], "best_val": min(e[2] for e in evals),
          "steps": evals[-1][1], "evals": evals, **more}


def run_nanogpt(nanogpt_dir: Path, log: Path) -> dict:
  """nanoGPT's own CPU recipe in its checkout (data/shakespeare_char prepared there): val loss
  against wall time from its printed evals, tokens/s from its per-iteration times."""
  if not (nanogpt_dir / "data/shakespeare_char/train.bin").is_file():
    raise SystemExit(f"error: {nanogpt_dir}/data/shakespeare_char/train.bin is missing; run "
                     "python data/shakespeare_char/prepare.py there first")
  start, evals, iter_ms = time.perf_counter(), [], []
  with log.open("w") as out:
    proc = subprocess.Popen([sys.executable, *NANOGPT_ARGS], cwd=nanogpt_dir, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    CHILDREN[:] = [proc.pid]
    for line in proc.stdout:
      out.write(line)
      if m := re.match(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", line):
        evals.append((time.perf_counter() - start, int(m[1]), float(m[2])))
      elif (m := re.match(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", line)) and int(m[1]) > 0:
        iter_ms.append(float(m[2]))
  wall = time.perf_counter() - start
  CHILDREN.clear()
  if proc.wait() != 0 or not evals:
    raise RuntimeError(f"nanoGPT exited {proc.returncode}; its output: {log}")
  return _result(wall, [(t - evals[0][0], s, v) for t, s, v in evals], final_bpb=None,
                 tokens_per_sec=NANOGPT_BATCH * NANOGPT_BLOCK / (statistics.median(iter_ms) / 1000),
                 startup_s=evals[0][0])


def _field(args: list[str], field: str):
  """A config field's value for a run's command line: its override, else the config file's."""
  for arg in args:
    if arg.startswith(f"--config.{field}="):
      return int(arg.partition("=")[2])
  from jaxtrain.config import defaults as config
  from jaxtrain.config import validate as validation
  return validation.get(config.load_config(args[0].partition("=")[2]), field)


def steps_for_budget(args: list[str], data: str | None, budget_s: float, workdir: Path) -> tuple[int, dict]:
  """The `train.max_steps` that make a run of `args` end about `budget_s` after its start, from a
  probe run of PROBE_STEPS steps (its own eval at the end): start-up, step and eval seconds."""
  probe = run_once([*args, f"--config.train.max_steps={PROBE_STEPS}",
                    f"--config.train.eval_every={PROBE_STEPS}",
                    f"--config.train.log_every={PROBE_STEPS // 10}"], data, 0, workdir)
  # Seconds per step from the log lines' clocks past the first interval, which also holds the
  # first step's compile and the one-off matmul-peak measurement of the speed line.
  (s0, t0), (s1, t1) = probe["train_clock"][1], probe["train_clock"][-1]
  step_s = (t1 - t0) / (s1 - s0)
  trained, evaled = t1, probe["evals"][-1][0]
  eval_s = max(evaled - trained, 0.0)
  startup_s = probe["wall_s"] - evaled  # before the first step and after the last
  every = _field(args, "train.eval_every")
  steps = int((budget_s - startup_s) / (step_s + eval_s / every))
  if steps < 1:
    raise SystemExit(f"error: --budget_s={budget_s} is shorter than one step plus start-up "
                     f"({startup_s + step_s:.1f} s) for {' '.join(args)}")
  return steps, {"startup_s": startup_s, "step_s": step_s, "eval_s": eval_s, "steps": steps}


def plot(path: Path, results: dict) -> None:
  def curve(r: dict) -> tuple[list[float], list[float]]:
    # elapsed_s counts from the first step; shift by start-up so the x axis is wall time
    startup = r.get("startup_s", r["wall_s"] - r["evals"][-1][0])
    return [t + startup for t, _, _ in r["evals"]], [v for _, _, v in r["evals"]]

  reports.line_chart(path, {name: [curve(r) for r in runs] for name, runs in results.items()},
                     xlabel="wall time from command start (s)", ylabel="val loss")


def markdown(report: dict) -> str:
  rows = []
  for name, run in report["runs"].items():
    runs = run["results"]
    med = lambda key, runs=runs: statistics.median(r[key] for r in runs)
    bpb = [r["final_bpb"] for r in runs if r["final_bpb"] is not None]
    rows.append([name, f"{med('final_val'):.4f}", " ".join(f"{r['final_val']:.4f}" for r in runs),
                 f"{statistics.median(bpb):.4f}" if bpb else "-", runs[0]["steps"],
                 f"{med('tokens_per_sec'):,.0f}", f"{med('wall_s'):.1f}", " ".join(run["command"])])
  table = reports.markdown_table(["run", "final val (median)", "each seed", "val bpb", "steps",
                                 "tokens/s", "wall s (median)", "command"], rows)
  budget = report["budget_s"]
  steps = f"steps set to fit {budget:g} s each" if budget else "each config's own max_steps"
  corpus = report["data"] or "each config's own"
  return (f"# Val loss against wall time ({reports.timestamp()})\n\n"
          f"{reports.cpu_line(report['machine'])}\n{reports.load_line(report['load'])}\n\n"
          f"corpus: {corpus}; seeds: {report['seeds']};"
          f" {steps}\n\n{table}\n")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--run", action="append", required=True,
                  help='"name=config.py --config.x=y ...": one per configuration')
  ap.add_argument("--data", default=None,
                  help="the corpus every run trains on (default: each config's own)")
  ap.add_argument("--seeds", type=int, default=1)
  ap.add_argument("--budget_s", type=float, default=None,
                  help="each run's wall-time budget: its max_steps is set to fit (default: its own)")
  ap.add_argument("--nanogpt", default=None, metavar="DIR",
                  help="also run nanoGPT's own CPU recipe from this karpathy/nanoGPT checkout, "
                       "interleaved with the others, for each seed")
  ap.add_argument("--name", default="quality")
  ap.add_argument("--out", default=None, help="default: benchmarks/results/<date>-<name>")
  opts = ap.parse_args()
  out = Path(opts.out) if opts.out else reports.results_dir(opts.name)
  out.mkdir(parents=True, exist_ok=True)
  specs = {}
  for spec in opts.run:
    name, _, command = spec.partition("=")
    config, *overrides = shlex.split(command)
    specs[name] = [f"--config={config}", *overrides]
  if opts.nanogpt:
    specs = {NANOGPT_NAME: [f"(in {opts.nanogpt})", "python", *NANOGPT_ARGS], **specs}
  results: dict[str, list[dict]] = {name: [] for name in specs}
  loadavg_before = os.getloadavg()
  probes, data = {}, opts.data and os.path.abspath(opts.data)
  with tempfile.TemporaryDirectory() as tmp, common.LoadSampler(lambda: list(CHILDREN)) as load:
    for name, args in specs.items() if opts.budget_s else ():
      if name == NANOGPT_NAME:
        continue
      steps, probes[name] = steps_for_budget(args, data, opts.budget_s, Path(tmp) / f"{name}-probe")
      args.append(f"--config.train.max_steps={steps}")
      print(f"{name}: {steps} steps fit {opts.budget_s:g} s ({probes[name]})", flush=True)
    for seed in range(opts.seeds):
      for name, args in specs.items():
        if name == NANOGPT_NAME:  # its seed is its own (1337); repeats measure its time
          r = run_nanogpt(Path(opts.nanogpt).resolve(), out / f"nanogpt_{seed}.log")
        else:
          r = run_once(args, data, seed, Path(tmp) / f"{name}-{seed}")
        results[name].append(r)
        print(f"{name} seed {seed}: val {r['final_val']:.4f} (best {r['best_val']:.4f}) after "
              f"{r['steps']} steps in {r['wall_s']:.1f} s", flush=True)
  load_summary = reports.load_record(loadavg_before, load)
  report = {"machine": reports.machine_info(), "load": load_summary, "seeds": opts.seeds,
            "data": opts.data, "budget_s": opts.budget_s, "probes": probes,
            "runs": {name: {"command": specs[name], "results": results[name]} for name in specs}}
  text = markdown(report)
  print(text)
  reports.write(out, "quality", report, text, chart=lambda path: plot(path, results))


if __name__ == "__main__":
  main()
