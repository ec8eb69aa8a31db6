"""This machine's speed for `model.size="auto"` (docs/time-budget.md): the `size_rule.SpeedModel`
the choice reads, fitted to a probe of a few shapes (`PROBES`) and kept with the machine's other
measurements (system/measured.py), per machine and architecture (every model field but the shape).

The probe times each shape's train step as a run builds it, in a process of its own: the choice is
made before jax starts in the run's process, since the chosen batch decides how the CPU is split
into devices (core/cpu.py). Compiles are timed cold (the persistent cache off); the step times get
a non-negative fit (every term costs time) to `size_rule.features`, the compiles a line in depth.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import ml_collections
import numpy as np

from jaxtrain.config import extensions, loading
from jaxtrain.measure import size_rule
from jaxtrain.system import fmt, machine, measured, paths, startup
from jaxtrain.system.errors import UserError

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
  slope, intercept = np.polyfit(layers, compiles, 1) if len(set(layers)) > 1 else (0, compiles.mean())
  slope, intercept = max(float(slope), 0.0), max(float(intercept), 0.0)
  partial = len(rows) < len(PROBES)
  return size_rule.SpeedModel(tuple(float(c) for c in coef / scale),
                              RUN_FIXED_S + COMPILE_FACTOR * intercept, COMPILE_FACTOR * slope,
                              muon_ns_steps=muon_ns_steps,
                              max_flops=max(r["features"][2] for r in rows) if partial else np.inf)


def speed_model(cfg: ml_collections.ConfigDict, vocab: int, platform: str, share_s: float,
                say: Callable[[str], None] = print
                ) -> tuple[size_rule.SpeedModel | None, measured.Measured]:
  """(this machine's speed model for `cfg`'s architecture, None where too few shapes were
  measured for one; the probe's record): cached, or probed now in at most `share_s` seconds. A
  probe cut short is taken up where a later run's share holds more than the last one's and the
  next shape (GROWTH x the last shape's time): it measures the shapes left."""

  def probe(before: dict | None) -> dict:
    rows = before["rows"] if before else []
    say(f"model.size=auto: measuring this machine's speed on {len(PROBES) - len(rows)} "
        f"{'more ' * bool(rows)}shapes, in at most {fmt.duration(share_s)} (once: cached in "
        f"{os.path.join(paths.cache_dir(), measured.FILE)})")
    return run_probe(cfg, vocab, platform, share_s, say, rows)

  def enough(v: dict) -> bool:
    rows = v["rows"]
    return len(rows) == len(PROBES) or share_s <= v["share_s"] or \
        bool(rows) and share_s < GROWTH * rows[-1]["seconds"]

  found = measured.measured("auto_speed", architecture(cfg, platform), probe, enough=enough)
  rows = found.value["rows"]
  ns = cfg.optim.muon_ns_steps if cfg.optim.name == "muon" else 0
  model = fit(rows, ns) if len(rows) >= MIN_SHAPES else None
  if model and not found.here:  # cached: how busy the cores are now
    _, now = machine.with_load(lambda: time.sleep(LOAD_SAMPLE_S))
    if now is not None and now > measured.BUSY:
      share = max(1.0 - now, MIN_SHARE)
      model = dataclasses.replace(model, coef=tuple(c / share for c in model.coef))
      say(f"model.size=auto: other processes keep {now:.0%} of the cores busy now (the cached "
          f"speeds were measured on quiet cores): its steps are counted at {share:.0%} of them")
  return model, found


def run_probe(cfg: ml_collections.ConfigDict, vocab: int, platform: str, share_s: float,
              say: Callable[[str], None], rows: list[dict] = ()) -> dict:
  """The probe of the `PROBES` ((layers, width) with the config's context and batch) after those
  in `rows`, in a process of its own (its devices split as the run's will be), each shape said
  as it is measured: {rows (`rows` and the new ones), seconds, share_s}."""
  env = dict(os.environ, JAX_PLATFORMS=platform, JAX_ENABLE_COMPILATION_CACHE="false")
  request = json.dumps({"config": cfg.to_dict(), "vocab": vocab, "probes": PROBES,
                        "skip": len(rows), "deadline_s": share_s,
                        "last_s": rows[-1]["seconds"] if rows else 0.0})
  t, rows = time.perf_counter(), list(rows)
  with tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen([sys.executable, "-m", "jaxtrain.measure.speed_probe"], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
    proc.stdin.write(request)
    proc.stdin.close()
    for line in proc.stdout:
      if line.startswith("{"):
        rows.append(row := json.loads(line))
        say(f"model.size=auto: measured {row['shape']['n_layers']}x{row['shape']['d_model']} "
            f"({len(rows)} of {len(PROBES)}): compiled in {row['compile_s']:.1f}s, "
            f"{row['step_s'] * 1e3:.1f} ms a step ({fmt.duration(time.perf_counter() - t)} so far)")
    if proc.wait():
      err.seek(0)
      last = (err.read().strip().splitlines() or ["(no output)"])[-1]
      raise UserError(f"model.size=auto: the speed probe failed ({last}); pass the model's shape "
                      "(model.n_layers, model.d_model, model.n_heads) instead of model.size=auto")
  return {"rows": rows, "seconds": round(time.perf_counter() - t, 1), "share_s": share_s}


def _time_steps(built, min_s: float = 0.6, max_steps: int = 15) -> tuple[float, float]:
  """(cold compile seconds, median seconds of a step after the first) of `built`'s train step,
  on random tokens (a step's speed does not depend on their values)."""
  import jax

  t = time.perf_counter()
  step = built.compile_train()
  compile_s = time.perf_counter() - t
  state = built.init()
  B, T1 = built.batch_shape
  batch = built.place({"tokens": np.random.default_rng(0).integers(0, 2, (B, T1)).astype(np.int32)})

  def one() -> None:
    nonlocal state
    state, m = step(state, batch)
    jax.device_get(m)

  return compile_s, machine.seconds(one, for_s=min_s, at_most=max_steps)


def _probe_main() -> None:
  """The probe's own process: JSON {config, vocab, probes, skip, deadline_s, last_s} in, a JSON
  line for each shape after the first `skip` out as it is measured, until the next would end past
  the deadline (GROWTH x the shape before's time: `last_s` for the first)."""
  t0 = time.perf_counter()
  request = json.loads(sys.stdin.read())
  cfg = ml_collections.ConfigDict(request["config"])
  extensions.load(cfg.get("extend", ""))  # the run's own components, registered here too
  shapes = [size_rule.Shape(n, d, size_rule.heads(d), cfg.model.seq_len, cfg.train.batch_size)
            for n, d in request["probes"]]
  with_shape = lambda shape: loading.override(cfg, **shape.fields())  # noqa: E731
  from jaxtrain.core import model as model_lib
  from jaxtrain.core import programs

  # The run's split of this process's CPU, in a process of its own (it joins no other).
  run = with_shape(shapes[len(shapes) // 2])
  startup.settle(loading.override(run, **{"distributed.num_processes": 1,
                                          "distributed.coordinator_address": "",
                                          "mesh.cpu_devices": startup.cpu_device_count(run)[0]}),
                 by="the speed probe")
  base = model_lib.ModelConfig.from_config(cfg.model, request["vocab"])
  ns = cfg.optim.muon_ns_steps if cfg.optim.name == "muon" else 0
  last_s = request["last_s"]  # what the shape before took
  for shape in shapes[request["skip"]:]:
    t = time.perf_counter()
    if t - t0 + GROWTH * last_s > request["deadline_s"]:
      break
    built = programs.build(with_shape(shape), request["vocab"], startup.devices())
    compile_s, step_s = _time_steps(built)
    last_s = time.perf_counter() - t
    print(json.dumps({"shape": dataclasses.asdict(shape), "layers": shape.n_layers,
                      "features": size_rule.features(base, shape, ns), "step_s": step_s,
                      "compile_s": compile_s, "seconds": last_s}), flush=True)


if __name__ == "__main__":
  _probe_main()
