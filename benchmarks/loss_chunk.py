"""Memory and speed of the chunked (`model.loss_chunk`) and the fused (`model.fused_loss`)
cross-entropy against the whole-batch one.

  python benchmarks/loss_chunk.py                      # vocab 50304, 8 x 256 tokens, on this CPU
  python benchmarks/loss_chunk.py --chunks=0,512,2048,fused --batch=16 --dtype=bfloat16

One gradient of `jaxtrain.core.steps.loss_fn` (model forward, loss, backward) per row, jitted.
Memory is XLA's plan for the compiled program: its temporary buffers (activations, logits and
their gradients; the params and gradients themselves are arguments and outputs). Time is the
median over --rounds rounds (rows in rotating order) of --steps calls each, after one untimed
one; the load average before and after is in the JSON. Writes loss_chunk.{json,md,png} to --out
(default benchmarks/results/<date>-loss_chunk/).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402  (after the path above)
from flax import nnx  # noqa: E402

from jaxtrain.core import model as model_lib  # noqa: E402
from jaxtrain.core import steps  # noqa: E402


def prepare(c: model_lib.ModelConfig, batch: int) -> tuple[dict, Callable[[], float]]:
  """(the row: the loss option, XLA's temporary bytes, compile seconds, the loss; a call that runs
  one gradient step) for the model `c`, compiled and run once."""
  graphdef, params = nnx.split(model_lib.GPT(c, nnx.Rngs(0)), nnx.Param)
  params = nnx.to_pure_dict(params)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, c.seq_len + 1), 0, c.vocab_size)
  grad = jax.jit(lambda params, tokens: jax.value_and_grad(steps.loss_fn)(params, graphdef, tokens))
  t = time.perf_counter()
  compiled = grad.lower(params, tokens).compile()
  compile_s = time.perf_counter() - t
  step = lambda: float(jax.block_until_ready(compiled(params, tokens))[0])
  return {"loss_chunk": "fused" if c.fused_loss else c.loss_chunk,
          "temp_bytes": compiled.memory_analysis().temp_size_in_bytes, "compile_s": compile_s,
          "loss": step()}, step


def time_rounds(steps_of: list[Callable[[], float]], rounds: int, n_steps: int) -> list[list[float]]:
  """Seconds per step of each, in `rounds` rounds of `n_steps` steps each, in rotating order."""
  times = [[] for _ in steps_of]
  for r in range(rounds):
    for i in [*range(r % len(steps_of), len(steps_of)), *range(r % len(steps_of))]:
      t = time.perf_counter()
      for _ in range(n_steps):
        steps_of[i]()
      times[i].append((time.perf_counter() - t) / n_steps)
  return times


def markdown(report: dict) -> str:
  a = report["args"]
  rows = ["| loss | temporary bytes | MiB | vs whole | step ms | vs whole | loss |",
          "|---|---|---|---|---|---|---|"]
  base = report["rows"][0]
  for r in report["rows"]:
    name = r["loss_chunk"] if r["loss_chunk"] == "fused" else \
        f"loss_chunk={r['loss_chunk']}" if r["loss_chunk"] else "whole"
    rows.append(f"| {name} | {r['temp_bytes']:,} | {r['temp_bytes'] / 2**20:.1f} | "
                f"{r['temp_bytes'] / base['temp_bytes']:.2f}x | {r['step_s'] * 1000:.0f} | "
                f"{r['step_s'] / base['step_s']:.2f}x | {r['loss']:.6f} |")
  return "\n".join([
      f"# Cross-entropy whole, chunked and fused ({report['date']})", "",
      f"{report['device']}, jax {jax.__version__}; model {a['layers']} x {a['d_model']}, vocab "
      f"{a['vocab']}, micro-batch {a['batch']} x {a['seq_len']} tokens, {a['dtype']}; median of "
      f"{a['rounds']} rounds of {a['steps']} gradient steps (rotating order; load average "
      f"{report['loadavg']['before'][0]:.1f} before, {report['loadavg']['after'][0]:.1f} after). "
      f"Whole-batch float32 logits and their gradient alone: "
      f"{2 * a['batch'] * a['seq_len'] * a['vocab'] * 4 / 2**20:.0f} MiB.", "", *rows, ""])


def plot(path: Path, report: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [str(r["loss_chunk"] or "off") for r in report["rows"]]
  fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
  left.bar(names, [r["temp_bytes"] / 2**20 for r in report["rows"]], color="C0")
  left.set(xlabel="model.loss_chunk", ylabel="temporary memory (MiB)")
  right.bar(names, [r["step_s"] * 1000 for r in report["rows"]], color="C1")
  right.set(xlabel="model.loss_chunk", ylabel="gradient step (ms)")
  fig.suptitle(f"Cross-entropy whole, chunked and fused, vocab {report['args']['vocab']}")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--chunks", default="0,256,1024,fused", help="loss_chunk values; fused: fused_loss")
  p.add_argument("--dtype", default="float32")
  p.add_argument("--vocab", type=int, default=50304)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--d_model", type=int, default=128)
  p.add_argument("--seq_len", type=int, default=256)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--steps", type=int, default=3, help="steps of each row a round")
  p.add_argument("--rounds", type=int, default=3, help="rounds over the rows, in rotating order")
  p.add_argument("--out", type=Path, default=ROOT / f"benchmarks/results/{datetime.date.today()}-loss_chunk")
  a = p.parse_args(argv)
  rows, steps_of, load_before = [], [], os.getloadavg()
  for chunk in a.chunks.split(","):
    fused = chunk == "fused"
    c = model_lib.ModelConfig(vocab_size=a.vocab, n_layers=a.layers, n_heads=max(a.d_model // 64, 1),
                              d_model=a.d_model, seq_len=a.seq_len, dtype=a.dtype,
                              loss_chunk=0 if fused else int(chunk), fused_loss=fused)
    row, step = prepare(c, a.batch)
    rows.append(row)
    steps_of.append(step)
    print(json.dumps(row), flush=True)
  for row, times in zip(rows, time_rounds(steps_of, a.rounds, a.steps)):
    row.update(step_s=statistics.median(times), step_s_rounds=times)
  report = {"date": str(datetime.date.today()), "device": str(jax.devices()[0].device_kind),
            "args": {k: v for k, v in vars(a).items() if k != "out"}, "rows": rows,
            "loadavg": {"before": load_before, "after": os.getloadavg()}}
  a.out.mkdir(parents=True, exist_ok=True)
  (a.out / "loss_chunk.json").write_text(json.dumps(report, indent=1))
  (a.out / "loss_chunk.md").write_text(markdown(report))
  plot(a.out / "loss_chunk.png", report)
  print(markdown(report))


if __name__ == "__main__":
  main()
