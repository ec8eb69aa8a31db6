"""The float32 embedding gradient, scatter-free cross-entropy and float32 head logits on this CPU:
the train step before and after, and the embedding's gradient alone for three ways ids fall.

    python benchmarks/embed_grad.py --rounds=15 --round-s=2

Train steps: each config's step as `python -m jaxtrain` builds it (`startup.settle`, then
`programs.build`), compiled three ways in one worker process: "after" is the code as it is;
"before" has the lookup, loss and head as they were (nnx.Embed's lookup: the whole table cast to
the compute dtype and jnp.take's gradient in it; optax's cross-entropy; logits rounded to the
compute dtype, then converted); "scatter-free" is the step as a GPU gets it
(`programs.scatter_free`), run here. Each round times about --round-s seconds of steps of each,
the order rotating; a change is the median over rounds of variant / before - 1.

The gradient alone: `ops.embed`'s backward passes ("scatter", the CPU's, and "scan", the GPU's)
and the candidates weighed against them, at --tokens x vocab 50304 x --width, for one id
throughout, uniform ids and Zipfian ids, in interleaved rounds (medians). Writes
embed_grad.{json,md,png} to --out (default benchmarks/results/<date>-embed_grad/).
"""

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "embed_grad"
VOCAB = 50304
# name: (config file, overrides, vocabulary for its random tokens)
STEPS = {
    "nano": ("configs/nano.py", {}, 256),
    "shakespeare_char": ("configs/shakespeare_char.py", {}, 65),
    "vocab50k-f32": ("", {"model.n_layers": 2, "model.d_model": 128, "model.n_heads": 2,
                          "model.seq_len": 256, "train.batch_size": 8}, VOCAB),
    "vocab50k-bf16": ("", {"model.n_layers": 2, "model.d_model": 128, "model.n_heads": 2,
                           "model.seq_len": 256, "train.batch_size": 8, "model.dtype": "bfloat16"},
                      VOCAB),
}
DISTRIBUTIONS = ("equal", "uniform", "zipf")
ONEHOT_MAX_FLOPS = 2e11  # the one-hot matmul only where it takes seconds, not minutes, here
ACTIVE: list = []  # the workers alive now: their CPU time is ours, not background load


VARIANTS = ("before", "after", "scatter-free")


@contextlib.contextmanager
def variant_of(variant: str):
  """The code of `variant` while a step is built: "after" is the code as it is; "before" has the
  lookup, loss and head as they were; "scatter-free" builds the step as on a GPU."""
  import jax.numpy as jnp
  import optax

  from jaxtrain.core import loss, ops, programs
  saved = ops.embed, ops.dense_f32, loss.token_losses, programs.scatter_free
  if variant == "before":
    ops.embed = lambda table, ids, dtype, grad: jnp.take(table.astype(dtype), ids, axis=0)
    ops.dense_f32 = lambda x, w: ops.dense(x, w).astype(jnp.float32)
    loss.token_losses = lambda x, t, scatter_free=False: optax.softmax_cross_entropy_with_integer_labels(x, t)
  elif variant == "scatter-free":
    programs.scatter_free = lambda platform: True
  try:
    yield
  finally:
    ops.embed, ops.dense_f32, loss.token_losses, programs.scatter_free = saved


class StepVariants:
  """In a worker: one config's train step compiled as each of VARIANTS, each with its own state."""

  def __init__(self, name: str):
    import numpy as np

    import jaxtrain as jt
    from jaxtrain.system import startup

    path, overrides, vocab = STEPS[name]
    cfg = jt.load_config(str(ROOT / path), **overrides) if path else \
        jt.override(jt.default_config(), **{"model.vocab_size": vocab, **overrides})
    startup.settle(cfg, by="benchmarks/embed_grad.py")
    rng = np.random.default_rng(0)
    self.runs, self.info = {}, {}
    for variant in VARIANTS:
      with variant_of(variant):
        programs = jt.build(cfg, vocab, startup.devices())
        step = programs.compile_train()
      batches = [programs.place({"tokens": rng.integers(0, vocab, programs.batch_shape).astype(np.int32)})
                 for _ in range(2)]
      state, metrics = step(programs.init(), batches[0])
      self.runs[variant] = [step, state, batches]
      cost = step.cost_analysis()  # XLA's own count, free of the machine's load
      cost = [cost] if isinstance(cost, dict) else cost
      self.info[variant] = {"first_loss": float(metrics["loss"]),
                            "warmup_step_s": self.time(variant, 1)[0],
                            **{k: float(sum(c.get(k, 0.0) for c in cost if c))
                               for k in ("flops", "bytes accessed")}}
    c = programs.model_cfg
    self.info |= {"model": f"{c.n_layers} x {c.d_model}, vocab {c.vocab_size}, {c.dtype}, "
                           f"batch {programs.batch_shape[0]} x {c.seq_len}",
                  "devices": len(startup.devices())}

  def describe(self) -> dict:
    return self.info

  def time(self, variant: str, n: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step over `n` steps."""
    import jax

    step, state, batches = self.runs[variant]
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
      state, metrics = step(state, batches[i % 2])
    jax.block_until_ready((state.params, metrics))
    self.runs[variant][1] = state
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def ids_of(kind: str, n: int, vocab: int, seed: int = 0):
  import numpy as np

  rng = np.random.default_rng(seed)
  if kind == "equal":
    return np.full(n, 7, np.int32)
  if kind == "uniform":
    return rng.integers(0, vocab, n).astype(np.int32)
  ranks = rng.zipf(1.1, 8 * n)  # Zipf's law, as ranks in a shuffled vocabulary
  return rng.permutation(vocab)[ranks[ranks <= vocab][:n] - 1].astype(np.int32)


def gradients(vocab: int) -> dict:
  """name: (ids_N, g_ND) -> float32 gradient of the [vocab, D] table, jitted."""
  import jax
  import jax.numpy as jnp

  from jaxtrain.core import ops

  def take(dtype):  # nnx.Embed's way: the table cast whole, jnp.take's gradient in that dtype
    return lambda ids, g: jax.vjp(lambda t: jnp.take(t.astype(dtype), ids, axis=0),
                                  jnp.zeros((vocab, g.shape[1])))[1](g.astype(dtype))[0]

  def embed(dtype, grad):
    return lambda ids, g: jax.vjp(lambda t: ops.embed(t, ids, dtype, grad),
                                  jnp.zeros((vocab, g.shape[1])))[1](g.astype(dtype))[0]

  def sorted_segment_sum(ids, g):  # candidate (a): on XLA:GPU, a scatter with sorted indices
    order = jnp.argsort(ids)
    return jax.ops.segment_sum(g[order], ids[order], vocab, indices_are_sorted=True)

  def one_hot(ids, g, chunk=1024):  # candidate (b): one_hot(ids).T @ g, a chunk of tokens at a time
    def add(acc, xs):
      return acc + jax.nn.one_hot(xs[0], vocab, dtype=g.dtype).T @ xs[1], None
    chunks = (ids.reshape(-1, chunk), g.reshape(-1, chunk, g.shape[1]))
    return jax.lax.scan(add, jnp.zeros((vocab, g.shape[1]), g.dtype), chunks)[0]

  return {name: jax.jit(f) for name, f in {
      "before: take, float32": take(jnp.float32), "before: take, bfloat16": take(jnp.bfloat16),
      "scatter (the CPU's), float32": embed(jnp.float32, "scatter"),
      "scatter (the CPU's), bfloat16 rows": embed(jnp.bfloat16, "scatter"),
      "scan (the GPU's), float32": embed(jnp.float32, "scan"),
      "sorted segment_sum, float32": sorted_segment_sum, "one-hot matmul, float32": one_hot}.items()}


class GradTimer:
  """In a worker: the embedding gradient alone, every way, for every distribution of ids."""

  def __init__(self, tokens: int, width: int):
    import jax
    import numpy as np

    g = jax.random.normal(jax.random.PRNGKey(0), (tokens, width))
    skip = set() if 2 * tokens * VOCAB * width <= ONEHOT_MAX_FLOPS else {"one-hot matmul, float32"}
    self.fns = {k: f for k, f in gradients(VOCAB).items() if k not in skip}
    self.cases = {kind: (jax.numpy.asarray(ids_of(kind, tokens, VOCAB)), g) for kind in DISTRIBUTIONS}
    exact = {}  # (distribution, bfloat16 cotangents): the float64 sums
    for kind, (ids, _) in self.cases.items():
      for bf16 in (False, True):
        exact[kind, bf16] = np.zeros((VOCAB, width))
        rows = np.asarray(g.astype("bfloat16") if bf16 else g, np.float64)
        np.add.at(exact[kind, bf16], np.asarray(ids), rows)
    self.max_error = {name: {kind: float(np.abs(np.asarray(f(*self.cases[kind]), np.float64)
                                                - exact[kind, "bfloat16" in name]).max())
                             for kind in DISTRIBUTIONS}
                      for name, f in self.fns.items()}  # (also compiles every case)

  def describe(self) -> dict:
    return {"variants": list(self.fns), "max_error": self.max_error}

  def time(self, variant: str, kind: str) -> float:
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(self.fns[variant](*self.cases[kind]))
    return time.perf_counter() - t0


def _worker(label: str, factory, *args) -> common.Worker:
  worker = common.Worker(label, factory, *args)
  ACTIVE.append(worker)
  return worker


def _close(worker: common.Worker) -> None:
  ACTIVE.remove(worker)
  worker.close()


def run_steps(names: list[str], rounds: int, round_s: float, sampler: common.LoadSampler) -> dict:
  """Per config, `rounds` rounds of every variant (the order rotating), each timed over the steps
  that take about `round_s` seconds (at least 2); changes are against "before" in the same round."""
  results = {}
  for name in names:
    sampler.label = name
    worker = _worker(name, StepVariants, name)
    try:
      info = worker.call("describe")
      n = max(2, math.ceil(round_s / info["before"]["warmup_step_s"]))
      t = {v: {"wall": [], "cpu": []} for v in VARIANTS}
      for r in range(rounds):
        for variant in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
          wall, cpu_s = worker.call("time", variant=variant, n=n)
          t[variant]["wall"].append(wall)
          t[variant]["cpu"].append(cpu_s)
      change = {v: {k: [100 * (a / b - 1) for a, b in zip(t[v][k], t["before"][k])]
                    for k in ("wall", "cpu")} for v in VARIANTS[1:]}
      results[name] = {**info, "steps_per_round": n, "step_s": t, "change_pct_per_round": change,
                       "median_ms": {v: {k: 1e3 * statistics.median(t[v][k]) for k in t[v]} for v in t},
                       "change_pct_median": {v: {k: statistics.median(x) for k, x in c.items()}
                                             for v, c in change.items()}}
      reports.log(f"{name}: " + ", ".join(f"{v} {results[name]['median_ms'][v]['wall']:.1f} ms"
                                          for v in VARIANTS) + " per step (wall, medians); CPU time "
                  + ", ".join(f"{v} {c['cpu']:+.1f}%" for v, c in results[name]["change_pct_median"].items()))
    finally:
      _close(worker)
  return results


def run_gradients(tokens: int, width: int, rounds: int, sampler: common.LoadSampler) -> dict:
  sampler.label = "gradients"
  worker = _worker("gradients", GradTimer, tokens, width)
  try:
    info = worker.call("describe")
    times = {name: {kind: [] for kind in DISTRIBUTIONS} for name in info["variants"]}
    for r in range(rounds):
      names = info["variants"] if r % 2 == 0 else info["variants"][::-1]
      for kind in DISTRIBUTIONS:
        for name in names:
          times[name][kind].append(worker.call("time", variant=name, kind=kind))
    medians = {name: {kind: 1e3 * statistics.median(t) for kind, t in by.items()}
               for name, by in times.items()}
    return {**info, "tokens": tokens, "width": width, "vocab": VOCAB, "times_s": times,
            "median_ms": medians}
  finally:
    _close(worker)


def _range(xs: list[float]) -> tuple[float, float]:
  return min(xs), max(xs)


def markdown(report: dict) -> str:
  m, load, a = report["machine"], report["load"], report["args"]
  others = lambda label: load["sampler"]["by_label"].get(label, {}).get("other_pct", {}).get("mean")
  step_rows = []
  for name, r in report["steps"].items():
    c, ms = r["change_pct_median"], r["median_ms"]
    step_rows.append([
        name, r["model"], r["devices"], r["steps_per_round"], f"{ms['before']['wall']:.1f}",
        f"{ms['after']['wall']:.1f}", f"{c['after']['wall']:+.1f}%",
        "{:+.0f}% .. {:+.0f}%".format(*_range(r["change_pct_per_round"]["after"]["wall"])),
        f"{c['after']['cpu']:+.1f}%",
        *(f"{100 * (r['after'][k] / r['before'][k] - 1):+.2f}%" for k in ("flops", "bytes accessed")),
        f"{ms['scatter-free']['wall']:.1f}", f"{c['scatter-free']['wall']:+.1f}%",
        f"{c['scatter-free']['cpu']:+.1f}%", others(name)])
  g = report["gradients"]
  grad_rows = [[name] + [f"{g['median_ms'][name][k]:.2f}" for k in DISTRIBUTIONS]
               + [f"{max(g['max_error'][name].values()):.1e}"] for name in g["variants"]]
  return "\n".join([
      f"# Embedding gradient, cross-entropy and head logits on the CPU ({report['when']})", "",
      f"- {reports.cpu_line(m)}; python {m['python']}, jax {m['versions']['jax']}",
      "- compare the variants of one row, timed in the same rounds, not rows or days; the load "
      "line and the others' CPU % column say how much other work shared the machine",
      f"- load: {reports.load_line(load)}", "",
      f"## Train step: before, after, and the GPU's scatter-free step ({a['rounds']} rounds, "
      f"the order rotating, of ~{a['round_s']} s of steps per variant)",
      "", reports.markdown_table(
          ["config", "model", "XLA devices", "steps/round", "before ms/step", "after ms/step",
           "after: change (median of rounds)", "after: range over rounds", "after: CPU-time change",
           "after: XLA FLOPs", "after: XLA bytes", "scatter-free ms/step", "scatter-free: change",
           "scatter-free: CPU-time change", "others' CPU %"], step_rows),
      "", "before: nnx.Embed's lookup (the whole table cast to the compute dtype, jnp.take's "
      "gradient), optax's cross-entropy, logits rounded to the compute dtype then converted. "
      "after: the step as built on this CPU now (ops.embed with the scatter in float32, optax's "
      "cross-entropy, ops.dense_f32). scatter-free: the step as built on a GPU (ops.embed's scan, "
      "the masked-sum cross-entropy, ops.dense_f32), run here. ms/step: median wall time. "
      "change: per round, the variant / before - 1; the median over rounds. CPU-time change: the "
      "same from the process's CPU time, steadier when other work shares the cores. XLA FLOPs "
      "and bytes: the compiled steps' own cost analysis against before's (free of the load). "
      "others' CPU %: the share of the whole machine other processes used while the row was "
      "timed (50: one of 2 cores busy elsewhere).", "",
      f"## The embedding gradient alone: {g['tokens']} tokens, vocab {g['vocab']}, width "
      f"{g['width']} ({a['rounds']} interleaved rounds, median ms; others' CPU % "
      f"{others('gradients')})", "",
      reports.markdown_table(["backward pass", *DISTRIBUTIONS, "max error vs float64"], grad_rows),
      "", "equal: one id throughout; uniform: ids uniform over the vocabulary; zipf: Zipf's law "
      "(s = 1.1) over a shuffled vocabulary. Cotangents: standard normal float32, rounded to "
      "bfloat16 in the bfloat16 rows. max error: the largest absolute difference from the "
      "float64 sum of the cotangents the row was given, over the three distributions. "
      "The one-hot matmul runs only where it costs under "
      f"{ONEHOT_MAX_FLOPS / 1e9:.0f} GFLOP.", ""])


def chart(path: Path, report: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  steps, g = report["steps"], report["gradients"]
  fig = plt.figure(figsize=(12, 7))
  grid = fig.add_gridspec(2, max(len(steps), 1))
  for i, (name, r) in enumerate(steps.items()):
    ax = fig.add_subplot(grid[0, i])
    bars = ax.bar(VARIANTS, [r["median_ms"][v]["wall"] for v in VARIANTS], color=["C7", "C0", "C1"])
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    c = r["change_pct_median"]
    ax.set_title(f"{name}\nCPU time: after {c['after']['cpu']:+.1f}%, scatter-free "
                 f"{c['scatter-free']['cpu']:+.1f}%", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.margins(y=0.15)
  if steps:
    fig.axes[0].set_ylabel("train step, ms (median)")
  ax = fig.add_subplot(grid[1, :])
  x, width = np.arange(len(DISTRIBUTIONS)), 0.8 / len(g["variants"])
  for j, name in enumerate(g["variants"]):
    ax.bar(x + j * width, [g["median_ms"][name][k] for k in DISTRIBUTIONS], width, label=name)
  ax.set_xticks(x + 0.4 - width / 2, DISTRIBUTIONS)
  ax.set_yscale("log")
  ax.set_ylabel("embedding gradient, ms (median)")
  ax.legend(fontsize=7, ncol=2)
  fig.suptitle(f"{reports.machine_name(report['machine'])}: train steps (top); the embedding gradient "
               f"alone, {g['tokens']} tokens x vocab {g['vocab']} x width {g['width']} (bottom)",
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--configs", default=",".join(STEPS), help=f"comma list of {', '.join(STEPS)}")
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--round-s", type=float, default=1.5,
                 help="seconds of steps per variant per round (at least 2 steps)")
  p.add_argument("--tokens", type=int, default=8192, help="tokens of the gradient alone")
  p.add_argument("--width", type=int, default=128, help="embedding width of the gradient alone")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  env = common.use_jaxtrain_environment()  # the workers start as `python -m jaxtrain` does
  loadavg_before = os.getloadavg()
  with common.LoadSampler(lambda: [os.getpid(), *(w.pid for w in list(ACTIVE))]) as sampler:
    steps = run_steps([c for c in args.configs.split(",") if c], args.rounds, args.round_s, sampler)
    gradients_alone = run_gradients(args.tokens, args.width, args.rounds, sampler)
  report = {"when": reports.timestamp(), "args": vars(args), "environment_set": env,
            "steps": steps, "gradients": gradients_alone, "machine": reports.machine_info(),
            "load": reports.load_record(loadavg_before, sampler)}
  md = markdown(report)
  print(md)
  reports.write(Path(args.out) if args.out else reports.results_dir(NAME), NAME, report, md,
                lambda path: chart(path, report))


if __name__ == "__main__":
  main()
