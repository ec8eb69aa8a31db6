"""Proves `model.size=auto`: for each corpus and time budget, the shapes people pick by hand (the
CPU tiers, the recipe's own shape, a grid of LAYERSxWIDTH) trained with that budget, one after
another on this machine, against the shape jaxtrain chooses itself.

    python benchmarks/auto_size.py --data=shakespeare=tinyshakespeare.txt --data=code= \
        --tokenizer=code=byte --budgets=5m --shapes=tiny,recipe,auto --seeds=0,1 \
        --lock=/work/cpu.lock --commit
    python benchmarks/auto_size.py --data=austen=pride_and_prejudice.txt --budgets=1m --auto-only
    python benchmarks/auto_size.py --report

Every run is a real `python -m jaxtrain` command of `--config` (configs/shakespeare_char.py: the
recipe whose architecture the rule was fitted on) with `--config.train.time_budget=B` and
`--config.seed=S`. A shape is `recipe` (the config's own), a tier of `TIERS` (depth, width, heads
of 64 and a BPE vocabulary: the sizes the public guide to training nanochat on a laptop CPU gives
per time), `LxW` (heads of 32 below width 192, else 64) or `auto` (`--config.model.size=auto`);
all keep the config's context, batch and learning rates. `--data=code=` is the default corpus,
the Python standard library's sources; `--tokenizer=NAME=TOK` is that corpus's tokenizer but for
the tiers and auto, which chooses its own (`byte` for the recipe's shape on the code). Wall time counts from
spawning the command to its exit. With `--lock`, each run holds that file's exclusive lock (taken
before its clock starts), so runs of other programs that share the lock do not overlap it. Each
run's record (final val bits per byte, steps, params, tokens and epochs, wall time, the other
processes' share of the machine meanwhile, the choice's lines) is appended to runs.jsonl in --out
as it finishes (marked `noisy`, and run again by the next call, where the others took more than
--max-others) (with `--commit`, committed there with the tables so far), and a run already there
is not run again, so a grid can be run in parts. `--report` writes auto_size.{json,md,png} from
runs.jsonl (benchmarks/auto_size_report.py).

Every run starts from an empty XLA compile cache (a user's first run of a shape; the chooser
counts compiles as cold); the tokenized corpora (BPE learned once) and the speed probe
(`measure/speed_probe.py`) come from --cache, made once before the runs (`prepare`, `probe`), or
with `--cold-cache` from an empty one too, as a first-time user's first run.
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import auto_size_report  # noqa: E402  (after the path above)
import common  # noqa: E402
import reports  # noqa: E402

from jaxtrain.measure import size_rule  # noqa: E402
from jaxtrain.system import fmt  # noqa: E402

NAME = "auto_size"
SHAPES = "2x64,2x96,2x128,3x128,4x192,6x256"  # layers x width; heads of 32 below 192, else 64
AUTO, RECIPE = "auto", "recipe"
# The CPU tiers people pick by hand (the nanochat laptop-CPU guide: ~5 min, ~30 min, 2-3 h, 8+ h):
# name -> (layers, width, BPE vocabulary); heads of 64.
TIERS = {"tiny": (4, 256, 512), "small": (6, 384, 2048), "medium": (8, 512, 4096),
         "large": (12, 768, 8192)}
PROBED: list[str] = []  # the corpora whose speed probe this process ran


def fixed_steps(budget: str) -> int | None:
  """A "budget" of N steps ("1400steps"): a fit point, not timed (run under the shared lock)."""
  return int(budget.removesuffix("steps")) if budget.endswith("steps") else None


def run_args(shape: str, budget: str, data: str, args, seed: int | None = None,
             tokenizer: str = "") -> list[str]:
  steps = fixed_steps(budget)
  length = f"--config.train.max_steps={steps}" if steps else f"--config.train.time_budget={budget}"
  base = [f"--config={args.config}", f"--config.data.path={data}", length, *args.extra]
  base += [f"--config.seed={seed}"] if seed is not None else []
  if shape in TIERS:
    layers, width, vocab = TIERS[shape]
    return [*base, f"--config.model.n_layers={layers}", f"--config.model.d_model={width}",
            f"--config.model.n_heads={width // 64}", "--config.data.tokenizer=bpe",
            f"--config.data.vocab_size={vocab}"]
  if shape == AUTO:  # the tokenizer is auto's to choose, as a user's command leaves it
    return [*base, "--config.model.size=auto"]
  base += [f"--config.data.tokenizer={tokenizer}"] if tokenizer else []
  if shape == RECIPE:
    return base
  layers, width = map(int, shape.split("x"))
  return [*base, f"--config.model.n_layers={layers}", f"--config.model.d_model={width}",
          f"--config.model.n_heads={size_rule.heads(width)}"]


def one_run(shape: str, budget: str, corpus: str, data: str, args, seed: int | None = None) -> dict:
  """One budgeted command, timed from spawn to exit, with the machine's load meanwhile."""
  scratch = Path(tempfile.mkdtemp(prefix="auto-size-"))
  workdir, xla = scratch / "run", scratch / "xla"
  tokenizer = args.tokenizers.get(corpus, "")
  cmd = [sys.executable, "-m", "jaxtrain", *run_args(shape, budget, data, args, seed, tokenizer),
         "--jax_platforms=cpu", f"--config.workdir={workdir}", "--config.headless=True",
         "--config.sample.num_samples=0"]
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=str(xla),
             JAXTRAIN_CACHE=str(scratch / "cache" if args.cold_cache else args.cache))
  budget_s = None if fixed_steps(budget) else fmt.parse_duration(budget)
  lock = open(args.lock, "a") if args.lock else None
  try:
    if lock:
      fcntl.flock(lock, fcntl.LOCK_SH if fixed_steps(budget) else fcntl.LOCK_EX)
    load_before = os.getloadavg()[0]
    with common.LoadSampler(common.ours) as sampler:
      t0 = time.perf_counter()
      proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
      # A run that hangs is stopped at 1.5x its budget and 5 minutes more.
      killer = threading.Timer(1.5 * (budget_s or 3600) + 300, proc.kill)
      killer.start()
      out = [line.rstrip("\n") for line in proc.stdout]
      proc.wait()
      killer.cancel()
      wall = time.perf_counter() - t0
  finally:
    if lock:
      lock.close()
  row = {"corpus": corpus, "data": data, "budget": budget, "budget_s": budget_s,
         "shape": shape, "seed": seed, "tokenizer_arg": tokenizer, "rev": args.rev,
         "cold_cache": args.cold_cache,
         "exit": proc.returncode, "wall_s": round(wall, 2),
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
  text = re.search(r"^data: .*?(\S+)B -> (\S+) \S+ tokens", said, re.M)  # bytes -> tokens
  return {"tokenizer": cfg["data"]["tokenizer"], "data_vocab": cfg["data"]["vocab_size"],
          "bytes_per_token": round(_count(text[1]) / _count(text[2]), 4) if text else None,
          "final_val": evals[-1]["val_loss"], "val_bpb": evals[-1].get("val_bpb"),
          "best_val": min(x["val_loss"] for x in evals), "steps": t["max_steps"],
          "layers": m["n_layers"], "width": m["d_model"], "n_heads": m["n_heads"],
          "seq_len": m["seq_len"], "batch_size": t["batch_size"], "tokens": tokens,
          "matrix_lr": cfg["optim"]["matrix_lr"], "lr": cfg["optim"]["lr"],
          "params": _count(params[1]) if params else None, "vocab": int(vocab[1]) if vocab else None,
          "train_tokens": _count(train[1]) if train else None,
          "epochs": tokens / _count(train[1]) if train else None}


def _dry_run(shape: str, corpus: str, data: str, args, exclusive: bool) -> str:
  """A dry run of `shape` with a budget of a day, its cache --cache, under the lock: what it
  prints. It reads (and so tokenizes and caches) the corpus; of `auto`, it measures the speed
  probe (a day repays every shape of it)."""
  cmd = [sys.executable, "-m", "jaxtrain",
         *run_args(shape, "24h", data, args, tokenizer=args.tokenizers.get(corpus, "")),
         "--dry_run", "--jax_platforms=cpu",
         f"--config.workdir={tempfile.mkdtemp(prefix='auto-size-')}/run"]
  lock = open(args.lock, "a") if args.lock else None
  try:
    if lock:
      fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    t = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, JAXTRAIN_CACHE=str(args.cache)),
                         capture_output=True, text=True)
  finally:
    if lock:
      lock.close()
  said = [line for line in res.stdout.splitlines() if line.startswith(("model.size=auto", "data:"))]
  reports.log(f"{corpus} {shape} dry run: {time.perf_counter() - t:.1f} s, exit {res.returncode}; "
              + " | ".join(said[:3]) + res.stderr[-1000:])
  return res.stdout


def prepare(args, shapes: list[str]) -> None:
  """Each corpus tokenized as its runs read it (a tier's BPE learned once), into --cache, under
  the shared lock (not timed): the runs' clocks count no tokenizing, as a rerun's would not."""
  for spec in args.data:
    corpus, _, data = spec.partition("=")
    for shape in dict.fromkeys(s if s in TIERS else RECIPE for s in shapes):
      _dry_run(shape, corpus, data, args, exclusive=False)


def probe(corpus: str, data: str, args) -> None:
  """The speed probe of the auto pick's architecture, under the exclusive lock, before any auto
  run: measured into --cache once, as a first run on quiet cores does; later runs read it."""
  _dry_run(AUTO, corpus, data, args, exclusive=True)


def runs_file(args) -> Path:
  return Path(args.out) / "runs.jsonl"


def done(args) -> list[dict]:
  path = runs_file(args)
  return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def commit(args, message: str) -> None:
  """runs.jsonl and the tables so far, committed in --out's repository (that path alone)."""
  out = Path(args.out).resolve()
  top = subprocess.run(["git", "-C", str(out), "rev-parse", "--show-toplevel"],
                       capture_output=True, text=True).stdout.strip()
  files = [str(p) for p in sorted(out.iterdir()) if p.is_file()]
  for _ in range(5):  # another git command in that checkout holds its index for a moment
    subprocess.run(["git", "-C", top, "add", *files], capture_output=True)
    res = subprocess.run(["git", "-C", top, "commit", "-q", "-m", message, "--", *files],
                         capture_output=True, text=True)
    if res.returncode == 0 or "nothing" in res.stdout + res.stderr:
      return
    time.sleep(3)
  reports.log(f"git commit failed: {res.stderr[-500:]}")


def grid(args) -> None:
  """Every budget x corpus x seed x shape not in runs.jsonl yet, in the order given (`auto`
  last unless --auto-first)."""
  have = {(r["corpus"], r["budget"], r["shape"], r.get("seed")) for r in done(args)
          if r["exit"] == 0 and not r.get("noisy")}
  shapes = ([] if args.auto_only else args.shapes.split(",")) + ([] if args.no_auto else [AUTO])
  shapes = list(dict.fromkeys(shapes))
  if args.auto_first:
    shapes = sorted(shapes, key=lambda s: s != AUTO)
  seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [None]
  Path(args.out).mkdir(parents=True, exist_ok=True)
  if not args.cold_cache:
    prepare(args, [s for s in shapes if s != AUTO])
  for budget in args.budgets.split(","):
    for seed in seeds:
      for spec in args.data:
        corpus, _, data = spec.partition("=")
        for shape in shapes:
          if (corpus, budget, shape, seed) in have:
            continue
          if shape == AUTO and corpus not in PROBED and not args.cold_cache:
            PROBED.append(corpus)
            probe(corpus, data, args)
          row = one_run(shape, budget, corpus, data, args, seed)
          # Other processes that took more than --max-others of the machine (they need not take
          # the lock): the run is kept, marked, and run again by the next call.
          row["noisy"] = bool(row["budget_s"]) and row["load"]["other_pct"]["mean"] > args.max_others
          with runs_file(args).open("a") as f:
            f.write(json.dumps(row) + "\n")
          said = (f"{corpus} {budget} {shape} seed {seed}: val bpb {row.get('val_bpb')}, steps "
                  f"{row.get('steps')}, wall {row['wall_s']:.1f} s, exit {row['exit']}, others "
                  f"{row['load']['other_pct']['mean']}%" + (f"; {row['error']}" if row["error"]
                                                             else ""))
          reports.log(said)
          if args.commit:
            report(args)
            commit(args, f"benchmarks/results: auto_size cell {said}")


def report(args) -> None:
  rows = done(args)
  machine = reports.machine_info()
  table = auto_size_report.summary(rows)
  reports.write(args.out, NAME, {"machine": machine, "summary": table, "runs": rows},
                auto_size_report.markdown(rows, table, machine),
                lambda p: auto_size_report.chart(rows, p))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data", action="append", default=[],
                 help="NAME=PATH of a text (repeatable; NAME= the Python standard library)")
  p.add_argument("--tokenizer", action="append", default=[],
                 help="NAME=TOKENIZER: that corpus's tokenizer for all but the tiers (repeatable)")
  p.add_argument("--budgets", default="1m,3m,10m")
  p.add_argument("--shapes", default=SHAPES,
                 help=f"recipe, a tier ({', '.join(TIERS)}), LAYERSxWIDTH or auto, comma-separated")
  p.add_argument("--seeds", default="", help="comma list of --config.seed (default: the config's)")
  p.add_argument("--config", default="configs/shakespeare_char.py")
  p.add_argument("--auto-only", action="store_true", help="the auto pick alone")
  p.add_argument("--no-auto", action="store_true", help="the hand shapes alone")
  p.add_argument("--auto-first", action="store_true", help="the auto pick before the hand shapes")
  p.add_argument("--max-others", type=float, default=25.0,
                 help="a run during which other processes took more of the machine (%%) runs again")
  p.add_argument("--lock", default="", help="hold this file's exclusive lock through each run")
  p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "jaxtrain-auto-size"),
                 help="JAXTRAIN_CACHE of the runs: token cache and speed probe")
  p.add_argument("--out", default="", help="the results folder (default: dated, named by CPU kind)")
  p.add_argument("--cold-cache", action="store_true",
                 help="each run from an empty jaxtrain cache too (a first-time user: no token "
                 "cache, no speed probe, no matmul speed)")
  p.add_argument("--rev", default="", help="the code's commit, recorded in each row")
  p.add_argument("--commit", action="store_true",
                 help="commit runs.jsonl and the tables in --out's repository after each run")
  p.add_argument("--report", action="store_true", help="only write the report from runs.jsonl")
  p.add_argument("--probe-only", action="store_true", help="only the speed probe (into --cache)")
  args, args.extra = p.parse_known_args()
  args.tokenizers = dict(t.split("=", 1) for t in args.tokenizer)
  args.out = args.out or str(reports.results_dir(f"{NAME}-{reports.cpu_tag(reports.machine_info())}"))
  if args.probe_only:
    corpus, _, data = args.data[0].partition("=")
    return probe(corpus, data, args)
  if not args.report:
    grid(args)
  report(args)


if __name__ == "__main__":
  main()
