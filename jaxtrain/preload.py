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

_STARTED: set[str] = set()  # the files of the programs `start` loads


def _manifest_path(cfg: ml_collections.ConfigDict) -> Path:
  fields = cfg.to_dict()
  fields.pop("workdir")  # a new run directory with the same config runs the same programs
  key = hashlib.sha256(json.dumps({"code": aot.code_digest(), "config": fields}, sort_keys=True,
                                  default=str).encode()).hexdigest()[:32]
  return aot.cache_dir() / f"manifest-{key}.json"


def start(cfg: ml_collections.ConfigDict) -> None:
  """Starts loading the programs the last run with `cfg` used, if it left a manifest. Called by
  `python -m jaxtrain` before it imports the training loop (and so flax)."""
  if not aot.enabled() or runtime.wants_distributed(cfg.distributed):
    return
  try:
    manifest = json.loads(_manifest_path(cfg).read_text())
    programs = manifest["programs"]
    # A run that resumes restores its state rather than running init.
    if _has_checkpoint(cfg):
      programs = [p for p in programs if p["args"]]
    runtime.setup(cfg)  # the backend, with the run's devices; train.run's own call finds it done
  except Exception:  # no manifest, or not one to act on: train.run reports real problems
    return
  # One thread: the imports keep the other core.
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxtrain-preload")
  for program in programs:
    try:
      lowered, n_args = _lower(program)  # here: lowering holds the GIL either way
    except Exception:
      continue
    aot.PRELOADED[program["file"]] = aot.Loading(program, pool.submit(_compile, lowered, n_args))
    _STARTED.add(program["file"])
  pool.shutdown(wait=False)  # its thread finishes the queue; Python joins it at exit


def taken() -> int:
  """How many of the programs `start` loaded the run has taken (`aot.cached_lower`)."""
  return len(_STARTED - set(aot.PRELOADED))


def _has_checkpoint(cfg: ml_collections.ConfigDict) -> bool:
  directory = Path(cfg.workdir).expanduser() / "checkpoints"
  return directory.is_dir() and any(directory.iterdir())


def _compile(lowered: jax.stages.Lowered, n_args: int):
  compiled = lowered.compile()
  if n_args == 0:  # init: its outputs follow from the program alone
    return _FirstCall(compiled, jax.block_until_ready(compiled()))
  return compiled


def _lower(program: dict) -> tuple[jax.stages.Lowered, int]:
  mesh_info = program["mesh"]
  devices = {d.id: d for d in jax.devices()}
  mesh = Mesh(np.asarray([devices[i] for i in mesh_info["devices"]]).reshape(mesh_info["shape"]),
              tuple(mesh_info["axes"]))
  sharding = lambda spec: NamedSharding(mesh, P(*(tuple(e) if isinstance(e, list) else e  # noqa: E731
                                                  for e in spec)))
  arg_specs = [jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding(spec))
               for shape, dtype, spec in program["args"]]
  lowered = aot.load(aot.cache_dir() / program["file"], arg_specs,
                     [sharding(s) for s in program["in"]], [sharding(s) for s in program["out"]],
                     program["donate"], program["compiler_options"] or None)
  return lowered, len(arg_specs)


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
  try:
    old = json.loads(path.read_text())
  except (OSError, ValueError):
    old = {}
  name = lambda p: p["file"].rsplit("-", 1)[0]  # noqa: E731
  merged = {name(p): p for p in old.get("programs", [])}
  merged.update({name(p): p for p in programs})
  manifest = {"programs": list(merged.values())}
  if manifest == old:
    return
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)
  except OSError:  # an unwritable cache only costs the next start its head start
    pass
