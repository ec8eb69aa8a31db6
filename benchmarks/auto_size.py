"""Proves `model.size=auto`: for each corpus and time budget, a grid of hand shapes trained with
that budget, one after another on this machine, against the shape jaxtrain chooses itself.

    python benchmarks/auto_size.py --data=shakespeare=tinyshakespeare.txt --budgets=1m,3m \
        --lock=/work/cpu.lock
    python benchmarks/auto_size.py --data=austen=pride_and_prejudice.txt --budgets=1m --auto-only
    python benchmarks/auto_size.py --report

Every run is a real `python -m jaxtrain` command of `--config` (configs/shakespeare_char.py: the
recipe whose architecture the rule was fitted on) with `--config.train.time_budget=B`, the hand
shapes as `--config.model.n_layers/d_model/n_heads` overrides (the recipe's context, batch and
learning rates), the auto pick as `--config.model.size=auto`. Wall time counts from spawning the
command to its exit. With `--lock`, each run holds that file's exclusive lock (taken before its
clock starts), so runs of other programs that share the lock do not overlap it. Each run's
record (final val bits per byte, steps, params, tokens and epochs, wall time, the other
processes' share of the machine meanwhile, the choice's lines) is appended to runs.jsonl in
--out as it finishes, and a run already there is not run again, so a grid can be run in parts.
`--report` writes auto_size.{json,md,png} from runs.jsonl: per budget and corpus, the auto pick
against the grid's best shape, and val bits per byte against the budget.

Every run starts from an empty XLA compile cache (a user's first run of a shape; the chooser
counts compiles as cold); the tokenized corpora and the speed probe (`measure/speed_probe.py`)
come from --cache, measured once before the runs.
"""

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

from jaxtrain.measure import size_rule  # noqa: E402
from jaxtrain.system import fmt  # noqa: E402

NAME = "auto_size"
SHAPES = "2x64,2x96,2x128,3x128,4x192,6x256"  # layers x width; heads of 32 below 192, else 64
AUTO = "auto"
PROBED: list[str] = []  # the corpora whose speed probe this process ran


def fixed_steps(budget: str) -> int | None:
  """A "budget" of N steps ("1400steps"): a fit point, not timed (run under the shared lock)."""
  return int(budget.removesuffix("steps")) if budget.endswith("steps") else None


def run_args(shape: str, budget: str, data: str, args) -> list[str]:
  steps = fixed_steps(budget)
  length = f"--config.train.max_steps={steps}" if steps else f"--config.train.time_budget={budget}"
  base = [f"--config={args.config}", f"--config.data.path={data}", length, *args.extra]
  if shape == AUTO:
    return [*base, "--config.model.size=auto"]
  layers, width = map(int, shape.split("x"))
  return [*base, f"--config.model.n_layers={layers}", f"--config.model.d_model={width}",
          f"--config.model.n_heads={size_rule.heads(width)}"]


def one_run(shape: str, budget: str, corpus: str, data: str, args) -> dict:
  """One budgeted command, timed from spawn to exit, with the machine's load meanwhile."""
  scratch = Path(tempfile.mkdtemp(prefix="auto-size-"))
  workdir, xla = scratch / "run", scratch / "xla"
  cmd = [sys.executable, "-m", "jaxtrain", *run_args(shape, budget, data, args),
         "--jax_platforms=cpu", f"--config.workdir={workdir}", "--config.headless=True",
         "--config.sample.num_samples=0"]
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAXTRAIN_CACHE=str(args.cache),
             JAX_COMPILATION_CACHE_DIR=str(xla))
  lock = open(args.lock, "a") if args.lock else None
  try:
    if lock:
      fcntl.flock(lock, fcntl.LOCK_SH if fixed_steps(budget) else fcntl.LOCK_EX)
    load_before = os.getloadavg()[0]
    with common.LoadSampler(common.ours) as sampler:
      t0 = time.perf_counter()
      proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
      out = [line.rstrip("\n") for line in proc.stdout]
      proc.wait()
      wall = time.perf_counter() - t0
  finally:
    if lock:
      lock.close()
  row = {"corpus": corpus, "data": data, "budget": budget,
         "budget_s": None if fixed_steps(budget) else fmt.parse_duration(budget),
         "shape": shape, "exit": proc.returncode, "wall_s": round(wall, 2),
         "loadavg_before": round(load_before, 2), "load": sampler.summary()["all"],
         "time": reports.timestamp(), "command": " ".join(cmd[1:]),
         "choice": [line for line in out if line.startswith(("model.size=auto", "  "))][:12],
         "error": next((line for line in out if line.startswith("error:")), None)}
  row.update(_outcome(workdir, out))
  said = re.search(r"^model\.size=auto: .*?params, (\S+) tokens = .*?predicted val ([\d.]+)",
                   "\n".join(out), re.M)
  if said:  # what the rule predicted, against what the run then trained and reached
    row.update(predicted_tokens=_count(said[1]), predicted_bpb=float(said[2]))
  row["timing"] = [line for line in out if line.startswith(("time budget", "time:"))]
  if proc.returncode:
    row["tail"] = out[-15:]
  shutil.rmtree(scratch, ignore_errors=True)
  return row


def _count(text: str) -> float:
  """A count as the run prints it (fmt.count): 235.87k, 1.00M."""
  scale = {"k": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}.get(text[-1], 1.0)
  return float(text.rstrip("kMBG")) * scale


def _outcome(workdir: Path, out: list[str]) -> dict:
  """The run's final val loss and bits per byte, and what it trained (config.json; the params
  and the train split's tokens as its first lines say them)."""
  metrics = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()] \
      if (workdir / "metrics.jsonl").exists() else []
  evals = [x for x in metrics if "val_loss" in x]
  if not evals or not (workdir / "config.json").exists():
    return {}
  cfg = json.loads((workdir / "config.json").read_text())
  m, t = cfg["model"], cfg["train"]
  tokens = t["max_steps"] * t["batch_size"] * t["grad_accum"] * m["seq_len"]
  said = "\n".join(out)
  params = re.search(r"^model: (\S+) params", said, re.M)
  train = re.search(r"\(train (\S+), val", said)
  vocab = re.search(r" vocab (\d+),", said)
  return {"final_val": evals[-1]["val_loss"], "val_bpb": evals[-1].get("val_bpb"),
          "best_val": min(x["val_loss"] for x in evals), "steps": t["max_steps"],
          "layers": m["n_layers"], "width": m["d_model"], "n_heads": m["n_heads"],
          "seq_len": m["seq_len"], "batch_size": t["batch_size"], "tokens": tokens,
          "matrix_lr": cfg["optim"]["matrix_lr"], "lr": cfg["optim"]["lr"],
          "params": _count(params[1]) if params else None, "vocab": int(vocab[1]) if vocab else None,
          "train_tokens": _count(train[1]) if train else None,
          "epochs": tokens / _count(train[1]) if train else None}


def probe(data: str, args) -> None:
  """The speed probe of the auto pick's architecture, under the lock, before any auto run: a dry
  run with model.size=auto measures it into --cache (once; later runs read it). Its budget, an
  hour, gives the probe the share of time it needs for every shape."""
  cmd = [sys.executable, "-m", "jaxtrain", *run_args(AUTO, "1h", data, args), "--dry_run",
         "--jax_platforms=cpu", f"--config.workdir={tempfile.mkdtemp(prefix='auto-size-')}/run"]
  lock = open(args.lock, "a") if args.lock else None
  try:
    if lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
    t = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, JAXTRAIN_CACHE=str(args.cache)),
                         capture_output=True, text=True)
  finally:
    if lock:
      lock.close()
  said = [line for line in res.stdout.splitlines() if "model.size=auto" in line]
  reports.log(f"probe and dry run: {time.perf_counter() - t:.1f} s, exit {res.returncode}; "
              + " | ".join(said[:2]) + res.stderr[-1000:])


def runs_file(args) -> Path:
  return Path(args.out) / "runs.jsonl"


def done(args) -> list[dict]:
  path = runs_file(args)
  return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def grid(args) -> None:
  """Every corpus x budget x shape not in runs.jsonl yet: the hand shapes, then the auto pick."""
  have = {(r["corpus"], r["budget"], r["shape"]) for r in done(args) if r["exit"] == 0}
  shapes = ([] if args.auto_only else args.shapes.split(",")) + ([] if args.no_auto else [AUTO])
  if args.auto_first:
    shapes = sorted(shapes, key=lambda s: s != AUTO)
  Path(args.out).mkdir(parents=True, exist_ok=True)
  for budget in args.budgets.split(","):
    for spec in args.data:
      corpus, _, data = spec.partition("=")
      for shape in shapes:
        if (corpus, budget, shape) in have:
          continue
        if shape == AUTO and not PROBED:
          PROBED.append(corpus)
          probe(data, args)
        row = one_run(shape, budget, corpus, data, args)
        with runs_file(args).open("a") as f:
          f.write(json.dumps(row) + "\n")
        reports.log(f"{corpus} {budget} {shape}: val bpb {row.get('val_bpb')}, steps "
                    f"{row.get('steps')}, wall {row['wall_s']:.1f} s, exit {row['exit']}, "
                    f"others {row['load']['other_pct']['mean']}%" + (f"; {row['error']}"
                                                               if row["error"] else ""))


def summary(rows: list[dict]) -> list[dict]:
  """Per corpus and budget: the grid's best hand shape against the auto pick."""
  out = []
  for corpus in dict.fromkeys(r["corpus"] for r in rows):
    for budget in dict.fromkeys(r["budget"] for r in rows if r["corpus"] == corpus
                                and r["budget_s"]):
      here = [r for r in rows if (r["corpus"], r["budget"]) == (corpus, budget)
              and r["exit"] == 0 and r.get("val_bpb")]
      grid_rows = [r for r in here if r["shape"] != AUTO]
      auto = next((r for r in here if r["shape"] == AUTO), None)
      best = min(grid_rows, key=lambda r: r["val_bpb"], default=None)
      out.append({"corpus": corpus, "budget": budget, "shapes": len(grid_rows),
                  "best": best and best["shape"], "best_bpb": best and best["val_bpb"],
                  "auto": auto and f"{auto['layers']}x{auto['width']}",
                  "auto_bpb": auto and auto["val_bpb"],
                  "gap": round(auto["val_bpb"] / best["val_bpb"] - 1, 4) if auto and best
                  else None})
  return out


def _pick(r: dict) -> str:
  return (f"{r['layers']}x{r['width']}, {r['n_heads']} heads, T {r['seq_len']}, B "
          f"{r['batch_size']}, {fmt.count(r['params'])} params, {r['epochs']:.1f} epochs")


def markdown(rows: list[dict], table: list[dict], machine: dict) -> str:
  lines = [f"# model.size=auto against hand shapes at equal time budgets ({reports.timestamp()})",
           "", reports.cpu_line(machine), "",
           "| corpus | budget | auto pick | auto bpb | grid best | best bpb | auto/best - 1 | "
           "shapes |", "|---|---|---|---|---|---|---|---|"]
  for s in table:
    auto = next((r for r in rows if (r["corpus"], r["budget"], r["shape"]) ==
                 (s["corpus"], s["budget"], AUTO) and r["exit"] == 0), None)
    gap = f"{100 * s['gap']:+.2f}%" if s["gap"] is not None else "-"
    num = lambda x: f"{x:.4f}" if x else "-"
    lines.append(f"| {s['corpus']} | {s['budget']} | {_pick(auto) if auto else '-'} | "
                 f"{num(s['auto_bpb'])} | {s['best'] or '-'} | {num(s['best_bpb'])} | {gap} "
                 f"| {s['shapes']} |")
  lines += ["", "Every run (others: the other processes' share of the machine during it):", "",
            "| corpus | budget | shape | params | steps | tokens | epochs | val bpb | val loss | "
            "wall s | others | exit |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    ok = r["exit"] == 0 and r.get("steps")
    lines.append(
        f"| {r['corpus']} | {r['budget']} | {r['shape']}"
        + (f" ({r['layers']}x{r['width']})" if ok and r["shape"] == AUTO else "")
        + (f" | {fmt.count(r['params'])} | {r['steps']} | {fmt.count(r['tokens'])} | "
           f"{r['epochs']:.1f} | {r['val_bpb']:.4f} | {r['final_val']:.4f}" if ok
           else " | - | - | - | - | - | -")
        + f" | {r['wall_s']:.1f} | {r['load']['other_pct']['mean']}% | {r['exit']} |")
  return "\n".join(lines) + "\n"


def chart(rows: list[dict], path: Path) -> None:
  """Val bits per byte against the budget: a line per hand shape and the auto pick, per corpus."""
  plt = reports.pyplot()
  corpora = list(dict.fromkeys(r["corpus"] for r in rows))
  fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 4.5), squeeze=False)
  for ax, corpus in zip(axes[0], corpora):
    mine = [r for r in rows if r["corpus"] == corpus and r["exit"] == 0 and r.get("val_bpb")
            and r["budget_s"]]
    for i, shape in enumerate(dict.fromkeys(r["shape"] for r in mine)):
      pts = sorted((r["budget_s"] / 60, r["val_bpb"]) for r in mine if r["shape"] == shape)
      ax.plot(*zip(*pts), marker="o", label=shape, color="black" if shape == AUTO else f"C{i}",
              linewidth=2.5 if shape == AUTO else 1.2)
    ax.set_xscale("log")
    ax.set_xlabel("time budget (min, whole command)")
    ax.set_ylabel("final val bits per byte")
    ax.set_title(corpus)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def report(args) -> None:
  rows = done(args)
  machine = reports.machine_info()
  table = summary(rows)
  reports.write(args.out, NAME, {"machine": machine, "summary": table, "runs": rows},
                markdown(rows, table, machine), lambda p: chart(rows, p))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data", action="append", default=[], help="NAME=PATH of a text (repeatable)")
  p.add_argument("--budgets", default="1m,3m,10m")
  p.add_argument("--shapes", default=SHAPES, help="hand shapes, LAYERSxWIDTH")
  p.add_argument("--config", default="configs/shakespeare_char.py")
  p.add_argument("--auto-only", action="store_true", help="the auto pick alone")
  p.add_argument("--no-auto", action="store_true", help="the hand shapes alone")
  p.add_argument("--auto-first", action="store_true", help="the auto pick before the hand shapes")
  p.add_argument("--lock", default="", help="hold this file's exclusive lock through each run")
  p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "jaxtrain-auto-size"),
                 help="JAXTRAIN_CACHE of the runs: token cache and speed probe")
  p.add_argument("--out", default=str(reports.results_dir(f"{NAME}-zen4")))
  p.add_argument("--report", action="store_true", help="only write the report from runs.jsonl")
  p.add_argument("--probe-only", action="store_true", help="only the speed probe (into --cache)")
  args, args.extra = p.parse_known_args()
  if args.probe_only:
    return probe(args.data[0].partition("=")[2], args)
  if not args.report:
    grid(args)
  report(args)


if __name__ == "__main__":
  main()
