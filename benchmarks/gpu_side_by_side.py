"""Every GPU number in one command: nanoGPT itself against jaxtrain on one GPU, one part after the
other, into one dated folder.

  python benchmarks/gpu_side_by_side.py --part=all --nanogpt=/path/to/nanoGPT --data=input.txt

Parts (`--part=all` runs them in this order; each writes `<part>.json` into --out):
- tests: `tests/test_gpu.py` on this GPU (JAXTRAIN_TEST_GPU=1), its pass/fail counts.
- throughput: GPT-2 124M (12 x 768, context 1024, vocab 50304, bf16) at the same micro-batch, both
  sides reading the same token files (gpu_runs.py): uniform random ids, and BPE ids of real text.
  nanoGPT's train.py (torch.compile, its flash attention) and `python -m jaxtrain
  --config=configs/gpt2_124m.py`; tokens/s is the median past the compiles. MFU is against both
  the datasheet peak and the bf16 matmul peak measured here (same FLOPs per token for both sides).
- profile: a short trace of each side's step on the random tokens (jaxtrain's
  `train.profile_steps`, nanoGPT's own bench.py with torch.profiler), summed by kernel name.
- shakespeare: nanoGPT's `config/train_shakespeare_char.py` (stopped at 2000 iterations, past its
  best val at 1750; the schedule is unchanged) against `configs/shakespeare_char_gpu.py`: the best
  val loss of each, and each whole command's wall time (start-up and compiles included) to it.

Runs never overlap. Without --nanogpt only jaxtrain's side runs. `--smoke`: toy sizes on the
CPU, to check the plumbing (CI runs it). The report (side_by_side.md, throughput.png,
val_loss.png) is rebuilt from whichever parts are in --out.
"""

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_runs  # noqa: E402  (after the paths above)
import reports  # noqa: E402
import traces  # noqa: E402
from gpu_runs import Setup, timed  # noqa: E402

from jaxtrain.core import model as model_lib  # noqa: E402
from jaxtrain.measure.estimate import published_peak  # noqa: E402

PARTS = ("tests", "throughput", "profile", "shakespeare")
NANOGPT_SHAKESPEARE_ITERS = 2000  # its best val is at 1750 of 5000; the lr schedule keeps 5000
PROFILE_STEPS = 5


def versions() -> dict:
  gpu = gpu_runs.subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True) \
      if _has("nvidia-smi") else None
  name, _, driver = gpu.stdout.strip().splitlines()[0].partition(", ") if gpu and gpu.stdout \
      else ("none (CPU)", "", "")
  m = reports.machine_info()
  return {"gpu": name, "driver": driver, "cpu": reports.cpu_name(m),
          **{k: m["versions"][k] for k in ("jax", "jaxlib", "torch")}, "python": m["python"]}


def _has(command: str) -> bool:
  return any((Path(d) / command).exists() for d in os.environ.get("PATH", "").split(os.pathsep))


_PEAK = """
import statistics, sys, time
import jax, jax.numpy as jnp
n, dtype = (512, jnp.float32) if sys.argv[1] == "smoke" else (8192, jnp.bfloat16)
a = jax.random.normal(jax.random.key(0), (n, n), dtype)
f = jax.jit(lambda x, y: x @ y)
f(a, a).block_until_ready()
times = []
for _ in range(10):
  t = time.perf_counter()
  f(a, a).block_until_ready()
  times.append(time.perf_counter() - t)
print(2 * n**3 / statistics.median(times))
"""


def matmul_peak(s: Setup) -> float:
  """Measured FLOP/s of one big bf16 matmul on the default device (float32 on the CPU), in a
  process of its own: this one never holds the GPU while the sides run."""
  cmd = [sys.executable, "-c", _PEAK, "smoke" if s.smoke else "full"]
  _, lines, _ = timed(cmd, ROOT, s.out / "logs" / "matmul_peak.log")
  return float(lines[-1][1])


def part_tests(s: Setup) -> dict:
  env = dict(os.environ, JAXTRAIN_TEST_GPU="1")
  cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q", "-s", "-p",
         "no:cacheprovider"]
  wall, lines, status = timed(cmd, ROOT, s.out / "logs" / "gpu_tests.log", env=env, check=False)
  summary = next((line for _, line in reversed(lines) if " in " in line and
                  any(w in line for w in ("passed", "failed", "skipped", "error"))), "")
  counts = {w: int(n) for n, w in (p.split()[:2] for p in summary.strip("= ").split(" in ")[0]
                                   .split(", ") if len(p.split()) >= 2) if n.isdigit()}
  return {"wall_s": wall, "exit_status": status, "summary": summary.strip("= "), "counts": counts}


def part_throughput(s: Setup) -> dict:
  rows = []
  for kind in gpu_runs.TOKEN_KINDS:
    if s.nanogpt:
      rows.append(gpu_runs.nanogpt_throughput(s, kind))
    rows.append(gpu_runs.jaxtrain_throughput(s, kind))
    reports.log(f"throughput, {kind} tokens: " + ", ".join(
        f"{r['side']} {r['tokens_per_sec']:,.0f} tok/s" for r in rows if r["tokens"] == kind))
  return {"rows": rows}


def part_profile(s: Setup) -> dict:
  cmd = gpu_runs.jaxtrain_gpt2(s, "profile", "random", 2 + PROFILE_STEPS,
                               (f"--config.train.profile_steps={PROFILE_STEPS}",))
  timed(cmd, ROOT, s.out / "logs" / "jaxtrain_profile.log")
  found = {"jaxtrain": traces.find_trace(s.out / "runs" / "profile" / "profile",
                                         "perfetto_trace.json.gz")}
  if s.nanogpt:
    found["nanoGPT"] = gpu_runs.nanogpt_profile(s)
  tables, notes = {}, []
  for side, path in found.items():
    try:
      tables[side] = traces.kernel_table(path, PROFILE_STEPS) if path else None
    except ValueError as e:  # a CPU trace (the smoke run) has no GPU kernels
      notes.append(f"{side}: {e}")
  return {"traces": {k: str(v) for k, v in found.items()}, "tables": tables, "notes": notes}


def part_shakespeare(s: Setup) -> dict:
  runs = []
  if s.nanogpt:
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py",
           f"--out_dir={s.out / 'nanogpt_out'}", f"--max_iters={NANOGPT_SHAKESPEARE_ITERS}"]
    if s.smoke:
      cmd = cmd[:-1] + ["--device=cpu", "--compile=False", "--dtype=float32", "--max_iters=40",
                        "--lr_decay_iters=40", "--eval_interval=10", "--eval_iters=5", "--n_layer=2",
                        "--n_head=2", "--n_embd=64", "--block_size=64", "--batch_size=8"]
    wall, lines, _ = timed(cmd, s.nanogpt, s.out / "logs" / "nanogpt_shakespeare.log")
    runs.append({"side": "nanoGPT", "wall_s": wall, "command": cmd, "evals": gpu_runs.evals_of(
        lines, r"step (\d+): train loss [\d.]+, val loss ([\d.]+)")})
  cmd = [sys.executable, "-m", "jaxtrain", "--config=configs/shakespeare_char_gpu.py",
         f"--config.workdir={s.out / 'runs' / 'shakespeare'}", f"--config.data.path={s.data}",
         "--config.headless=True", "--config.sample.num_samples=0", *s.jaxtrain_flags]
  if s.smoke:
    cmd += ["--jax_platforms=cpu", "--config.model.dtype=float32", "--config.train.max_steps=40",
            "--config.train.eval_every=10", "--config.train.eval_steps=2", "--config.model.n_layers=2",
            "--config.model.d_model=64", "--config.model.n_heads=2", "--config.model.seq_len=64",
            "--config.train.batch_size=8"]
  wall, lines, _ = timed(cmd, ROOT, s.out / "logs" / "jaxtrain_shakespeare.log")
  runs.append({"side": "jaxtrain", "wall_s": wall, "command": cmd,
               "evals": gpu_runs.evals_of(lines, r"eval step (\d+): val loss ([\d.]+)")})
  for r in runs:
    t, step, best = min(r["evals"], key=lambda e: e[2])
    r.update(best_val=best, best_step=step, to_best_s=t)
  target = runs[0]["best_val"]  # nanoGPT's best where it ran, else jaxtrain's own
  for r in runs:
    r["to_target_s"] = next((t for t, _, v in r["evals"] if v <= target), None)
  return {"target_val": target, "target_from": runs[0]["side"], "runs": runs}


def run_parts(args, s: Setup, ver: dict) -> None:
  steps = {"tests": lambda: part_tests(s), "throughput": lambda: part_throughput(s),
           "profile": lambda: part_profile(s), "shakespeare": lambda: part_shakespeare(s)}
  for part in PARTS:
    if args.part not in ("all", part):
      continue
    t0 = time.perf_counter()
    record = steps[part]()
    record.update(part_s=time.perf_counter() - t0, versions=ver, smoke=s.smoke)
    (s.out / f"{part}.json").write_text(json.dumps(record, indent=1))
    reports.log(f"part {part}: {record['part_s']:.0f} s")


def flops_per_token(smoke: bool) -> int:
  """6N + 12LTD of the GPT-2 shape both sides train (the same count for both)."""
  sh = gpu_runs.SMOKE_GPT2 if smoke else gpu_runs.GPT2
  c = model_lib.ModelConfig(vocab_size=50304, n_layers=sh["n_layer"], n_heads=sh["n_head"],
                            d_model=sh["n_embd"], seq_len=sh["block_size"], norm="layernorm",
                            pos="learned", mlp="gelu", tie_embeddings=True)
  return model_lib.flops_per_token(c)


def _load(out: Path, part: str) -> dict | None:
  path = out / f"{part}.json"
  return json.loads(path.read_text()) if path.is_file() else None


def _throughput_md(tp: dict, peaks: dict) -> list[str]:
  fpt = tp["flops_per_token"]
  rows = []
  for r in tp["rows"]:
    mfu = {k: f"{r['tokens_per_sec'] * fpt / v:.1%}" if v else "-" for k, v in peaks.items()}
    rows.append([r["side"], r["tokens"], r["batch"], f"{r['step_ms']:.1f}",
                 f"{r['tokens_per_sec']:,.0f}", mfu["datasheet"], mfu["measured"]])
  text = ["## GPT-2 124M throughput: same micro-batch, same token files", "",
          reports.markdown_table(["side", "tokens", "batch", "ms/step", "tokens/s",
                                  "MFU (datasheet)", "MFU (measured matmul peak)"], rows), ""]
  by = {(r["side"], r["tokens"]): r["tokens_per_sec"] for r in tp["rows"]}
  for kind in gpu_runs.TOKEN_KINDS:
    if ("nanoGPT", kind) in by and ("jaxtrain", kind) in by:
      text.append(f"- {kind} tokens: jaxtrain / nanoGPT = "
                  f"{by['jaxtrain', kind] / by['nanoGPT', kind]:.2f}x")
  datasheet = f"{peaks['datasheet']:.4g}" if peaks["datasheet"] else "none known"
  text += [f"- FLOPs per token (6N + 12LTD, both sides): {fpt:.4g}; peaks: datasheet "
           f"{datasheet}, measured {peaks['measured']:.4g} FLOP/s (bf16 matmul, this device)",
           f"- token files: {json.dumps(tp['token_files'])}", ""]
  return text


def _shakespeare_md(sh: dict) -> list[str]:
  rows = [[r["side"], f"{r['best_val']:.4f}", r["best_step"], f"{r['to_best_s']:.1f}",
           f"{r['to_target_s']:.1f}" if r["to_target_s"] is not None else "not reached",
           f"{r['wall_s']:.1f}"] for r in sh["runs"]]
  return [f"## Tiny Shakespeare: best val loss, and time to {sh['target_from']}'s best "
          f"({sh['target_val']:.4f})", "",
          reports.markdown_table(["side", "best val", "at step", "s to its best",
                                  "s to the target", "whole command s"], rows), "",
          "Commands:", *sorted({f"- `{' '.join(r['command'][1:])}`" for r in sh["runs"]}), ""]


def markdown(out: Path) -> str:
  parts = {p: _load(out, p) for p in PARTS}
  first = next((r for r in parts.values() if r), {})
  ver = first.get("versions", {})
  text = [f"# nanoGPT vs jaxtrain on one GPU ({datetime.date.today()})", ""]
  if first.get("smoke"):
    text += ["**Smoke run: toy sizes on the CPU, to check the plumbing; not a measurement.**", ""]
  text += ["Machine: " + ", ".join(f"{k} {v}" for k, v in ver.items()), "",
           "Part times: " + ", ".join(f"{p} {r['part_s']:.0f} s" for p, r in parts.items() if r), ""]
  if t := parts["tests"]:
    text += ["## tests/test_gpu.py", "", f"`{t['summary']}` (exit status {t['exit_status']})", ""]
  if tp := parts["throughput"]:
    text += _throughput_md(tp, tp["peaks"])
  if pr := parts["profile"]:
    tables = {k: v for k, v in pr["tables"].items() if v}
    text += ["## Where a step goes (kernel time by name)", "",
             traces.markdown(tables) if tables else "", *[f"- {n}" for n in pr["notes"]], ""]
  if sh := parts["shakespeare"]:
    text += _shakespeare_md(sh)
  return "\n".join(text) + "\n"


def charts(out: Path) -> None:
  if tp := _load(out, "throughput"):
    values = {kind: {r["side"]: r["tokens_per_sec"] for r in tp["rows"] if r["tokens"] == kind}
              for kind in gpu_runs.TOKEN_KINDS}
    reports.bar_chart(out / "throughput.png", values, "tokens/s",
                      "GPT-2 124M, same micro-batch and token files")
  if sh := _load(out, "shakespeare"):
    lines = {r["side"]: [([t for t, _, _ in r["evals"]], [v for _, _, v in r["evals"]])]
             for r in sh["runs"]}
    reports.line_chart(out / "val_loss.png", lines, "s since the command started", "val loss")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--nanogpt", type=Path, help="a checkout of karpathy/nanoGPT (without: jaxtrain only)")
  p.add_argument("--data", type=Path, required=True, help="Tiny Shakespeare's input.txt")
  p.add_argument("--part", choices=("all", *PARTS), default="all")
  p.add_argument("--batch", type=int, default=16, help="micro-batch of the GPT-2 runs")
  p.add_argument("--steps", type=int, default=60, help="steps of each throughput run")
  p.add_argument("--jaxtrain_flag", action="append", default=[],
                 help="an extra flag for every jaxtrain command (repeatable)")
  p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: checks the plumbing")
  p.add_argument("--out", type=Path, default=reports.results_dir("gpu-side-by-side"))
  return p.parse_args(argv)


def main(argv=None) -> None:
  args = parse_args(argv)
  if not args.data.is_file():
    raise SystemExit(f"error: --data={args.data} is not a file; pass Tiny Shakespeare's input.txt")
  s = Setup(out=args.out.resolve(), data=args.data.resolve(),
            nanogpt=args.nanogpt.resolve() if args.nanogpt else None, smoke=args.smoke,
            batch=min(args.batch, 4) if args.smoke else args.batch,
            steps=min(args.steps, 30) if args.smoke else args.steps, jaxtrain_flags=args.jaxtrain_flag)
  (s.out / "logs").mkdir(parents=True, exist_ok=True)
  ver = versions()
  if args.part in ("all", "throughput", "profile"):
    token_files = gpu_runs.write_tokens(s)
  if s.nanogpt:
    gpu_runs.link_nanogpt_data(s)
  run_parts(args, s, ver)
  if (tp := _load(s.out, "throughput")) and "peaks" not in tp:
    tp.update(flops_per_token=flops_per_token(s.smoke), token_files=token_files,
              peaks={"datasheet": published_peak(ver["gpu"], "bfloat16"),
                     "measured": matmul_peak(s)})
    (s.out / "throughput.json").write_text(json.dumps(tp, indent=1))
  (s.out / "side_by_side.md").write_text(markdown(s.out))
  charts(s.out)
  print((s.out / "side_by_side.md").read_text())


if __name__ == "__main__":
  main()
