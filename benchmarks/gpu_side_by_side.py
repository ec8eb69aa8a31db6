"""Every GPU number in one command: nanoGPT itself against jaxtrain on one GPU, one part after the
other, into one dated folder.

  python benchmarks/gpu_side_by_side.py --part=all --nanogpt=/path/to/nanoGPT --data=input.txt

Parts (`--part=all` runs them in this order, `--part=a,b` some of them; each writes `<part>.json`
into --out):
- install: jaxtrain installed with `pip install '.[cuda13-local]'` (`--extra`; from the wheels in
  `--wheels` alone on a machine with no network: gpu_install.py), then the versions every later
  part runs with (jax, jaxlib, flax, the CUDA plugin, the driver and CUDA), stored in each part.
- tests: `tests/test_gpu.py` on this GPU (JAXTRAIN_TEST_GPU=1), its pass/fail counts.
- throughput: GPT-2 124M (12 x 768, context 1024, vocab 50304, bf16) at the same micro-batch, both
  sides reading the same token files (gpu_runs.py): uniform random ids, and BPE ids of real text.
  nanoGPT's train.py (torch.compile, its flash attention) and `python -m jaxtrain
  --config=configs/gpt2_124m.py`; tokens/s is the median past the compiles. MFU is against the
  datasheet peak and the bf16 matmul peak measured here after warm-ups, by jax and by PyTorch
  (same FLOPs per token for both sides).
- variants: jaxtrain's GPT-2 throughput on the uniform ids with one change each (`variants`: the
  fused cross-entropy switched, each XLA flag in FLAG_VARIANTS, the micro-batch doubled), against
  the recipe as shipped, run before and after them.
- profile: a short trace of each side's step on the random tokens (jaxtrain's
  `train.profile_steps`, nanoGPT's own bench.py with torch.profiler), summed by kernel name.
- shakespeare: nanoGPT's `config/train_shakespeare_char.py` (stopped at 2000 iterations, past its
  best val at 1750; the schedule is unchanged) against `configs/shakespeare_char_gpu.py`: the best
  val loss of each, and each whole command's wall time (start-up and compiles included) to it.

Runs never overlap. Without --nanogpt only jaxtrain's side runs. `--smoke`: toy sizes on the
CPU, to check the plumbing (CI runs it; its install resolves jaxtrain alone and installs nothing).
The report (side_by_side.md, throughput.png, val_loss.png) is rebuilt from whichever parts are in
--out.
"""

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_install  # noqa: E402  (after the paths above)
import gpu_runs  # noqa: E402
import reports  # noqa: E402
import traces  # noqa: E402
from gpu_runs import Setup, timed  # noqa: E402

# jaxtrain's own modules are imported where they are used: the install part may be what brings
# their dependencies.

PARTS = ("install", "tests", "throughput", "variants", "profile", "shakespeare")
NANOGPT_SHAKESPEARE_ITERS = 2000  # its best val is at 1750 of 5000; the lr schedule keeps 5000
PROFILE_STEPS = 5
# XLA flags A/B'd on jaxtrain's GPT-2 step, each in XLA_FLAGS (which overrides jaxtrain's own
# core.programs.GPU_OPTIONS). The first also exists in jax 0.10.2 (the smoke run's, on the CPU).
FLAG_VARIANTS = ("--xla_gpu_enable_cudnn_layer_norm=true", "--xla_gpu_enable_pdl_launch=true",
                 "--xla_gpu_enable_pdl_launch=false")


_PEAK = """
import statistics, sys, time
n, smoke = (512, True) if sys.argv[1] == "smoke" else (8192, False)

def flops(run, sync):  # warm-ups (the clocks ramp up), then the median of 10 rounds of 10 products
  start = time.perf_counter()
  while time.perf_counter() - start < (0.2 if smoke else 3.0):
    run(), sync()
  rounds = []
  for _ in range(10):
    t = time.perf_counter()
    for _ in range(10):
      run()
    sync()
    rounds.append((time.perf_counter() - t) / 10)
  return 2 * n**3 / statistics.median(rounds)

if sys.argv[2] == "jax":
  import jax, jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32 if smoke else jnp.bfloat16)
  f, out = jax.jit(lambda x, y: x @ y), [None]
  print(flops(lambda: out.__setitem__(0, f(a, a)), lambda: out[0].block_until_ready()))
else:
  import torch
  cuda = torch.cuda.is_available()
  a = torch.randn(n, n, device="cuda" if cuda else "cpu", dtype=torch.bfloat16 if cuda else torch.float32)
  print(flops(lambda: a @ a, torch.cuda.synchronize if cuda else lambda: None))
"""


def matmul_peaks(s: Setup) -> dict:
  """FLOP/s of an 8192^3 bf16 matmul on the default device (512^3 float32 on the CPU), by jax and,
  where it is installed, by PyTorch, each in a process of its own (this one never holds the GPU)."""
  peaks = {}
  for side in ("jax", "torch"):
    if side == "torch" and importlib.util.find_spec("torch") is None:
      continue
    cmd = [sys.executable, "-c", _PEAK, "smoke" if s.smoke else "full", side]
    _, lines, status = timed(cmd, ROOT, s.out / "logs" / f"matmul_peak_{side}.log", check=False)
    peaks[side] = float(lines[-1][1]) if status == 0 and lines else None
  return peaks


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


def variants(s: Setup) -> list[tuple[str, dict]]:
  """(name, the changes) of each variant the variants part runs: "extra" jaxtrain flags, or
  "xla_flags", or a Setup with "batch" doubled; the smoke run takes the first two."""
  from jaxtrain.config import loading

  fused = loading.load_config(str(ROOT / "configs" / "gpt2_124m.py")).model.fused_loss
  rows = [(f"model.fused_loss={not fused}", {"extra": (f"--config.model.fused_loss={not fused}",)}),
          *[(flag.lstrip("-"), {"xla_flags": flag}) for flag in FLAG_VARIANTS],
          (f"micro-batch {2 * s.batch}", {"batch": 2 * s.batch})]
  return rows[:2] if s.smoke else rows


def part_variants(s: Setup) -> dict:
  """Each variant's tokens/s against the recipe as shipped, run before the variants and after
  them (compile cache hits after the throughput part): each variant against their mean. The
  smoke run, which checks the plumbing, takes the throughput part's run instead."""
  tp = _load(s.out, "throughput") if s.smoke else None
  base = [r for r in tp["rows"] if (r["side"], r["tokens"]) == ("jaxtrain", "random")] if tp else \
      [gpu_runs.jaxtrain_throughput(s, "random", "variant_base_before")]
  rows = []
  for i, (name, change) in enumerate(variants(s)):
    setup = dataclasses.replace(s, batch=change.get("batch", s.batch))
    rows.append({**gpu_runs.jaxtrain_throughput(setup, "random", f"variant_{i}", change.get("extra", ()),
                                                change.get("xla_flags", ""), check=False),
                 "variant": name})
    reports.log(f"variant {name}: {rows[-1]['tokens_per_sec']:,.0f} tok/s")
  if not s.smoke:
    base.append(gpu_runs.jaxtrain_throughput(s, "random", "variant_base_after"))
  shipped = statistics.fmean(r["tokens_per_sec"] for r in base)
  for r in rows:
    r["vs_shipped"] = r["tokens_per_sec"] / shipped
  when = ("the throughput part's run",) if tp else ("before", "after")
  return {"rows": [*({**r, "variant": f"as shipped ({w})", "vs_shipped": r["tokens_per_sec"] / shipped}
                     for r, w in zip(base, when)), *rows]}


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


STEPS = {"install": gpu_install.part_install, "tests": part_tests, "throughput": part_throughput,
         "variants": part_variants, "profile": part_profile, "shakespeare": part_shakespeare}


def run_parts(s: Setup, parts: list[str], ver: dict | None = None) -> dict:
  """Runs `parts` in PARTS' order, each into `<part>.json` with the versions it ran with (`ver`,
  else read now, after the install); returns those versions."""
  ver = ver or {}
  for part in (p for p in PARTS if p in parts):
    if not ver and part != "install":
      ver = gpu_install.versions()
      reports.log("versions: " + json.dumps({k: v for k, v in ver.items() if k != "environment"}))
    t0 = time.perf_counter()
    record = STEPS[part](s)
    ver = record.get("versions", ver)
    record.update(part_s=time.perf_counter() - t0, versions=ver, smoke=s.smoke)
    (s.out / f"{part}.json").write_text(json.dumps(record, indent=1))
    reports.log(f"part {part}: {record['part_s']:.0f} s")
  return ver


def flops_per_token(smoke: bool) -> int:
  """6N + 12LTD of the GPT-2 shape both sides train (the same count for both)."""
  from jaxtrain.core import model as model_lib

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
  named = {"datasheet": "datasheet", "jax": "bf16 matmul by jax", "torch": "by PyTorch"}
  shown = [k for k in named if peaks.get(k)]
  rows = [[r["side"], r["tokens"], r["batch"], f"{r['step_ms']:.1f}", f"{r['tokens_per_sec']:,.0f}",
           *[f"{r['tokens_per_sec'] * fpt / peaks[k]:.1%}" for k in shown]] for r in tp["rows"]]
  text = ["## GPT-2 124M throughput: same micro-batch, same token files", "",
          reports.markdown_table(["side", "tokens", "batch", "ms/step", "tokens/s", *[
              f"MFU ({named[k]} {peaks[k] / 1e12:.0f} TFLOP/s)" for k in shown]], rows), ""]
  by = {(r["side"], r["tokens"]): r["tokens_per_sec"] for r in tp["rows"]}
  for kind in gpu_runs.TOKEN_KINDS:
    if ("nanoGPT", kind) in by and ("jaxtrain", kind) in by:
      text.append(f"- {kind} tokens: jaxtrain / nanoGPT = "
                  f"{by['jaxtrain', kind] / by['nanoGPT', kind]:.2f}x")
  text += [f"- FLOPs per token (6N + 12LTD, both sides): {fpt:.4g}; the measured peaks: an "
           "8192^3 bf16 matmul on this device after 3 s of warm-ups, the median of 10 rounds of "
           "10 back-to-back products; the datasheet's is the dense bf16 peak"
           + ("" if peaks.get("datasheet") else " (none known for this device)"),
           f"- token files: {json.dumps(tp['token_files'])}", ""]
  return text


def _install_md(inst: dict) -> list[str]:
  fallback = inst.get("fallback")
  how = ("as a user installs it" if inst["as_a_user"] else "**not** as a user installs it: "
         + ("pip failed; the carried wheels and jaxtrain went in with --no-deps (exit status "
            f"{fallback['exit_status']}), the rest is the machine's" if fallback else "pip failed"))
  return ["## Install", "", f"`{' '.join(inst['command'][1:])}`: exit status {inst['exit_status']}, "
          f"{how}.", "", "```", *inst["tail"][-6:], "```", ""]


def _variants_md(va: dict) -> list[str]:
  rows = [[r["variant"], r["batch"], f"{r['tokens_per_sec']:,.0f}",
           f"{r.get('vs_shipped', 1.0):.3f}x" if r["tokens_per_sec"] else
           f"failed (exit status {r.get('exit_status')})"] for r in va["rows"]]
  return ["## jaxtrain's GPT-2 step, one change at a time (uniform ids)", "",
          reports.markdown_table(["variant", "batch", "tokens/s", "vs as shipped (mean of its runs)"],
                                 rows), ""]


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
  text += ["Machine and versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()
                                               if k not in ("environment", "devices")), "",
           "Part times: " + ", ".join(f"{p} {r['part_s']:.0f} s" for p, r in parts.items() if r), ""]
  if inst := parts["install"]:
    text += _install_md(inst)
  if t := parts["tests"]:
    text += ["## tests/test_gpu.py", "", f"`{t['summary']}` (exit status {t['exit_status']})", ""]
  if tp := parts["throughput"]:
    text += _throughput_md(tp, tp["peaks"])
  if va := parts["variants"]:
    text += _variants_md(va)
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
  p.add_argument("--part", default="all", help=f"all, or some of {','.join(PARTS)} (comma-separated)")
  p.add_argument("--wheels", type=Path, help="carried wheels: the install takes them alone (no index)")
  p.add_argument("--extra", default="cuda13-local", help="pyproject.toml's extra the install asks for")
  p.add_argument("--batch", type=int, default=16, help="micro-batch of the GPT-2 runs")
  p.add_argument("--steps", type=int, default=60, help="steps of each throughput run")
  p.add_argument("--jaxtrain_flag", action="append", default=[],
                 help="an extra flag for every jaxtrain command (repeatable)")
  p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU: checks the plumbing")
  p.add_argument("--out", type=Path, default=reports.results_dir("gpu-side-by-side"))
  return p.parse_args(argv)


def main(argv=None) -> None:
  args = parse_args(argv)
  parts = list(PARTS) if args.part == "all" else args.part.split(",")
  if not args.data.is_file() or not set(parts) <= set(PARTS):
    raise SystemExit(f"error: --data={args.data} is not a file (pass Tiny Shakespeare's input.txt), "
                     f"or --part={args.part} names a part that is not one of {','.join(PARTS)}")
  s = Setup(out=args.out.resolve(), data=args.data.resolve(),
            nanogpt=args.nanogpt.resolve() if args.nanogpt else None, smoke=args.smoke,
            batch=min(args.batch, 4) if args.smoke else args.batch,
            steps=min(args.steps, 30) if args.smoke else args.steps, jaxtrain_flags=args.jaxtrain_flag,
            wheels=args.wheels.resolve() if args.wheels else None, extra=args.extra)
  (s.out / "logs").mkdir(parents=True, exist_ok=True)
  ver = run_parts(s, [p for p in parts if p == "install"])  # first: the rest imports jaxtrain
  token_files = gpu_runs.write_tokens(s) if {"throughput", "variants", "profile"} & set(parts) \
      else None
  if s.nanogpt:
    gpu_runs.link_nanogpt_data(s)
  ver = run_parts(s, [p for p in parts if p != "install"], ver)
  if (tp := _load(s.out, "throughput")) and "peaks" not in tp:
    from jaxtrain.measure.estimate import published_peak

    tp.update(flops_per_token=flops_per_token(s.smoke), token_files=token_files,
              peaks={"datasheet": published_peak(ver["gpu"], "bfloat16"), **matmul_peaks(s)})
    (s.out / "throughput.json").write_text(json.dumps(tp, indent=1))
  (s.out / "side_by_side.md").write_text(markdown(s.out))
  charts(s.out)
  print((s.out / "side_by_side.md").read_text())


if __name__ == "__main__":
  main()
