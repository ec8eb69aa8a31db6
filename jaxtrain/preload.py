"""A restart's programs, compiled in a thread while the rest of jaxtrain is still importing.

On a warm start of nano, the main thread imports flax, optax, grain and orbax (~1 s; one core
idle), then lowers its cached programs (~0.3 s) and loads them from XLA's cache (~0.3-0.5 s).
Loading a compiled program happens outside the GIL, so `start` lowers them first, from a
manifest that the last run with the same config left (`remember`: which cached programs it used,
and how they are called), and has a thread load them (and run init) during those imports.
`aot.cached_lower` hands each one to the run only after checking that the run asks for exactly
that program, called exactly that way; anything else, or any failure here, leaves the run to
lower and compile as it would have without this.

Tried: lowering in the thread as well (the imports then wait for the GIL: 0.15 s less gain),
and a first execution on zeros in the thread, to set up YNNPACK's kernels before the first step
(its two devices then take both cores from the imports: no gain).
"""

import concurrent.futures
import hashlib
import json
import os
from pathlib import Path

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxtrain import aot, runtime

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_LOADINGS: list[aot.Loading] = []  # what the last `start` loads


def _manifest_path(cfg: ml_collections.ConfigDict) -> Path:
  fields = cfg.to_dict()
  fields.pop("workdir")  # a new run directory with the same config runs the same programs
  key = hashlib.sha256(json.dumps({"code": aot.code_digest(), "config": fields}, sort_keys=True,
                                  default=str).encode()).hexdigest()[:32]
  return aot.cache_dir() / f"manifest-{key}.json"


def start(cfg: ml_collections.ConfigDict) -> None:
  """Starts loading the programs the last run with `cfg` used, if it left a manifest. Called by
  `python -m jaxtrain` before it imports the training loop (and so flax)."""
  global _POOL
  _LOADINGS.clear()
  if not aot.enabled() or runtime.wants_distributed(cfg.distributed):
    return
  try:
    programs = json.loads(_manifest_path(cfg).read_text())["programs"]
    # A run that resumes restores its state rather than running init.
    if _has_checkpoint(cfg):
      programs = [p for p in programs if p["args"]]
    # Before `config.validate`, which the run does next: a manifest exists only for a config
    # that already passed it. The backend starts with the run's devices; train.run's own call
    # then finds everything done.
    runtime.setup(cfg)
  except Exception:  # no manifest, or not one to act on: train.run reports real problems
    return
  # One thread: the imports keep the other core.
  _POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxtrain-preload")
  for program in programs:
    try:
      lowered, calls = _lower(program)  # here: lowering holds the GIL either way
    except Exception:
      continue
    loading = aot.Loading(program, calls, _POOL.submit(_compile, lowered, len(calls[0])))
    aot.PRELOADED[program["file"]] = loading
    _LOADINGS.append(loading)
  _POOL.shutdown(wait=False)  # its thread finishes the queue; Python joins it at exit


def taken() -> int:
  """How many of the programs the last `start` loaded the run took and used."""
  return sum(l.taken and not l.fell_back for l in _LOADINGS)


def release() -> None:
  """Drops what the run did not take (a program of another shape, say, and its memory)."""
  aot.PRELOADED.clear()


def abandon() -> None:
  """Cancels the loads not yet begun, so that an early exit waits for one at most."""
  if _POOL is not None:
    _POOL.shutdown(wait=False, cancel_futures=True)


def _has_checkpoint(cfg: ml_collections.ConfigDict) -> bool:
  directory = Path(cfg.workdir).expanduser() / "checkpoints"
  return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def _compile(lowered: jax.stages.Lowered, n_args: int):
  compiled = lowered.compile()
  if n_args == 0:  # init: its outputs follow from the program alone
    return _FirstCall(compiled, jax.block_until_ready(compiled()))
  return compiled


def _lower(program: dict) -> tuple[jax.stages.Lowered, tuple]:
  devices = {d.id: d for d in jax.devices()}
  mesh_info = program["mesh"]
  if sorted(mesh_info["devices"]) != sorted(devices):  # the run's mesh spans every device
    raise ValueError("the manifest's devices are not this process's")
  mesh = Mesh(np.asarray([devices[i] for i in mesh_info["devices"]]).reshape(mesh_info["shape"]),
              tuple(mesh_info["axes"]))

  def sharding(spec: list) -> NamedSharding:
    return NamedSharding(mesh, P(*(tuple(e) if isinstance(e, list) else e for e in spec)))

  arg_specs = [jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding(spec))
               for shape, dtype, spec in program["args"]]
  in_shardings = [sharding(s) for s in program["in"]]
  out_shardings = [sharding(s) for s in program["out"]]
  lowered = aot.load(aot.cache_dir() / program["file"], arg_specs, in_shardings, out_shardings,
                     program["donate"], program["compiler_options"] or None)
  return lowered, (arg_specs, in_shardings, out_shardings)


class _FirstCall:
  """A program without arguments whose first call's results were computed in advance."""

  def __init__(self, compiled, outputs):
    self._compiled, self._outputs = compiled, outputs

  def __call__(self):
    outputs, self._outputs = self._outputs, None
    return self._compiled() if outputs is None else outputs


def remember(cfg: ml_collections.ConfigDict, programs: list[dict]) -> None:
  """Writes (or updates) the manifest `start` reads: `programs` (`aot.describe`), merged with
  those of earlier runs by program name (a resumed run uses no init)."""
  if not aot.enabled() or not programs or jax.process_count() > 1:
    return
  path = _manifest_path(cfg)

  def name(program: dict) -> str:
    return program["file"].rsplit("-", 1)[0]

  try:
    try:
      old = json.loads(path.read_text())
      merged = {name(p): p for p in old["programs"]}
    except (OSError, ValueError, KeyError, TypeError):
      old, merged = None, {}
    merged.update({name(p): p for p in programs})
    manifest = {"programs": list(merged.values())}
    if manifest == old:
      return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)
  except Exception:  # only the next start's head start is lost (an unwritable cache, ...)
    pass
