"""The cost of the per-group statistics (log.group_stats): nano's compiled train step with them
("groups", "layers") and without ("none"), in interleaved rounds.

    python benchmarks/group_stats.py --config=configs/nano.py --rounds=12 --steps=20

The step as `python -m jaxtrain` builds it (the same CPU device split, `programs.build`), on
random tokens. Each mode is compiled and run before timing; each round times --steps steps of
every mode (the order rotating), so load that comes and goes hits them alike; the overhead is the
median over rounds of each round's (mode / none - 1). Goal: < 3% of step time. Writes
group_stats.{json,md,png} to --out (default benchmarks/results/<date>-group-stats/).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "group-stats"
# (name, log.group_stats, train.log_every; None: the config's).
MODES = (("none", "none", None), ("groups", "groups", None), ("layers", "layers", None))
GOAL_PCT = 3.0


def _programs(args):
  """{mode: (programs, state, placed batches)}, each mode compiled and run once."""
  import jax
  import numpy as np

  import jaxtrain as jt
  from jaxtrain.system import runtime, startup

  runtime.enable_compile_cache()  # as a run does: a second run of this script skips the compiles
  built = {}
  for mode, group_stats, every in MODES:
    cfg = jt.load_config(args.config, **{"log.group_stats": group_stats})
    cfg.train.log_every = every or cfg.train.log_every
    startup.settle(cfg, by="benchmarks/group_stats.py")  # as a run does (later ones keep it)
    programs = jt.build(cfg, cfg.model.vocab_size or 256, startup.devices())
    rng = np.random.default_rng(0)
    batches = [programs.place({"tokens": rng.integers(0, 256, programs.batch_shape).astype(np.int32)})
               for _ in range(4)]
    t0 = time.perf_counter()
    step = programs.compile_train()
    state, metrics = step(programs.init(), batches[0])
    jax.block_until_ready(metrics)
    print(f"{mode}: compiled and ran one step in {time.perf_counter() - t0:.1f}s; "
          f"{len(metrics)} metrics", flush=True)
    cost = _cost(step)
    built[mode] = [step, state, batches, len(metrics), cost]
  return built


def _cost(compiled) -> dict:
  """XLA's own count of the compiled step's FLOPs and bytes accessed (summed over the devices'
  programs): what the statistics add, free of the machine's load. A lax.cond counts both ways."""
  analysis = compiled.cost_analysis()
  analysis = analysis if isinstance(analysis, list) else [analysis]
  return {k: float(sum(a.get(k, 0.0) for a in analysis if a)) for k in ("flops", "bytes accessed")}


def _time(entry, n: int) -> tuple[float, float]:
  """(wall seconds, CPU seconds of this process's threads) per step over `n` steps, the device
  kept busy as in the loop. On a machine shared with other work the CPU time is the steadier
  measure of what the step itself costs."""
  import jax

  step, state, batches = entry[:3]
  t0, c0 = time.perf_counter(), time.process_time()
  for i in range(n):
    state, metrics = step(state, batches[i % len(batches)])
  jax.block_until_ready((state.params, metrics))
  entry[1] = state
  return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(ROOT / "configs" / "nano.py"))
  p.add_argument("--rounds", type=int, default=12)
  p.add_argument("--steps", type=int, default=20, help="steps per mode per round")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  built = _programs(args)
  names = [m for m, _, _ in MODES]
  times, cpu_times = {m: [] for m in names}, {m: [] for m in names}
  loadavg_before = os.getloadavg()
  with common.LoadSampler(lambda: [os.getpid()]) as sampler:
    for r in range(args.rounds):
      for k in range(len(names)):
        mode = names[(r + k) % len(names)]
        wall, cpu_s = _time(built[mode], args.steps)
        times[mode].append(wall)
        cpu_times[mode].append(cpu_s)
      print(f"round {r + 1}/{args.rounds}: " + ", ".join(
          f"{m} {times[m][-1] * 1e3:.1f} ms ({cpu_times[m][-1] * 1e3:.1f} ms CPU)" for m in names),
          flush=True)
  load = reports.load_record(loadavg_before, sampler)
  results = {}
  for mode in names:
    results[mode] = {"metrics": built[mode][3], "xla_cost": built[mode][4]}
    for what, t in (("wall", times), ("cpu", cpu_times)):
      ratios = [100 * (x / base - 1) for x, base in zip(t[mode], t["none"])]
      results[mode] |= {f"{what}_median_step_ms": 1e3 * statistics.median(t[mode]),
                        f"{what}_overhead_pct_median": statistics.median(ratios),
                        f"{what}_overhead_pct_per_round": ratios, f"{what}_step_s": t[mode]}
  _report(args, results, load, jax.devices())


def _log_every(config: str) -> int:
  import jaxtrain as jt

  return jt.load_config(config).train.log_every


def _report(args, results: dict, load: dict, devices) -> None:
  machine = reports.machine_info()
  out = Path(args.out) if args.out else reports.results_dir(NAME)
  out.mkdir(parents=True, exist_ok=True)
  report = {"when": reports.timestamp(), "config": args.config, "rounds": args.rounds,
            "steps_per_round": args.steps, "devices": [str(d) for d in devices],
            "results": results, "machine": machine, "load": load, "goal_pct": GOAL_PCT}
  (out / "group_stats.json").write_text(json.dumps(report, indent=2) + "\n")
  base = results["none"]["xla_cost"]
  rows = [[m, r["metrics"]] + [x for what in ("wall", "cpu") for x in (
      f"{r[f'{what}_median_step_ms']:.2f}",
      "-" if m == "none" else f"{r[f'{what}_overhead_pct_median']:+.2f}%")]
      + [f"{100 * (r['xla_cost'][k] / base[k] - 1):+.2f}%" if base[k] else "n/a"
         for k in ("flops", "bytes accessed")]
      + ["-" if m == "none" else ("met" if r["cpu_overhead_pct_median"] < GOAL_PCT else "not met")]
      for m, r in results.items()]
  table = reports.markdown_table(["log.group_stats", "metrics per step", "wall ms per step (median)",
                                 "wall overhead", "CPU ms per step (median)", "CPU overhead",
                                 "XLA FLOPs", "XLA bytes accessed", f"goal < {GOAL_PCT:g}% (CPU)"],
                                rows)
  md = (f"# Per-group statistics: cost in {Path(args.config).name}'s train step ({report['when']})\n\n"
        f"- {reports.cpu_line(machine)}; python {machine['python']}, jax {machine['versions']['jax']}\n"
        f"- {len(devices)} XLA CPU device(s), as `python -m jaxtrain` splits this machine; "
        f"{args.rounds} interleaved rounds of {args.steps} steps per mode\n"
        f"- load: {reports.load_line(load)}\n\n{table}\n\n"
        f"The step computes the statistics on every step; the loop reads them every "
        f"train.log_every steps (this config: {_log_every(args.config)}). "
        "Overhead: per round, each mode's seconds per step over none's in the same round; the "
        "median over rounds. CPU: the process's CPU time (all its threads), steadier than wall "
        "time when other work shares the cores. The loop copies the statistics from the device "
        "only on log steps (not timed here). XLA FLOPs and bytes accessed: the compiled step's "
        "own cost analysis against none's.\n")
  (out / "group_stats.md").write_text(md)
  reports.bar_chart(str(out / "group_stats.png"),
                   {what: {m: r[f"{what}_median_step_ms"] for m, r in results.items()}
                    for what in ("wall", "cpu")}, "median ms per step",
                   f"{Path(args.config).name}: train step by log.group_stats")
  print(md)


if __name__ == "__main__":
  main()
