"""The CPU policy's choices (jaxtrain/core/cpu.py) measured on this CPU, and bfloat16 compute
against float32: what `core.cpu.cpu_kind()` picks here, and train steps with each choice and its
alternative, then whole `python -m jaxtrain` runs.

    python benchmarks/cpu_policy.py --rounds=6 --round-s=3 --runs=2 \\
        --data=/path/to/tinyshakespeare.txt

Steps: per case, one worker process set up as a run of its config is (`startup.settle`), the step
compiled once per variant (`programs.build` with the variant's compile options; "policy" is
what the run would get here), timed in --rounds rounds of about --round-s seconds per variant in
rotating order; a change is the median over rounds of variant / the case's first variant.
Whole runs: `python -m jaxtrain` for --steps steps per variant, --runs times each in alternation;
tokens/s is the median of the trainer's own per-log-interval tokens/s after the first interval.
"--best" is the XLA option that ran bfloat16 matmuls fastest in cpu_matmul_routes.py (it reaches
the whole runs through XLA_FLAGS). Writes cpu_policy.{json,md,png} to --out
(default benchmarks/results/<date>-cpu_policy/).
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "cpu_policy"
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
MT_EIGEN = {"xla_cpu_multi_thread_eigen": True}
# name: (config, overrides, vocabulary, {variant: (model dtype, compile options on top of the
# policy's, or None for the policy's own[, config overrides])}). The first variant is what the
# others are against.
FUSED = ("float32", None, {"model.fused_loss": True})  # the fused cross-entropy (core/loss.py)
CASES = {
    "nano": ("configs/nano.py", {}, 256, {
        "f32 policy": ("float32", None), "f32 multi-threaded Eigen": ("float32", MT_EIGEN),
        "bf16 policy": ("bfloat16", None), "bf16 +best": ("bfloat16", "best"),
        "f32 +best": ("float32", "best"), "f32 fused loss": FUSED}),
    "shakespeare_char": ("configs/shakespeare_char.py", {}, 65, {
        "f32 policy": ("float32", None), "bf16 policy": ("bfloat16", None),
        "bf16 +best": ("bfloat16", "best"), "f32 +best": ("float32", "best"),
        "f32 fused loss": FUSED}),
    # nanoGPT's CPU shape (4 x 128, T 64, B 12), on the devices the policy splits it into and
    # on one device with every core's threads.
    "e_shape": ("configs/shakespeare_char_nanogpt.py", {}, 65, {
        "f32 policy": ("float32", None), "f32 multi-threaded Eigen": ("float32", MT_EIGEN),
        "f32 YNN fusions off": ("float32", NO_YNN), "f32 +best": ("float32", "best")}),
    "e_shape_1_device": ("configs/shakespeare_char_nanogpt.py", {"mesh.cpu_devices": 1}, 65, {
        "f32 policy": ("float32", None), "f32 YNN fusions off": ("float32", NO_YNN)}),
    # small.py's model at batch 8: 1.5e11 FLOPs a step, just over LARGE_CPU_STEP_FLOPS.
    "mid": ("configs/small.py", {"train.batch_size": 8}, 256, {
        "f32 policy": ("float32", None), "f32 YNN fusions on": ("float32", "ynn on"),
        "f32 multi-threaded Eigen": ("float32", MT_EIGEN),
        "bf16 policy": ("bfloat16", None), "bf16 YNN fusions off": ("bfloat16", NO_YNN),
        "f32 +best": ("float32", "best")}),
    # small.py's model at batch 32: 5.9e11 FLOPs, where the large-step choices were measured.
    "large": ("configs/small.py", {"train.batch_size": 32}, 256, {
        "f32 policy": ("float32", None), "f32 YNN fusions on": ("float32", "ynn on"),
        "f32 +best": ("float32", "best")}),
}
ACTIVE: list = []  # the workers alive now: their CPU time is ours, not background load


def options_of(policy: dict, extra, best: dict) -> dict:
  if extra is None:
    return policy
  if extra == "ynn on":
    return {k: v for k, v in policy.items() if k != "xla_cpu_experimental_ynn_fusion_type"}
  return {**policy, **(best if extra == "best" else extra)}


class PolicySteps:
  """In a worker set up as a run of case `name` is: its step compiled as each variant."""

  def __init__(self, name: str, best: dict):
    os.environ["JAX_PLATFORMS"] = "cpu"
    import numpy as np

    import jaxtrain as jt
    from jaxtrain.core import cpu
    from jaxtrain.system import startup

    path, overrides, vocab, variants = CASES[name]
    cfg = jt.load_config(str(ROOT / path), **{"train.grad_accum": 1, **overrides})
    startup.settle(cfg, by="benchmarks/cpu_policy.py")
    devices = startup.devices()
    rng = np.random.default_rng(0)
    self.runs, self.info = {}, {"devices": len(devices), "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                "variants": {}}
    for variant, (dtype, extra, *over) in variants.items():
      vcfg = jt.override(cfg.copy_and_resolve_references(), **{"model.dtype": dtype, **dict(*over)})
      policy = cpu.cpu_step_options(cpu.step_flops(vcfg), os.environ.get("XLA_FLAGS", ""), dtype,
                                    devices=len(devices))
      options = options_of(policy, extra, best)
      programs = jt.build(vcfg, vocab, devices, compiler_options=options)
      step = programs.compile_train()
      batches = [programs.place({"tokens": rng.integers(0, vocab, programs.batch_shape).astype(np.int32)})
                 for _ in range(2)]
      state, metrics = step(programs.init(), batches[0])
      self.runs[variant] = [step, state, batches]
      self.info["variants"][variant] = {
          "dtype": dtype, "options": options, "policy_options": policy,
          "first_loss": float(metrics["loss"]), "tokens_per_step": int(np.prod(programs.batch_shape)) -
          programs.batch_shape[0], "warmup_step_s": self.time(variant, 1)}
    self.info["step_flops"] = cpu.step_flops(cfg)
    self.info["model"] = (f"{cfg.model.n_layers} x {cfg.model.d_model}, batch "
                          f"{cfg.train.batch_size} x {cfg.model.seq_len}")

  def describe(self) -> dict:
    return self.info

  def time(self, variant: str, n: int) -> float:
    """Wall seconds per step over `n` steps run back to back, as the loop runs them: at most
    MAX_IN_FLIGHT queued (more have deadlocked XLA:CPU's cross-device all-reduce)."""
    import collections

    import jax

    from jaxtrain.system.runtime import MAX_IN_FLIGHT

    step, state, batches = self.runs[variant]
    queued = collections.deque()
    t0 = time.perf_counter()
    for i in range(n):
      state, metrics = step(state, batches[i % 2])
      queued.append(metrics)
      if len(queued) > MAX_IN_FLIGHT:
        jax.block_until_ready(queued.popleft())
    jax.block_until_ready((state.params, metrics))
    self.runs[variant][1] = state
    return (time.perf_counter() - t0) / n


def run_steps(args, sampler: common.LoadSampler) -> dict:
  results = {}
  for name in args.cases:
    sampler.label = f"{name}/compile"
    worker = common.Worker(name, PolicySteps, name, args.best)
    ACTIVE.append(worker)
    try:
      info = worker.call("describe")
      variants = list(info["variants"])
      n = {v: max(2, math.ceil(args.round_s / info["variants"][v]["warmup_step_s"])) for v in variants}
      t = {v: [] for v in variants}
      others = {v: [] for v in variants}
      for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
          sampler.label = f"{name}/{v}"
          before = common.cpu_snapshot([os.getpid(), worker.pid])
          t[v].append(worker.call("time", variant=v, n=n[v]))
          share = common.cpu_share(before, common.cpu_snapshot([os.getpid(), worker.pid]))
          others[v].append(share["other_pct"] if share else None)
      base = t[variants[0]]
      for v in variants:
        tokens = info["variants"][v]["tokens_per_step"]
        o = [x for x in others[v] if x is not None]
        info["variants"][v] |= {
            "steps_per_round": n[v], "step_s": t[v], "median_ms": 1e3 * statistics.median(t[v]),
            "tokens_per_s": tokens / statistics.median(t[v]),
            "speedup_per_round": [b / x for b, x in zip(base, t[v])],
            "speedup": statistics.median(b / x for b, x in zip(base, t[v])),
            "others_pct": round(statistics.fmean(o), 1) if o else None}
      results[name] = info
      reports.log(f"{name}: " + ", ".join(f"{v} {x['tokens_per_s']:,.0f} tok/s ({x['speedup']:.2f}x)"
                                          for v, x in info["variants"].items()))
    finally:
      ACTIVE.remove(worker)
      worker.close()
  return results


def _metrics(workdir: Path) -> dict:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line]
  train = [r for r in rows if "tokens_per_sec" in r]
  val = [r for r in rows if "val_loss" in r]
  return {"tokens_per_s": statistics.median(r["tokens_per_sec"] for r in train[1:] or train),
          "loss_curve": [[r["step"], r["loss"]] for r in train],
          "final_loss": train[-1]["loss"], "val_loss": val[-1]["val_loss"] if val else None}


def whole_runs(args, sampler: common.LoadSampler) -> dict:
  """--runs alternations of `python -m jaxtrain` per config and variant (f32 / bf16, +best)."""
  best_flags = " ".join(f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
                        for k, v in args.best.items())
  variants = {"f32": ("float32", ""), "bf16": ("bfloat16", ""),
              "f32 +best": ("float32", best_flags), "bf16 +best": ("bfloat16", best_flags)}
  configs = {"nano": [], "shakespeare_char": [f"--config.data.path={args.data}"] if args.data else None}
  out = {}
  for config, extra in configs.items():
    if extra is None:
      reports.log(f"whole runs of {config}: skipped (no --data)")
      continue
    out[config] = {v: [] for v in variants}
    for r in range(args.runs):
      for v in list(variants)[r % 2:] + list(variants)[:r % 2]:
        dtype, flags = variants[v]
        with tempfile.TemporaryDirectory() as tmp:
          cmd = [sys.executable, "-m", "jaxtrain", f"--config=configs/{config}.py", "--jax_platforms=cpu",
                 f"--config.workdir={tmp}/run", f"--config.train.max_steps={args.steps}",
                 "--config.sample.num_samples=0", f"--config.model.dtype={dtype}", *extra]
          env = dict(os.environ, XLA_FLAGS=flags) if flags else \
              {k: x for k, x in os.environ.items() if k != "XLA_FLAGS"}
          sampler.label = f"run {config}/{v}"
          before, t0 = common.cpu_snapshot([]), time.perf_counter()
          child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
          proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
          wall = time.perf_counter() - t0
          if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
          share = common.cpu_share(before, common.cpu_snapshot([]))
          child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
          run_cpu = child1.ru_utime + child1.ru_stime - child0.ru_utime - child0.ru_stime
          m = _metrics(Path(tmp) / "run")
        # Others: the machine's busy share less the run's own CPU time (a child, not in the snapshots).
        others = share and round(share["busy_pct"] - 100 * run_cpu / (wall * os.cpu_count()), 1)
        out[config][v].append({**m, "wall_s": wall, "others_pct": others})
        reports.log(f"run {config} {v}: {m['tokens_per_s']:,.0f} tok/s, loss {m['final_loss']:.4f}, "
                    f"val {m['val_loss']}, wall {wall:.1f} s")
  return out


def _cell(x: dict) -> str:
  return f"{x['tokens_per_s']:,.0f} ({x['speedup']:.2f}x)"


def markdown(report: dict) -> str:
  m, kind = report["machine"], report["cpu_kind"]
  lines = [f"# The CPU policy on this CPU, and bfloat16 compute ({report['when']})", "",
           f"- {reports.cpu_line(m)}; jax {m['versions']['jax']}",
           f"- `core.cpu.cpu_kind()` here: {kind['name']} (large_step_flops "
           f"{kind['large_step_flops']:.0e}, no_ynn_flops {kind.get('no_ynn_flops', 0):.0e}, "
           f"bf16_ynn {kind['bf16_ynn']}; {kind['measured']})",
           f"- load: {reports.load_line(report['load'])}",
           f"- --best: `{report['args']['best']}`", "",
           f"## Train steps ({report['args']['rounds']} rounds of ~{report['args']['round_s']} s "
           "per variant, rotating order)", ""]
  rows = []
  for case, info in report["steps"].items():
    for v, x in info["variants"].items():
      spread = sorted(x["speedup_per_round"])
      rows.append([case, f"{info['model']}, {info['step_flops']:.2g} FLOPs, {info['devices']} devices",
                   v, f"`{x['options']}`", f"{x['median_ms']:.1f}", _cell(x),
                   f"{spread[0]:.2f}-{spread[-1]:.2f}", f"{x['first_loss']:.4f}", x["others_pct"]])
  lines += [reports.markdown_table(["case", "step", "variant", "compile options", "ms/step", "tokens/s "
                                    "(vs first variant, median of rounds)", "range over rounds",
                                    "first loss", "others' CPU %"], rows), "",
            "policy: the options `cpu_step_options` gives this step on this CPU (the worker's XLA_FLAGS: "
            + ", ".join(f"{c}: `{i['xla_flags']}`" for c, i in report["steps"].items())
            + "). others' CPU %: the share of the whole machine other processes used while the "
            "variant ran (50: one of 2 cores).", ""]
  if report["runs"]:
    lines += [f"## Whole runs (`python -m jaxtrain`, {report['args']['steps']} steps, "
              f"{report['args']['runs']} alternations)", ""]
    rows = []
    for config, by in report["runs"].items():
      base = statistics.median(r["tokens_per_s"] for r in by["f32"])
      for v, runs in by.items():
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        rows.append([config, v, f"{tps:,.0f} ({tps / base:.2f}x)",
                     ", ".join(f"{r['final_loss']:.4f}" for r in runs),
                     ", ".join(f"{r['val_loss']:.4f}" for r in runs if r["val_loss"] is not None),
                     f"{statistics.median(r['wall_s'] for r in runs):.1f}",
                     ", ".join(str(r["others_pct"]) for r in runs)])
    lines += [reports.markdown_table(["config", "variant", "tokens/s (vs f32)", "final train loss",
                                      "final val loss", "wall s", "others' CPU %"], rows), "",
              "tokens/s: the median over runs of each run's median per-interval tokens/s (the first "
              "interval, with the compile, left out). wall: the whole process, start-up and evals in.", ""]
  return "\n".join(lines)


def chart(path: Path, report: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps = report["steps"]
  fig, axes = plt.subplots(1, max(len(steps), 1), figsize=(4.5 * max(len(steps), 1), 4), squeeze=False)
  for ax, (case, info) in zip(axes[0], steps.items(), strict=False):
    names = list(info["variants"])
    bars = ax.bar(names, [info["variants"][v]["tokens_per_s"] for v in names],
                  color=[f"C{i}" for i in range(len(names))])
    ax.bar_label(bars, labels=[f"{info['variants'][v]['speedup']:.2f}x" for v in names], fontsize=8)
    ax.set_title(f"{case}: {info['model']}", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, rotation=30)
  axes[0][0].set_ylabel("train-step tokens/s (median of rounds)")
  fig.suptitle(reports.machine_name(report["machine"]), fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--cases", default="nano,shakespeare_char,mid",
                 help=f"comma list of {', '.join(CASES)} (large: ~6 s a step on 2 busy cores)")
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--round-s", type=float, default=3.0, help="seconds of steps per variant a round")
  p.add_argument("--best", default='{"xla_cpu_prefer_vector_width": 512}',
                 help="JSON: the XLA options of the +best variants")
  p.add_argument("--runs", type=int, default=2, help="alternations of whole runs (0: none)")
  p.add_argument("--steps", type=int, default=300, help="steps of each whole run")
  p.add_argument("--data", default="", help="the text shakespeare_char's whole runs train on")
  p.add_argument("--out", default=str(reports.results_dir(NAME)))
  args = p.parse_args(argv)
  args.cases, args.best = [c for c in args.cases.split(",") if c], json.loads(args.best)
  return args


def main() -> None:
  args = parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  env = common.use_jaxtrain_environment()  # the workers start as `python -m jaxtrain` does
  from jaxtrain.core import cpu
  from jaxtrain.system import machine

  loadavg_before = os.getloadavg()
  with common.LoadSampler(lambda: [os.getpid(), *(w.pid for w in list(ACTIVE))]) as sampler:
    steps = run_steps(args, sampler)
    runs = whole_runs(args, sampler) if args.runs else {}
  report = {"when": reports.timestamp(), "args": vars(args), "environment_set": env,
            "cpu_id": machine.cpu_id(), "cpu_kind": vars(cpu.cpu_kind()), "steps": steps, "runs": runs,
            "machine": reports.machine_info(), "load": reports.load_record(loadavg_before, sampler)}
  md = markdown(report)
  print(md)
  reports.write(args.out, NAME, report, md, lambda path: chart(path, report))


if __name__ == "__main__":
  main()
