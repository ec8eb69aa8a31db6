"""nanoGPT itself against jaxtrain on one GPU, interleaved, in one command.

  python benchmarks/gpu_side_by_side.py --nanogpt=/path/to/nanoGPT --data=path/to/tinyshakespeare.txt

(a) throughput: GPT-2 124M (12 x 768, context 1024, vocab 50304, bf16) at the same micro-batch:
    nanoGPT's train.py (torch.compile, bf16 autocast, its flash attention) on random tokens, and
    `python -m jaxtrain --config=configs/gpt2_124m.py` (byte tokens, vocab padded to 50304). Tokens/s
    is the median past the first WARMUP iterations (compiles); MFU is tokens/s x the same FLOPs per
    token for both (6N + 12LTD) over the GPU's datasheet bf16 peak.
(b) Tiny Shakespeare: nanoGPT's `python train.py config/train_shakespeare_char.py` against
    `python -m jaxtrain --config=configs/shakespeare_char_gpu.py`: each whole command's wall time
    (start-up included) to nanoGPT's final val loss, read from each eval line as it is printed.

Runs alternate (nanoGPT, jaxtrain, nanoGPT, ...), never together. `--part` runs one half (each
fits a 10-minute slot); every part writes its JSON into --out, and the report (side_by_side.md,
val_loss.png) is rebuilt from whichever parts are there. nanoGPT's checkout is used as it is
(its data directories are filled in: Tiny Shakespeare from --data, random tokens). `--smoke`:
toy sizes on the CPU, to check the plumbing.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxtrain.core import model as model_lib  # noqa: E402  (after the path above)
from jaxtrain.measure.estimate import published_peak  # noqa: E402

WARMUP = 10  # iterations or log lines past compiles, dropped from the throughput
GPT2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024}
SMOKE_GPT2 = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}
RANDOM_DATASET = "jaxtrain_random"  # nanoGPT data/<name>/{train,val}.bin of uniform tokens


def shell(cmd: list[str]) -> str:
  try:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def versions() -> dict:
  gpu = shell(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
  name, _, driver = gpu.splitlines()[0].partition(", ") if gpu else ("none", "", "")
  ask = lambda mod: shell([sys.executable, "-c", f"import {mod}; print({mod}.__version__)"])
  return {"gpu": name, "driver": driver, "jax": ask("jax"), "jaxlib": ask("jaxlib"),
          "torch": ask("torch"), "python": sys.version.split()[0]}


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[float, list[tuple[float, str]]]:
  """Runs `cmd`; (wall s, [(s since start, line)]) of its output, also written to `log`."""
  start, lines = time.perf_counter(), []
  with log.open("w") as out:
    out.write(" ".join(cmd) + "\n")
    out.flush()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))  # each line when printed
    for line in proc.stdout:
      lines.append((time.perf_counter() - start, line.rstrip()))
      out.write(line)
  wall = time.perf_counter() - start
  if proc.wait() != 0:
    raise SystemExit(f"error: {' '.join(cmd)} exited {proc.returncode}; its output: {log}")
  return wall, lines


def prepare_nanogpt(nanogpt: Path, data: Path) -> None:
  """nanoGPT's data: Tiny Shakespeare from `data` (prepare.py then finds it and downloads
  nothing), and random GPT-2-sized token ids for the throughput runs."""
  if not (nanogpt / "train.py").is_file():
    raise SystemExit(f"error: {nanogpt} is not a nanoGPT checkout (no train.py); pass --nanogpt=DIR")
  char = nanogpt / "data/shakespeare_char"
  if not (char / "train.bin").is_file():
    (char / "input.txt").write_bytes(data.read_bytes())
    subprocess.run([sys.executable, "prepare.py"], cwd=char, check=True, capture_output=True)
  rand = nanogpt / "data" / RANDOM_DATASET
  if not (rand / "val.bin").is_file():
    rand.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, 50257, 2**23, dtype=np.uint16)
    tokens.tofile(rand / "train.bin")
    tokens[: 2**20].tofile(rand / "val.bin")


def nanogpt_throughput(args, batch: int, steps: int, log: Path) -> dict:
  shape = SMOKE_GPT2 if args.smoke else GPT2
  cmd = [sys.executable, "train.py", f"--dataset={RANDOM_DATASET}", f"--batch_size={batch}",
         "--gradient_accumulation_steps=1", f"--max_iters={steps}", "--eval_interval=1000000",
         "--eval_iters=1", "--log_interval=1", "--dropout=0.0", "--always_save_checkpoint=False",
         f"--out_dir={args.out / 'nanogpt_out'}", *[f"--{k}={v}" for k, v in shape.items()]]
  if args.smoke:
    cmd += ["--device=cpu", "--compile=False", "--dtype=float32"]
  wall, lines = timed(cmd, args.nanogpt, log)
  ms = [float(m[2]) for _, line in lines if (m := re.match(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", line))
        and int(m[1]) >= WARMUP]
  step_s = statistics.median(ms) / 1000
  return {"side": "nanoGPT", "batch": batch, "step_ms": step_s * 1000,
          "tokens_per_sec": batch * shape["block_size"] / step_s, "wall_s": wall, "command": cmd}


def jaxtrain_throughput(args, batch: int, steps: int, log: Path) -> dict:
  workdir = args.out / "runs" / f"throughput_{log.stem}"
  shape = SMOKE_GPT2 if args.smoke else GPT2
  cmd = [sys.executable, "-m", "jaxtrain", "--config=configs/gpt2_124m.py", f"--config.workdir={workdir}",
         f"--config.data.path={args.data}", "--config.data.tokenizer=byte", "--config.headless=True",
         f"--config.train.batch_size={batch}", "--config.train.grad_accum=1",
         f"--config.train.max_steps={steps}", "--config.train.log_every=1", "--config.train.eval_steps=1",
         "--config.sample.num_samples=0", *args.jaxtrain_flag]
  if args.smoke:
    cmd += ["--jax_platforms=cpu", "--config.model.dtype=float32",
            *[f"--config.model.{k}={v}" for k, v in zip(("n_layers", "n_heads", "d_model", "seq_len"),
                                                       shape.values())]]
  wall, _ = timed(cmd, ROOT, log)
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  speeds = [r["tokens_per_sec"] for r in records if r.get("tokens_per_sec")][WARMUP:]
  tps = statistics.median(speeds)
  return {"side": "jaxtrain", "batch": batch, "step_ms": batch * shape["block_size"] / tps * 1000,
          "tokens_per_sec": tps, "wall_s": wall, "command": cmd}


def flops_per_token(smoke: bool) -> int:
  s = SMOKE_GPT2 if smoke else GPT2
  c = model_lib.ModelConfig(vocab_size=50304, n_layers=s["n_layer"], n_heads=s["n_head"],
                            d_model=s["n_embd"], seq_len=s["block_size"], norm="layernorm",
                            pos="learned", mlp="gelu", tie_embeddings=True)
  return model_lib.flops_per_token(c)


def throughput(args, ver: dict) -> dict:
  steps = 30 if args.smoke else args.steps
  prepare_nanogpt(args.nanogpt, args.data)
  rows = []
  for rep in range(args.repeats):
    rows.append(nanogpt_throughput(args, args.batch, steps, args.out / "logs" / f"nanogpt_tp{rep}.log"))
    rows.append(jaxtrain_throughput(args, args.batch, steps, args.out / "logs" / f"jaxtrain_tp{rep}.log"))
    print(f"throughput round {rep}: " + ", ".join(f"{r['side']} {r['tokens_per_sec']:,.0f} tok/s"
                                                   for r in rows[-2:]), flush=True)
  peak = published_peak(ver["gpu"], "bfloat16")
  fpt = flops_per_token(args.smoke)
  for r in rows:
    r["mfu"] = r["tokens_per_sec"] * fpt / peak if peak else None
  return {"flops_per_token": fpt, "peak_flops": peak, "rows": rows}


def evals_of(lines: list[tuple[float, str]], pattern: str) -> list[tuple[float, int, float]]:
  """(s since the command started, step, val loss) of each eval line."""
  return [(t, int(m[1]), float(m[2])) for t, line in lines if (m := re.search(pattern, line))]


def nanogpt_recipe(args, log: Path) -> dict:
  cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py",
         f"--out_dir={args.out / 'nanogpt_out'}"]
  if args.smoke:
    cmd += ["--device=cpu", "--compile=False", "--dtype=float32", "--max_iters=40", "--lr_decay_iters=40",
            "--eval_interval=10", "--eval_iters=5", "--n_layer=2", "--n_head=2", "--n_embd=64",
            "--block_size=64", "--batch_size=8"]
  wall, lines = timed(cmd, args.nanogpt, log)
  evals = evals_of(lines, r"step (\d+): train loss [\d.]+, val loss ([\d.]+)")
  return {"side": "nanoGPT", "wall_s": wall, "evals": evals, "command": cmd}


def jaxtrain_recipe(args, log: Path) -> dict:
  cmd = [sys.executable, "-m", "jaxtrain", "--config=configs/shakespeare_char_gpu.py",
         f"--config.workdir={args.out / 'runs' / log.stem}", f"--config.data.path={args.data}",
         "--config.headless=True", "--config.sample.num_samples=0", *args.jaxtrain_flag]
  if args.smoke:
    cmd += ["--jax_platforms=cpu", "--config.model.dtype=float32", "--config.train.max_steps=40",
            "--config.train.eval_every=10", "--config.train.eval_steps=2", "--config.model.n_layers=2",
            "--config.model.d_model=64", "--config.model.n_heads=2", "--config.model.seq_len=64",
            "--config.train.batch_size=8"]
  wall, lines = timed(cmd, ROOT, log)
  return {"side": "jaxtrain", "wall_s": wall, "command": cmd,
          "evals": evals_of(lines, r"eval step (\d+): val loss ([\d.]+)")}


def shakespeare(args) -> dict:
  prepare_nanogpt(args.nanogpt, args.data)
  runs = []
  for rep in range(args.repeats):
    runs.append(nanogpt_recipe(args, args.out / "logs" / f"nanogpt_shakespeare{rep}.log"))
    runs.append(jaxtrain_recipe(args, args.out / "logs" / f"jaxtrain_shakespeare{rep}.log"))
  target = statistics.median(r["evals"][-1][2] for r in runs if r["side"] == "nanoGPT")
  for r in runs:
    r["final_val"] = r["evals"][-1][2]
    r["to_target_s"] = next((t for t, _, v in r["evals"] if v <= target), None)
    print(f"{r['side']}: final val {r['final_val']:.4f}, wall {r['wall_s']:.1f} s, to {target:.4f}: "
          f"{r['to_target_s'] if r['to_target_s'] is not None else 'not reached'}", flush=True)
  return {"target_val": target, "runs": runs}


def _median(rows: list[dict], side: str, key: str):
  values = [r[key] for r in rows if r["side"] == side and r.get(key) is not None]
  return statistics.median(values) if values else None


def markdown(out: Path, ver: dict) -> str:
  smoke = any(json.loads(p.read_text()).get("smoke") for p in out.glob("*.json"))
  text = [f"# nanoGPT vs jaxtrain on one GPU ({datetime.date.today()})", "",
          *(["**Smoke run: toy sizes on the CPU, to check the plumbing; not a measurement.**", ""]
            if smoke else []),
          "Machine: " + ", ".join(f"{k} {v}" for k, v in ver.items()), ""]
  if (path := out / "throughput.json").is_file():
    tp = json.loads(path.read_text())
    rows = tp["rows"]
    text += ["## GPT-2 124M throughput (same micro-batch, bf16)", "",
             "| side | batch | ms/step | tokens/s | MFU |", "|---|---|---|---|---|"]
    for side in ("nanoGPT", "jaxtrain"):
      mfu = _median(rows, side, "mfu")
      text.append(f"| {side} | {rows[0]['batch']} | {_median(rows, side, 'step_ms'):.1f} | "
                  f"{_median(rows, side, 'tokens_per_sec'):,.0f} | "
                  f"{f'{mfu:.1%}' if mfu is not None else '-'} |")
    ratio = _median(rows, "jaxtrain", "tokens_per_sec") / _median(rows, "nanoGPT", "tokens_per_sec")
    text += ["", f"jaxtrain / nanoGPT tokens/s: {ratio:.2f}x (medians of {len(rows) // 2} "
             f"interleaved runs; FLOPs/token {tp['flops_per_token']:.3g}, peak {tp['peak_flops']})", ""]
  if (path := out / "shakespeare.json").is_file():
    sh = json.loads(path.read_text())
    text += [f"## Tiny Shakespeare: wall time to nanoGPT's final val loss {sh['target_val']:.4f}", "",
             "| side | final val | whole command s | s to target |", "|---|---|---|---|"]
    for r in sh["runs"]:
      reached = f"{r['to_target_s']:.1f}" if r["to_target_s"] is not None else "not reached"
      text.append(f"| {r['side']} | {r['final_val']:.4f} | {r['wall_s']:.1f} | {reached} |")
    text += ["", "Commands (in nanoGPT's checkout and in jaxtrain's):",
             *sorted({f"- `python {' '.join(r['command'][1:])}`" for r in sh["runs"]})]
  return "\n".join(text) + "\n"


def plot(out: Path) -> None:
  if not (path := out / "shakespeare.json").is_file():
    return
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  sh = json.loads(path.read_text())
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, r in enumerate(sh["runs"]):
    t, _, v = zip(*r["evals"])
    ax.plot(t, v, marker=".", color="C0" if r["side"] == "nanoGPT" else "C1",
            label=r["side"] if i < 2 else None)
  ax.axhline(sh["target_val"], color="gray", ls="--", lw=0.8, label="nanoGPT's final val loss")
  ax.set(xlabel="wall time since the command started (s)", ylabel="val loss",
         title="Tiny Shakespeare on one GPU")
  ax.legend()
  fig.savefig(out / "val_loss.png", dpi=120, bbox_inches="tight")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--nanogpt", type=Path, required=True, help="a checkout of karpathy/nanoGPT")
  p.add_argument("--data", type=Path, required=True, help="Tiny Shakespeare's input.txt")
  p.add_argument("--part", choices=("all", "throughput", "shakespeare"), default="all")
  p.add_argument("--batch", type=int, default=16, help="micro-batch of the throughput runs")
  p.add_argument("--steps", type=int, default=60, help="iterations of each throughput run")
  p.add_argument("--repeats", type=int, default=2, help="interleaved runs of each side")
  p.add_argument("--jaxtrain_flag", action="append", default=[],
                 help="an extra flag for both jaxtrain commands (repeatable)")
  p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: checks the plumbing")
  p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results" /
                 f"{datetime.date.today()}-gpu-side-by-side")
  args = p.parse_args(argv)
  args.nanogpt, args.data, args.out = args.nanogpt.resolve(), args.data.resolve(), args.out.resolve()
  if args.smoke:
    args.batch = min(args.batch, 4)
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  (args.out / "logs").mkdir(parents=True, exist_ok=True)
  ver = versions()
  parts = {"throughput": lambda: throughput(args, ver), "shakespeare": lambda: shakespeare(args)}
  for part, measure in parts.items():
    if args.part in ("all", part):
      record = {**measure(), "versions": ver, "smoke": args.smoke}
      (args.out / f"{part}.json").write_text(json.dumps(record, indent=1))
  (args.out / "side_by_side.md").write_text(markdown(args.out, ver))
  plot(args.out)
  print((args.out / "side_by_side.md").read_text())


if __name__ == "__main__":
  main()
