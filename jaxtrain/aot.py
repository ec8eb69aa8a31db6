"""Lowered steps saved to disk, so that a restart skips tracing and lowering the model.

XLA's persistent cache (`runtime.enable_compile_cache`) already saves the compile on a restart,
but tracing the model and lowering it to StableHLO still cost ~0.7 s for nano, every start.
`jax.export` serializes the lowered program; a later start loads it (~5 ms) and `jax.jit` only
wraps it. The cache key covers everything such a program depends on: jaxtrain's own source
files, the library versions, the config, the argument shapes and shardings. Programs take and
return flat lists of arrays, so no Python object (graphdef, optimizer) is serialized.
Single-process runs only; anything unexpected falls back to plain `jax.jit`.
"""

import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Callable

import jax

from jaxtrain.config import default_cache_dir

_LIBRARIES = ("jax", "jaxlib", "flax", "optax")


@functools.cache
def _code_digest() -> str:
  h = hashlib.sha256()
  for lib in _LIBRARIES:
    h.update(f"{lib}={importlib.metadata.version(lib)};".encode())
  for path in sorted(Path(__file__).parent.glob("*.py")):
    h.update(path.name.encode() + path.read_bytes())
  return h.hexdigest()


def _spec(x) -> str:
  sharding = getattr(x, "sharding", None)
  spec = getattr(sharding, "spec", None)
  return f"{x.shape}:{x.dtype}:{spec}"


def cached_jit(name: str, flat_fn: Callable, arg_specs: list, in_shardings: list,
               out_shardings: list, config: dict, donate: int = 0,
               compiler_options: dict | None = None) -> Callable:
  """`jax.jit(flat_fn, ...)` over flat lists of arrays in and out, compiled now, with its
  lowering cached (`cached_lower`)."""
  return cached_lower(name, flat_fn, arg_specs, in_shardings, out_shardings, config, donate,
                      compiler_options).compile()


def cached_lower(name: str, flat_fn: Callable, arg_specs: list, in_shardings: list,
                 out_shardings: list, config: dict, donate: int = 0,
                 compiler_options: dict | None = None) -> jax.stages.Lowered:
  """`jax.jit(flat_fn, ...).lower(*arg_specs)` over flat lists of arrays in and out, from the
  disk cache when it holds this program. Compiling it is left to the caller, who can overlap two
  compiles in two threads: XLA compiles without holding the GIL.

  `arg_specs` are ShapeDtypeStructs of the arguments; the first `donate` of them are donated.
  `config` is whatever else determines `flat_fn` (it goes into the cache key). `compiler_options`
  go to XLA (and so into its own cache key), not into the lowered program.
  """
  donate_argnums = tuple(range(donate))
  plain = jax.jit(flat_fn, in_shardings=tuple(in_shardings), out_shardings=tuple(out_shardings),
                  donate_argnums=donate_argnums, compiler_options=compiler_options)
  if jax.process_count() > 1 or os.environ.get("JAXTRAIN_NO_AOT") == "1":
    return plain.lower(*arg_specs)
  key = hashlib.sha256(json.dumps({
      "name": name, "code": _code_digest(), "config": config,
      "args": [_spec(a) for a in arg_specs], "in": [str(s.spec) for s in in_shardings],
      "out": [str(s.spec) for s in out_shardings],
      "devices": [d.id for d in jax.devices()], "platform": jax.devices()[0].platform,
  }, sort_keys=True, default=str).encode()).hexdigest()[:32]
  path = Path(default_cache_dir()) / "aot" / f"{name}-{key}.bin"
  try:
    if path.exists():
      exported = jax.export.deserialize(bytearray(path.read_bytes()))
    else:
      exported = jax.export.export(plain)(*arg_specs)
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_suffix(f".tmp{os.getpid()}")
      tmp.write_bytes(exported.serialize())
      os.replace(tmp, path)
  except Exception:  # no flatbuffers, an unwritable cache, a program export cannot hold, ...
    return plain.lower(*arg_specs)
  # The shardings give the call its devices (a program without inputs would default to one).
  wrapped = jax.jit(exported.call, in_shardings=tuple(in_shardings),
                    out_shardings=tuple(out_shardings), donate_argnums=donate_argnums,
                    compiler_options=compiler_options)
  return wrapped.lower(*arg_specs)
