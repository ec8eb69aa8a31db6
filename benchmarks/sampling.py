"""Sampling speed: tokens/s of generation with the key-value cache against the whole window run
through the model for every token (`use_cache=False`, the same tokens), in alternating rounds.

    python benchmarks/sampling.py --config=configs/nano.py --new-tokens=128,512 --rounds=3

One prompt (batch 1, --prompt-tokens long) of a fresh model of the config's shape (speed does not
depend on the values), greedy. Each (mode, length) is compiled and run once before timing; each
round times every (mode, length) once, so load that comes and goes hits both modes alike; the
report gives medians and the cache's speed-up within each round. Goal: >= 10x at 512 new tokens
for nano on a CPU. Writes sampling.{json,md} to --out (default benchmarks/results/<date>-sampling/).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "sampling"
GOAL = 10.0


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(ROOT / "configs" / "nano.py"))
  p.add_argument("--new-tokens", default="128,512", help="comma list of lengths")
  p.add_argument("--prompt-tokens", type=int, default=32)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import numpy as np

  import jaxtrain as jt

  cfg = jt.load_config(args.config, **{"mesh.cpu_devices": 1})
  state = jt.build(cfg, cfg.model.vocab_size or 256, jax.devices()[:1]).init()
  prompt = np.random.default_rng(0).integers(0, 256, (1, args.prompt_tokens)).astype(np.int32)
  lengths = [int(x) for x in args.new_tokens.split(",")]
  cases = [(mode, n) for n in lengths for mode in ("cache", "no cache")]

  def once(mode: str, n: int) -> float:
    t0 = time.perf_counter()
    out = jt.generate(state, prompt, n, temperature=0.0, use_cache=mode == "cache")
    assert out.shape == (1, args.prompt_tokens + n)
    return time.perf_counter() - t0

  compile_s = {}
  for mode, n in cases:  # compiles, and runs once
    compile_s[f"{mode}/{n}"] = round(once(mode, n), 3)
    print(f"first call {mode} {n}: {compile_s[f'{mode}/{n}']:.2f}s", flush=True)
  times = {f"{m}/{n}": [] for m, n in cases}
  loadavg_before = os.getloadavg()
  with common.LoadSampler(lambda: [os.getpid()]) as sampler:
    for r in range(args.rounds):
      for mode, n in cases:
        times[f"{mode}/{n}"].append(once(mode, n))
      print(f"round {r + 1}/{args.rounds}: " + ", ".join(
          f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
  load = reports.load_record(loadavg_before, sampler)
  rows, results = [], []
  for n in lengths:
    cached, plain = times[f"cache/{n}"], times[f"no cache/{n}"]
    ratios = [b / a for a, b in zip(cached, plain)]
    result = {"new_tokens": n, "cache_tokens_per_s": n / statistics.median(cached),
              "no_cache_tokens_per_s": n / statistics.median(plain),
              "speedup_median": statistics.median(ratios), "speedup_per_round": ratios,
              "cache_s": cached, "no_cache_s": plain}
    results.append(result)
    rows.append([n, f"{result['cache_tokens_per_s']:,.0f}", f"{result['no_cache_tokens_per_s']:,.0f}",
                 f"{result['speedup_median']:.1f}x ({', '.join(f'{x:.1f}' for x in ratios)})",
                 "met" if result["speedup_median"] >= GOAL else "not met"])
  machine = reports.machine_info()
  out = Path(args.out) if args.out else reports.results_dir(NAME)
  c = state.model_cfg
  report = {"when": reports.timestamp(), "config": args.config, "prompt_tokens": args.prompt_tokens,
            "rounds": args.rounds, "model": {"n_layers": c.n_layers, "d_model": c.d_model,
                                             "seq_len": c.seq_len, "params": jt.param_count(c)},
            "first_call_s": compile_s, "results": results, "machine": machine, "load": load}
  table = reports.markdown_table(
      ["new tokens", "cache tokens/s", "no cache tokens/s", "speed-up: median (per round)",
       f"goal >= {GOAL:.0f}x"], rows)
  md = (f"# Sampling speed: {Path(args.config).name} ({report['when']})\n\n"
        f"- {reports.cpu_line(machine)}; python {machine['python']}, jax {machine['versions']['jax']}\n"
        f"- model: {c.n_layers} layers x {c.d_model}, seq_len {c.seq_len}, "
        f"{report['model']['params'] / 1e6:.2f}M params; batch 1, a {args.prompt_tokens}-token "
        "prompt, greedy; one XLA CPU device\n"
        f"- {args.rounds} alternating round(s); load: {reports.load_line(load)}\n\n{table}\n\n"
        "no cache: the whole window (seq_len tokens) through the model for every new token, "
        "the same windows and the same tokens as with the cache. Past seq_len the window "
        "restarts from its last seq_len/2 tokens (one prefill per seq_len/2 tokens).\n")
  print(md)
  reports.write(out, NAME, report, md)


if __name__ == "__main__":
  main()
