"""Shared pieces of the benchmarks' measurements: shapes, cores, background load, matmul peak and
worker processes (reports.py renders what they measured).

Nothing here imports jax or torch at module level: a worker process imports only the framework
it times, and the parent imports neither.
"""

import dataclasses
import os
import statistics
import threading
import time
import traceback
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
  name: str
  n_layers: int
  n_heads: int
  d_model: int
  seq_len: int
  batch_size: int
  vocab_size: int

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_len

  def describe(self) -> str:
    return (f"{self.n_layers} layers x {self.d_model} wide, {self.n_heads} heads, "
            f"T={self.seq_len}, "
            f"B={self.batch_size}, vocab {self.vocab_size}")


SHAPES = {
    "tiny": Shape("tiny", n_layers=2, n_heads=2, d_model=32, seq_len=16, batch_size=4,
                  vocab_size=65),
    # nanoGPT's shakespeare_char CPU shape, and its GPU shape.
    "small": Shape("small", n_layers=4, n_heads=4, d_model=128, seq_len=64, batch_size=12,
                   vocab_size=65),
    "large": Shape("large", n_layers=6, n_heads=6, d_model=384, seq_len=256, batch_size=64,
                   vocab_size=65),
}


def gpt2_config(shape: Shape):
  """The jaxtrain config of the GPT-2 layout at `shape`: LayerNorm, learned positions, GELU,
  tied embeddings."""
  from jaxtrain.config.defaults import default_config

  cfg = default_config()
  for field in ("n_layers", "n_heads", "d_model", "seq_len", "vocab_size"):
    cfg.model[field] = getattr(shape, field)
  cfg.model.norm, cfg.model.pos, cfg.model.mlp = "layernorm", "learned", "gelu"
  cfg.model.tie_embeddings, cfg.model.dropout, cfg.model.dtype = True, 0.0, "float32"
  cfg.train.batch_size, cfg.train.grad_accum = shape.batch_size, 1
  return cfg


@dataclasses.dataclass(frozen=True)
class Hyper:
  """The optimizer settings both frameworks train with, read from one jaxtrain config."""
  lr: float
  min_lr_ratio: float
  warmup_steps: int
  decay_steps: int
  max_steps: int
  weight_decay: float
  clip_norm: float
  b1: float
  b2: float
  eps: float

  @classmethod
  def from_config(cls, cfg) -> "Hyper":
    o = cfg.optim
    return cls(lr=o.lr, min_lr_ratio=o.min_lr_ratio, warmup_steps=o.warmup_steps,
               decay_steps=o.decay_steps, max_steps=cfg.train.max_steps,
               weight_decay=o.weight_decay, clip_norm=o.clip_norm, b1=o.b1, b2=o.b2, eps=o.eps)


def token_batches(shape: Shape, seed: int, n: int = 8) -> list[np.ndarray]:
  """`n` batches of uniform random tokens, int32[B, T+1]; the same for every framework."""
  rng = np.random.default_rng(seed)
  return [rng.integers(0, shape.vocab_size, (shape.batch_size, shape.seq_len + 1)).astype(np.int32)
          for _ in range(n)]


# ---- statistics ----------------------------------------------------------------------------

def summarize(times_s: list[float]) -> dict:
  q = np.percentile(times_s, [10, 50, 90])
  return {"n": len(times_s), "median_s": float(q[1]), "p10_s": float(q[0]), "p90_s": float(q[2]),
          "min_s": min(times_s), "max_s": max(times_s)}


# ---- machine -------------------------------------------------------------------------------

def available_cores() -> int:
  return len(os.sched_getaffinity(0))


def pin_cores(threads: int) -> None:
  """Restricts this process to its first `threads` cores (before the framework starts its pool).

  XLA sizes its CPU thread pool from the affinity mask, so this is the one knob both frameworks
  obey; torch also gets torch.set_num_threads.
  """
  cores = sorted(os.sched_getaffinity(0))
  if threads < len(cores):
    os.sched_setaffinity(0, cores[:threads])


def jaxtrain_environment() -> dict:
  """The variables `python -m jaxtrain` sets for itself when it starts (mimalloc preloaded, huge
  pages: jaxtrain/system/allocator.py) that this process does not have yet."""
  from jaxtrain.system import startup

  env = startup.restart_environment(argv=["--jax_platforms=cpu"]) or {}  # the workers' platform
  return {k: v for k, v in env.items() if os.environ.get(k) != v}


def use_jaxtrain_environment() -> dict:
  """Applies `jaxtrain_environment()` here, so that every worker this benchmark spawns starts
  under it, as `python -m jaxtrain` runs. Returns what it set, for the report."""
  changes = jaxtrain_environment()
  os.environ.update(changes)
  return changes


# ---- background load -----------------------------------------------------------------------

def _process_ticks(pid: int) -> int:
  """utime + stime of every thread of `pid` (0 once it is gone)."""
  try:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
  except OSError:
    return 0
  return int(fields[11]) + int(fields[12])


def cpu_snapshot(pids: list[int]) -> dict:
  """CPU ticks since boot: machine-wide busy, steal and total, and each of `pids`' own."""
  with open("/proc/stat") as f:
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
  busy = user + nice + system + irq + softirq
  return {"busy": busy, "steal": steal, "total": busy + idle + iowait + steal,
          "own": {p: _process_ticks(p) for p in pids}}


def cpu_share(before: dict, after: dict) -> dict | None:
  """Percent of the whole machine (all cores) between two snapshots: busy, ours, others', steal.

  The benchmark keeps the cores busy itself, so busy% alone says little; `other_pct` is what
  every process but ours used. A process that started in between counts from zero.
  """
  dt = after["total"] - before["total"]
  if dt <= 0:
    return None
  own = sum(max(t - before["own"].get(p, 0), 0) for p, t in after["own"].items() if t)
  busy = 100 * (after["busy"] - before["busy"]) / dt
  own_pct = min(100 * own / dt, busy)
  return {"busy_pct": round(busy, 1), "own_pct": round(own_pct, 1),
          "other_pct": round(busy - own_pct, 1),
          "steal_pct": round(100 * (after["steal"] - before["steal"]) / dt, 1)}


def ours() -> list[int]:
  """This process and the processes it started (their CPU time is not background load)."""
  pid = os.getpid()
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [pid, *map(int, f.read().split())]
  except OSError:
    return [pid]


class LoadSampler:
  """`cpu_share` of our `pids()` every `interval_s`, in a background thread, for the whole run.

  `label` tags the samples that follow it.
  """

  def __init__(self, pids: Callable[[], list[int]], interval_s: float = 0.5):
    self.pids, self.interval_s = pids, interval_s
    self.label = "setup"
    self.samples: list[dict] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, daemon=True)
    self._t0 = time.time()

  def __enter__(self) -> "LoadSampler":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def _loop(self) -> None:
    before = cpu_snapshot(self.pids())
    while not self._stop.wait(self.interval_s):
      after = cpu_snapshot(self.pids())
      share = cpu_share(before, after)
      if share:
        self.samples.append({"t_s": round(time.time() - self._t0, 2), "label": self.label, **share})
      before = after

  def summary(self) -> dict:
    def stats(samples):
      out = {"samples": len(samples)}
      for key in ("busy_pct", "own_pct", "other_pct", "steal_pct"):
        values = [s[key] for s in samples]
        out[key] = {"mean": round(statistics.fmean(values), 1) if values else None,
                    "max": max(values) if values else None}
      return out

    labels = sorted({s["label"] for s in self.samples})
    return {"interval_s": self.interval_s, "all": stats(self.samples),
            "by_label": {label: stats([s for s in self.samples if s["label"] == label])
                         for label in labels}}


# ---- matmul peak ---------------------------------------------------------------------------

def measure_matmul_peak(dtype: str = "float32", n: int = 2048, repeats: int = 10) -> dict:
  """jaxtrain's own matmul timing (`jaxtrain.measure.estimate.time_matmul`, behind its MFU), uncached."""
  from jaxtrain.measure import estimate

  return _peak_row("jax", dtype, n, repeats, estimate.time_matmul(dtype, n, repeats))


def torch_matmul_peak(dtype: str = "float32", n: int = 2048, repeats: int = 10) -> dict:
  """The same measurement with torch.mm (which runs synchronously on the CPU)."""
  import torch

  a = torch.ones(n, n, dtype=getattr(torch, dtype))
  for _ in range(2):  # first touch of the buffers, thread-pool start
    torch.mm(a, a)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    torch.mm(a, a)
    times.append(time.perf_counter() - t0)
  return _peak_row("torch", dtype, n, repeats, 2 * n**3 / statistics.median(times))


def _peak_row(framework: str, dtype: str, n: int, repeats: int, flops: float) -> dict:
  return {"framework": framework, "dtype": dtype, "n": n, "repeats": repeats,
          "median_s": 2 * n**3 / flops, "gflops": flops / 1e9}


# ---- worker processes ----------------------------------------------------------------------

class WorkerError(RuntimeError):
  pass


def _serve(conn, factory: Callable, args: tuple) -> None:
  try:
    handler = factory(*args)
    conn.send(("ok", None))
  except BaseException:  # any failure goes back to the parent as its traceback
    conn.send(("error", traceback.format_exc()))
    return
  while True:
    name, kwargs = conn.recv()
    if name == "close":
      return
    try:
      conn.send(("ok", getattr(handler, name)(**kwargs)))
    except BaseException:  # as above; the worker serves the next call
      conn.send(("error", traceback.format_exc()))


def environ_with(changes: dict) -> dict:
  """This process's environment with `changes` made (a None value unsets)."""
  env = dict(os.environ)
  _apply(env, changes)
  return env


def _apply(env, changes: dict) -> None:
  for k, v in changes.items():
    if v is None:
      env.pop(k, None)
    else:
      env[k] = v


class Worker:
  """`factory(*args)` built in its own spawned process; `call(name, **kw)` runs its method there.

  One process per framework keeps their thread pools and allocators from meeting.
  """

  def __init__(self, label: str, factory: Callable, *args, environ: dict | None = None):
    """`environ`: variables the worker starts with besides this process's (None: unset)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    self.label = label
    self._conn, child = ctx.Pipe()
    self._proc = ctx.Process(target=_serve, args=(child, factory, args), daemon=True, name=label)
    saved = {k: os.environ.get(k) for k in environ or {}}
    try:  # a spawned process starts with os.environ as it is at start()
      _apply(os.environ, environ or {})
      self._proc.start()
    finally:
      _apply(os.environ, saved)
    child.close()
    self._reply()

  @property
  def pid(self) -> int:
    return self._proc.pid

  def _reply(self):
    while not self._conn.poll(0.5):
      if not self._proc.is_alive():
        raise WorkerError(f"the {self.label} worker died (exit code {self._proc.exitcode})")
    status, value = self._conn.recv()
    if status == "error":
      raise WorkerError(f"the {self.label} worker failed:\n{value}")
    return value

  def call(self, name: str, **kwargs):
    self._conn.send((name, kwargs))
    return self._reply()

  def close(self) -> None:
    if self._proc.is_alive():
      try:
        self._conn.send(("close", {}))
      except OSError:
        pass
      self._proc.join(timeout=30)
    if self._proc.is_alive():
      self._proc.terminate()
      self._proc.join()
