"""This machine's speed for `model.size="auto"` (docs/time-budget.md): the `size_rule.SpeedModel`
the choice reads, fitted to a probe of a few shapes and kept with the machine's other
measurements (system/measured.py), per machine and architecture (every model field but the shape).

Before any probe, a `prior`: the speed model of a reference machine, scaled by how fast a float32
matmul runs here (numpy: measured in milliseconds, before jax starts). It says what a probe would
cost and what the budget can repay (`size_rule.repayable_s`): where that is too little, nothing is
measured and the run says so before spending any of its budget.

The probe times each shape's train step as a run builds it, in a process of its own: the choice is
made before jax starts in the run's process, since the chosen batch decides how the CPU is split
into devices (system/startup.py). The config's own shape (the one a run falls back to) is measured first,
and every compile goes to the run's persistent compile cache: a run that trains a probed shape
reads its train step from there. The process is stopped at its deadline. The step times get a
non-negative fit (every term costs time) to `size_rule.features`, the cold compiles a line in depth.
"""

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import ml_collections
import numpy as np

from jaxtrain.config import extensions, loading
from jaxtrain.measure import size_rule
from jaxtrain.system import fmt, machine, measured, paths, startup
from jaxtrain.system.errors import UserError

Shape = tuple[int, int, int]  # (layers, width, heads)

PROBES = ((2, 64), (2, 128), (3, 96), (4, 128), (4, 192), (6, 256))  # (layers, width), cheapest first
MIN_SHAPES = 2  # a probe cut shorter gives no fit
GROWTH = 1.5  # the next shape takes up to this many times the last one's time (compiles dominate)
# What a run spends besides its train-step compile and its steps: start-up after the choice,
# the eval and sample compiles beside the train step's (COMPILE_FACTOR x it), the budget's
# measurement, the last evaluation, save and samples (benchmarks/results/2026-11-28-auto_size-zen4)
RUN_FIXED_S = 6.0
COMPILE_FACTOR = 1.3
# A cached probe was taken on quiet cores: where others keep them busy now, its step times are
# divided by the share left to the run (no less than MIN_SHARE), sampled over LOAD_SAMPLE_S.
LOAD_SAMPLE_S = 0.3
MIN_SHARE = 0.25
# The prior: the probe of a reference machine (REFERENCE_CPU, configs/shakespeare_char.py's
# architecture) fitted as `fit` fits one: seconds a step per feature, and a cold train-step compile
# (seconds, and seconds a layer); its probe process's start before the first shape (python, jax,
# jaxtrain) and a shape's build and timing besides its compile; its numpy float32 matmul GFLOP/s.
# Measured while other processes kept 83% of its cores busy, the times scaled by the 17% left to
# the probe (its 2x64 step, 36 ms, is what a quiet Zen 4 took; the start, its CPU seconds):
# benchmarks/results/2026-12-07-auto_size-emerald-rapids/README.md.
REFERENCE_CPU = "Intel Xeon 5th gen (Emerald Rapids, family 6 model 207), 2 cores"
REFERENCE_COEF = (0.0, 0.0, 1.123e-11, 4.554e-12, 2.284e-08)
REFERENCE_COMPILE_S, REFERENCE_COMPILE_PER_LAYER_S = 4.2, 0.22
REFERENCE_START_S, REFERENCE_TIME_S = 2.5, 1.5
REFERENCE_GFLOPS = 192.0
MATMUL_N = 512
PRIOR_MARGIN = 1.5  # a probe's cost as the prior estimates it, times this: a guess errs toward
#                     measuring less


def architecture(cfg: ml_collections.ConfigDict, platform: str) -> list[str]:
  """What a probe's result holds for besides the machine: the platform and its GPUs, and every
  field that changes a step's speed but the shape."""
  arch = loading.flatten(cfg.model.to_dict()) | {"optim": cfg.optim.name,
                                                 "ns": cfg.optim.muon_ns_steps,
                                                 "accum": cfg.train.grad_accum,
                                                 "stats": cfg.log.group_stats}
  for f in ("size", "n_layers", "d_model", "n_heads", "seq_len", "vocab_size"):
    arch.pop(f, None)
  if cfg.get("extend"):  # an extension's code and options are the architecture too
    arch |= {"ext": cfg.ext.to_dict(), "code": [s.sha256 for s in extensions.load(cfg.extend)]}
  digest = hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:12]
  return [f"{platform}{os.environ.get('CUDA_VISIBLE_DEVICES', '')}", digest]


def _ns(cfg: ml_collections.ConfigDict) -> int:
  return cfg.optim.muon_ns_steps if cfg.optim.name == "muon" else 0


def _model(coef, compile_s: float, per_layer_s: float, ns: int, max_flops: float = math.inf
           ) -> size_rule.SpeedModel:
  """A run's speed model from a step-time fit and a cold train-step compile line."""
  return size_rule.SpeedModel(tuple(float(c) for c in coef), RUN_FIXED_S + COMPILE_FACTOR * compile_s,
                              COMPILE_FACTOR * per_layer_s, muon_ns_steps=ns, max_flops=max_flops)


def compile_s(model: size_rule.SpeedModel, layers: int) -> float:
  """A cold train-step compile of `layers` layers, as `model` (from `_model`) predicts it."""
  return (model.fixed_s - RUN_FIXED_S + model.compile_per_layer_s * layers) / COMPILE_FACTOR


def fit(rows: list[dict], muon_ns_steps: int) -> size_rule.SpeedModel:
  """The speed model of probe rows ({features, step_s, compile_s, layers, cached}): step seconds
  as a non-negative combination of the features, fitted to relative error; cold compiles (those
  not read from the compile cache, where any are) against depth."""
  x = np.array([r["features"] for r in rows], float)
  y = np.array([r["step_s"] for r in rows], float)
  scale = x.max(axis=0)
  scale[scale == 0] = 1.0
  coef = nonnegative_lstsq(x / scale / y[:, None], np.ones(len(y)))
  cold = [r for r in rows if not r.get("cached")] or rows
  layers = np.array([r["layers"] for r in cold], float)
  compiles = np.array([r["compile_s"] for r in cold], float)
  slope, intercept = np.polyfit(layers, compiles, 1) if len(set(layers)) > 1 else (0, compiles.mean())
  return _model(coef / scale, max(float(intercept), 0.0), max(float(slope), 0.0), muon_ns_steps,
                max(r["features"][2] for r in rows) if _missing(rows) else math.inf)


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """argmin |a x - b| over x >= 0, exactly: the best of the least-squares solutions, each on a
  subset of the columns, that are non-negative (the optimum is one of them). A few features make
  that 2^k small solves, and spare a run scipy.optimize's import (~0.6 s of its budget)."""
  best, best_r = np.zeros(a.shape[1]), float(np.sum(b * b))
  for mask in range(1, 2 ** a.shape[1]):
    cols = [j for j in range(a.shape[1]) if mask >> j & 1]
    sol = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
    if np.all(sol >= 0):
      x = np.zeros(a.shape[1])
      x[cols] = sol
      r = float(np.sum((a @ x - b) ** 2))
      if r < best_r:
        best, best_r = x, r
  return best


def _missing(rows: list[dict]) -> list[tuple[int, int]]:
  """The PROBES not in `rows` yet (a probe with none missing is whole)."""
  have = {(r["layers"], r["shape"]["d_model"]) for r in rows}
  return [p for p in PROBES if p not in have]


def matmul_gflops() -> measured.Measured:
  """This machine's float32 matmul speed as numpy gets it (MATMUL_N cubed, the best of a few):
  milliseconds, before jax starts; cached."""
  def measure(_) -> float:
    a = np.random.default_rng(0).standard_normal((MATMUL_N, MATMUL_N)).astype(np.float32)
    return 2 * MATMUL_N**3 / machine.seconds(lambda: a @ a, at_least=5, pick=min) / 1e9

  return measured.measured("numpy_matmul", [MATMUL_N], measure)


def prior(cfg: ml_collections.ConfigDict) -> tuple[size_rule.SpeedModel, float]:
  """(this machine's speed model before any probe: the reference machine's, its times scaled by
  how much slower a matmul runs here; that factor)."""
  slower = REFERENCE_GFLOPS / max(matmul_gflops().value, 1e-3)
  return _model([c * slower for c in REFERENCE_COEF], REFERENCE_COMPILE_S * slower,
                REFERENCE_COMPILE_PER_LAYER_S * slower, _ns(cfg)), slower


def probe_shapes(cfg: ml_collections.ConfigDict, rows: list[dict] = ()) -> list[Shape]:
  """What a probe measures, in order: the config's own shape (the one a run falls back to,
  whose compile the run then reads from the cache), then PROBES; none already in `rows`."""
  m = cfg.model
  shapes = [(m.n_layers, m.d_model, m.n_heads)] + [(n, d, size_rule.heads(d)) for n, d in PROBES]
  have = {(r["layers"], r["shape"]["d_model"]) for r in rows}
  return [s for s in dict.fromkeys(shapes) if s[:2] not in have]


def probe_cost(model: size_rule.SpeedModel, base, cfg: ml_collections.ConfigDict,
               shapes: list[Shape], slower: float) -> float:
  """Seconds a probe of `shapes` takes as `model` predicts (the prior, `slower` than the
  reference machine), PRIOR_MARGIN included."""
  total = REFERENCE_START_S * slower
  for n, d, h in shapes:
    shape = size_rule.Shape(n, d, h, cfg.model.seq_len, cfg.train.batch_size)
    total += compile_s(model, n) + REFERENCE_TIME_S * slower + 5 * model.step_s(base, shape)
  return PRIOR_MARGIN * total


def speed_model(cfg: ml_collections.ConfigDict, vocab: int, platform: str, share_s: float,
                say: Callable[[str], None] = print, need_s: float = 0.0, eot_id: int = -1
                ) -> tuple[size_rule.SpeedModel | None, measured.Measured | None]:
  """(this machine's speed model for `cfg`'s architecture, None where too few shapes were
  measured for one; the probe's record, None where nothing was measured or cached): cached, or
  probed now in at most `share_s` seconds (what the budget can repay). A probe cut short is taken
  up where a later run's share holds more than the last one's and the next shape (GROWTH x the
  last shape's time): it measures the shapes left. A share below `need_s` (what a probe of
  MIN_SHAPES shapes would take) measures nothing: a cached probe cut short is read as it is."""

  def probe(before: dict | None) -> dict:
    rows = before["rows"] if before else []
    todo = probe_shapes(cfg, rows)
    say(f"model.size=auto: measuring this machine's speed on {len(todo)} "
        f"{'more ' * bool(rows)}shapes, in at most {fmt.duration(share_s)} (once: cached in "
        f"{os.path.join(paths.cache_dir(), measured.FILE)})")
    return run_probe(cfg, vocab, platform, share_s, say, rows, eot_id)

  def enough(v: dict) -> bool:
    rows = v["rows"]
    return not _missing(rows) or share_s <= v["share_s"] or \
        bool(rows) and share_s < GROWTH * rows[-1]["seconds"]

  parts = architecture(cfg, platform)
  found = measured.cached("auto_speed", parts)
  if share_s < need_s and (found is None or not enough(found.value)):
    if found is None or len(found.value["rows"]) < MIN_SHAPES:
      return None, found
  else:
    found = measured.measured("auto_speed", parts, probe, enough=enough)
  rows = found.value["rows"]
  model = fit(rows, _ns(cfg)) if len(rows) >= MIN_SHAPES else None
  if model and not found.here:  # cached: how busy the cores are now
    _, now = machine.with_load(lambda: time.sleep(LOAD_SAMPLE_S))
    if now is not None and now > measured.BUSY:
      share = max(1.0 - now, MIN_SHARE)
      model = dataclasses.replace(model, coef=tuple(c / share for c in model.coef))
      say(f"model.size=auto: other processes keep {now:.0%} of the cores busy now (the cached "
          f"speeds were measured on quiet cores): its steps are counted at {share:.0%} of them")
  return model, found


def run_probe(cfg: ml_collections.ConfigDict, vocab: int, platform: str, share_s: float,
              say: Callable[[str], None], rows: list[dict] = (), eot_id: int = -1) -> dict:
  """The probe of `probe_shapes` (with the config's context and batch) after those in `rows`, in
  a process of its own (its devices split as the run's will be, its compiles into the run's
  compile cache), stopped at `share_s` seconds, each shape said as it is measured: {rows (`rows`
  and the new ones), seconds, share_s}."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_COMPILATION_CACHE"}
  env["JAX_PLATFORMS"] = platform
  todo = probe_shapes(cfg, rows)
  request = json.dumps({"config": cfg.to_dict(), "vocab": vocab, "shapes": todo, "eot_id": eot_id,
                        "deadline_s": share_s, "last_s": rows[-1]["seconds"] if rows else 0.0})
  t, rows = time.perf_counter(), list(rows)
  with tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen([sys.executable, "-m", "jaxtrain.measure.speed_probe"], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
    stop = threading.Timer(share_s, proc.kill)  # a compile cannot be cut short otherwise
    stop.start()
    with contextlib.suppress(BrokenPipeError):  # stopped already
      proc.stdin.write(request)
      proc.stdin.close()
    for line in proc.stdout:
      if line.startswith("{"):
        rows.append(row := json.loads(line))
        say(f"model.size=auto: measured {row['shape']['n_layers']}x{row['shape']['d_model']} "
            f"({len(rows)} of {len(rows) + len(probe_shapes(cfg, rows))}): compiled in "
            f"{row['compile_s']:.1f}s{' (from the compile cache)' * row['cached']}, "
            f"{row['step_s'] * 1e3:.1f} ms a step ({fmt.duration(time.perf_counter() - t)} so far)")
    stopped = proc.wait() < 0 and not stop.is_alive()
    stop.cancel()
    if proc.returncode and not stopped:
      err.seek(0)
      last = (err.read().strip().splitlines() or ["(no output)"])[-1]
      raise UserError(f"model.size=auto: the speed probe failed ({last}); pass the model's shape "
                      "(model.n_layers, model.d_model, model.n_heads) instead of model.size=auto")
  return {"rows": rows, "seconds": round(time.perf_counter() - t, 1), "share_s": share_s}


def _time_steps(built, min_s: float = 0.6, max_steps: int = 15) -> tuple[float, float]:
  """(compile seconds, median seconds of a step after the first) of `built`'s train step, on
  random tokens (a step's speed does not depend on their values)."""
  import jax

  t = time.perf_counter()
  step = built.compile_train()
  compile_seconds = time.perf_counter() - t
  state = built.init()
  B, T1 = built.batch_shape
  batch = built.place({"tokens": np.random.default_rng(0).integers(0, 2, (B, T1)).astype(np.int32)})

  def one() -> None:
    nonlocal state
    state, m = step(state, batch)
    jax.device_get(m)

  return compile_seconds, machine.seconds(one, for_s=min_s, at_most=max_steps)


def _probe_main() -> None:
  """The probe's own process: JSON {config, vocab, shapes, eot_id, deadline_s, last_s} in, a JSON
  line for each shape out as it is measured, until the next would end past the deadline
  (GROWTH x the shape before's time: `last_s` for the first). Its compiles go to the run's
  persistent compile cache; a row says whether its compile was read from there (`cached`)."""
  t0 = time.perf_counter()
  request = json.loads(sys.stdin.read())
  cfg = ml_collections.ConfigDict(request["config"])
  extensions.load(cfg.get("extend", ""))  # the run's own components, registered here too
  shapes = [size_rule.Shape(n, d, h, cfg.model.seq_len, cfg.train.batch_size)
            for n, d, h in request["shapes"]]
  with_shape = lambda shape: loading.override(cfg, **shape.fields())  # noqa: E731
  from jaxtrain.core import model as model_lib
  from jaxtrain.core import programs
  from jaxtrain.system import runtime

  # The run's split of this process's CPU (the config's own shape, measured first, is the run's
  # program: same split, same compile-cache key), in a process of its own (it joins no other).
  run = with_shape(shapes[0])
  startup.settle(loading.override(run, **{"distributed.num_processes": 1,
                                          "distributed.coordinator_address": "",
                                          "mesh.cpu_devices": startup.cpu_device_count(run)[0]}),
                 by="the speed probe")
  import jax

  runtime.enable_compile_cache()
  hits = []
  jax.monitoring.register_event_listener(
      lambda event, **_: hits.append(event) if event.endswith("/cache_hits") else None)
  base = model_lib.ModelConfig.from_config(cfg.model, request["vocab"])
  ns = _ns(cfg)
  last_s = request["last_s"]  # what the shape before took
  for shape in shapes:
    t = time.perf_counter()
    if t - t0 + GROWTH * last_s > request["deadline_s"]:
      break
    built = programs.build(with_shape(shape), request["vocab"], startup.devices(),
                           eot_id=request["eot_id"])
    before = len(hits)
    compile_seconds, step_s = _time_steps(built)
    last_s = time.perf_counter() - t
    print(json.dumps({"shape": dataclasses.asdict(shape), "layers": shape.n_layers,
                      "features": size_rule.features(base, shape, ns), "step_s": step_s,
                      "compile_s": compile_seconds, "cached": len(hits) > before,
                      "seconds": last_s}), flush=True)


if __name__ == "__main__":
  _probe_main()
