"""This machine's speed for `model.size="auto"`, fitted to the `size_rule.SpeedModel` the choice
reads and cached in the cache dir's auto_speed.json per machine (`cache_key`: the CPU or GPU, the
cores, jax) and architecture (every model field but the shape): measured once for each.

The probe times the train step of a few shapes (`PROBES`) as a run builds it, in a process of its
own: the choice is made before jax starts in the run's process, since the chosen batch decides
how the CPU is split into devices (core/cpu.py). Compiles are timed cold (the persistent cache
off); a non-negative fit (every term costs time) of the step times to `size_rule.features`, and a
line of the compiles against depth, give the model.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time

import ml_collections
import numpy as np

from jaxtrain.config import loading
from jaxtrain.measure import size_rule
from jaxtrain.system import paths
from jaxtrain.system.errors import UserError

SPEED_FILE = "auto_speed.json"
PROBES = ((2, 64), (2, 128), (3, 96), (4, 128), (4, 192), (6, 256))  # (layers, width)
# What a run spends besides its train-step compile and its steps: start-up after the choice,
# the eval and sample compiles beside the train step's (COMPILE_FACTOR x it), the budget's
# measurement, the last evaluation, save and samples (benchmarks/results/2026-11-28-auto_size-zen4)
RUN_FIXED_S = 6.0
COMPILE_FACTOR = 1.3
OVERHEAD = 0.05  # evaluations and saves, a share of the training time
CONSTANTS = [RUN_FIXED_S, COMPILE_FACTOR, OVERHEAD]  # a cached fit made with others is made anew


def shape_of(cfg: ml_collections.ConfigDict, layers: int, width: int) -> size_rule.Shape:
  heads = width // 32 if width < 192 else width // 64
  return size_rule.Shape(layers, width, heads, cfg.model.seq_len, cfg.train.batch_size)


def with_shape(cfg: ml_collections.ConfigDict, shape: size_rule.Shape) -> ml_collections.ConfigDict:
  return loading.override(cfg, **shape.fields())


def cache_key(cfg: ml_collections.ConfigDict, platform: str) -> str:
  """The machine and the architecture: a probe's result holds for both alike."""
  from jaxtrain.core import cpu

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  arch = loading.flatten(cfg.model.to_dict()) | {"optim": cfg.optim.name,
                                                 "ns": cfg.optim.muon_ns_steps,
                                                 "accum": cfg.train.grad_accum,
                                                 "stats": cfg.log.group_stats}
  for f in ("size", "n_layers", "d_model", "n_heads", "seq_len", "vocab_size"):
    arch.pop(f, None)
  digest = hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:12]
  gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
  return f"{platform}{gpus}-{cpu.probe_key()}-{cores}cores-{digest}"


def fit(rows: list[dict], muon_ns_steps: int) -> size_rule.SpeedModel:
  """The speed model of probe rows ({features, step_s, compile_s, layers}): step seconds as a
  non-negative combination of the features, fitted to relative error; compiles against depth."""
  from scipy.optimize import nnls

  x = np.array([r["features"] for r in rows], float)
  y = np.array([r["step_s"] for r in rows], float)
  scale = x.max(axis=0)
  scale[scale == 0] = 1.0
  coef, _ = nnls(x / scale / y[:, None], np.ones(len(y)))
  layers = np.array([r["layers"] for r in rows], float)
  compiles = np.array([r["compile_s"] for r in rows], float)
  slope, intercept = np.polyfit(layers, compiles, 1)
  slope, intercept = max(float(slope), 0.0), max(float(intercept), 0.0)
  return size_rule.SpeedModel(tuple(float(c) for c in coef / scale),
                              RUN_FIXED_S + COMPILE_FACTOR * intercept, COMPILE_FACTOR * slope,
                              OVERHEAD, muon_ns_steps)


def speed_model(cfg: ml_collections.ConfigDict, vocab: int, platform: str,
                say=print) -> size_rule.SpeedModel:
  """This machine's speed model for `cfg`'s architecture: cached, or probed now."""
  key = cache_key(cfg, platform)
  cached = paths.read_cache_json(SPEED_FILE)
  ns = cfg.optim.muon_ns_steps if cfg.optim.name == "muon" else 0
  entry = cached.get(key)
  if isinstance(entry, dict) and "rows" in entry:
    fitted = entry.get("model")
    if isinstance(fitted, dict) and fitted.get("constants") == CONSTANTS:
      return size_rule.SpeedModel(tuple(fitted["coef"]), fitted["fixed_s"],
                                  fitted["compile_per_layer_s"], OVERHEAD, ns)
    return _keep(key, entry["rows"], ns)
  say(f"model.size=auto: measuring this machine's speed for {len(PROBES)} shapes (once: cached "
      f"in {os.path.join(paths.cache_dir(), SPEED_FILE)})")
  t = time.perf_counter()
  rows = run_probe(cfg, vocab, platform)
  return _keep(key, rows, ns, seconds=round(time.perf_counter() - t, 1))


def _keep(key: str, rows: list[dict], ns: int, **more) -> size_rule.SpeedModel:
  """The speed model of `rows`, cached with them (a run reads the fit without refitting)."""
  model = fit(rows, ns)
  cached = paths.read_cache_json(SPEED_FILE)
  entry = cached.get(key) if isinstance(cached.get(key), dict) else {"time": time.time()}
  cached[key] = {**entry, **more, "rows": rows,
                 "model": {"coef": list(model.coef), "fixed_s": model.fixed_s,
                           "compile_per_layer_s": model.compile_per_layer_s,
                           "constants": CONSTANTS}}
  paths.write_cache_json(SPEED_FILE, cached)
  return model


def run_probe(cfg: ml_collections.ConfigDict, vocab: int, platform: str) -> list[dict]:
  """The probe of `PROBES` ((layers, width) with the config's context and batch), in a process
  of its own (its devices split as the run's will be)."""
  env = dict(os.environ, JAX_PLATFORMS=platform, JAX_ENABLE_COMPILATION_CACHE="false")
  request = json.dumps({"config": cfg.to_dict(), "vocab": vocab, "probes": PROBES})
  proc = subprocess.run([sys.executable, "-m", "jaxtrain.measure.speed_probe"], input=request,
                        capture_output=True, text=True, env=env)
  if proc.returncode:
    last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise UserError(f"model.size=auto: the speed probe failed ({last}); pass the model's shape "
                    "(model.n_layers, model.d_model, model.n_heads) instead of model.size=auto")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _time_steps(built, min_s: float = 0.6, max_steps: int = 15) -> tuple[float, float]:
  """(cold compile seconds, median seconds of a step after the first) of `built`'s train step,
  on random tokens (a step's speed does not depend on their values)."""
  import jax

  t = time.perf_counter()
  step = built.compile_train()
  compile_s = time.perf_counter() - t
  state = built.init()
  rng = np.random.default_rng(0)
  B, T1 = built.batch_shape
  batch = built.place({"tokens": rng.integers(0, 2, (B, T1)).astype(np.int32)})
  state, m = step(state, batch)
  jax.block_until_ready(m)
  times, end = [], time.perf_counter() + min_s
  while len(times) < 3 or (time.perf_counter() < end and len(times) < max_steps):
    t = time.perf_counter()
    state, m = step(state, batch)
    jax.device_get(m)
    times.append(time.perf_counter() - t)
  return compile_s, float(np.median(times))


def _probe_main() -> None:
  """The probe's own process: JSON {config, vocab} in, one JSON line of rows out."""
  request = json.loads(sys.stdin.read())
  cfg = ml_collections.ConfigDict(request["config"])
  shapes = [shape_of(cfg, layers, width) for layers, width in request["probes"]]
  from jaxtrain.core import cpu, programs
  from jaxtrain.core import model as model_lib

  cpu.split_cpu(with_shape(cfg, shapes[len(shapes) // 2]))  # before jax starts its backends
  import jax

  base = model_lib.ModelConfig.from_config(cfg.model, request["vocab"])
  ns = cfg.optim.muon_ns_steps if cfg.optim.name == "muon" else 0
  rows = []
  for shape in shapes:
    built = programs.build(with_shape(cfg, shape), request["vocab"], jax.devices())
    compile_s, step_s = _time_steps(built)
    rows.append({"shape": dataclasses.asdict(shape), "layers": shape.n_layers,
                 "features": size_rule.features(base, shape, ns), "step_s": step_s,
                 "compile_s": compile_s})
  print(json.dumps(rows), flush=True)


if __name__ == "__main__":
  _probe_main()
