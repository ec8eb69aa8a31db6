"""Lowered steps saved to disk, so that a restart skips tracing and lowering the model.

XLA's persistent cache (`runtime.enable_compile_cache`) already saves the compile on a restart,
but tracing the model and lowering it to StableHLO still cost ~0.7 s for nano, every start.
`jax.export` serializes the lowered program; a later start loads it (~5 ms) and `jax.jit` only
wraps it. The cache key covers everything such a program depends on: jaxtrain's own source
files, the library versions, the config, the argument shapes and shardings. Programs take and
return flat lists of arrays, so no Python object (graphdef, optimizer) is serialized.
Single-process runs only; anything unexpected falls back to plain `jax.jit`. Each program used
is also described (`describe`, `USED`), so that `preload` can load it early on the next start.
"""

import concurrent.futures
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
def code_digest() -> str:
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
                 compiler_options: dict | None = None) -> "jax.stages.Lowered | Loading":
  """`jax.jit(flat_fn, ...).lower(*arg_specs)` over flat lists of arrays in and out, from the
  disk cache when it holds this program. Compiling it is left to the caller, who can overlap two
  compiles in two threads: XLA compiles without holding the GIL.

  `arg_specs` are ShapeDtypeStructs of the arguments; the first `donate` of them are donated.
  `config` is whatever else determines `flat_fn` (it goes into the cache key). `compiler_options`
  go to XLA (and so into its own cache key), not into the lowered program.

  A program that `preload` already loaded comes back as a stand-in whose `compile()` returns it.
  """
  donate_argnums = tuple(range(donate))
  plain = jax.jit(flat_fn, in_shardings=tuple(in_shardings), out_shardings=tuple(out_shardings),
                  donate_argnums=donate_argnums, compiler_options=compiler_options)
  if jax.process_count() > 1 or not enabled():
    return plain.lower(*arg_specs)
  key = hashlib.sha256(json.dumps({
      "name": name, "code": code_digest(), "config": config,
      "args": [_spec(a) for a in arg_specs], "in": [str(s.spec) for s in in_shardings],
      "out": [str(s.spec) for s in out_shardings],
      "devices": [d.id for d in jax.devices()], "platform": jax.devices()[0].platform,
  }, sort_keys=True, default=str).encode()).hexdigest()[:32]
  path = cache_dir() / f"{name}-{key}.bin"
  program = describe(path.name, arg_specs, in_shardings, out_shardings, donate, compiler_options)

  def from_disk() -> tuple[jax.stages.Lowered, bool]:
    return _lower_via_disk(path, plain, arg_specs, in_shardings, out_shardings, donate,
                           compiler_options)

  loading = PRELOADED.get(path.name)
  if loading is not None and loading.calls_like(program, arg_specs, in_shardings, out_shardings):
    del PRELOADED[path.name]
    USED.append(program)
    return loading.take(lambda: from_disk()[0])
  lowered, cached = from_disk()
  if cached and program is not None:
    USED.append(program)
  return lowered


def _lower_via_disk(path: Path, plain, arg_specs: list, in_shardings: list, out_shardings: list,
                    donate: int, compiler_options: dict | None) -> tuple[jax.stages.Lowered, bool]:
  """(the program at `path`, exported there first if new or unreadable; True), or (`plain`
  lowered, False) where the disk cache cannot hold it."""
  if path.exists():
    try:
      return load(path, arg_specs, in_shardings, out_shardings, donate, compiler_options), True
    except Exception:  # a damaged file (a full disk, a crash while copying): written anew
      pass
  try:
    exported = jax.export.export(plain)(*arg_specs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(exported.serialize())
    os.replace(tmp, path)
    return _wrap(exported, in_shardings, out_shardings, donate, compiler_options).lower(
        *arg_specs), True
  except Exception:  # no flatbuffers, an unwritable cache, a program export cannot hold, ...
    return plain.lower(*arg_specs), False


def load(path: Path, arg_specs: list, in_shardings: list, out_shardings: list, donate: int,
         compiler_options: dict | None) -> jax.stages.Lowered:
  """The cached program at `path`, wrapped and lowered as `cached_lower` does (the same wrapping
  gives the same XLA program, and so a hit in XLA's cache)."""
  exported = jax.export.deserialize(bytearray(path.read_bytes()))
  return _wrap(exported, in_shardings, out_shardings, donate, compiler_options).lower(*arg_specs)


def _wrap(exported, in_shardings: list, out_shardings: list, donate: int,
          compiler_options: dict | None):
  # The shardings give the call its devices (a program without inputs would default to one).
  return jax.jit(exported.call, in_shardings=tuple(in_shardings),
                 out_shardings=tuple(out_shardings), donate_argnums=tuple(range(donate)),
                 compiler_options=compiler_options)


def describe(file: str, arg_specs: list, in_shardings: list, out_shardings: list, donate: int,
             compiler_options: dict | None) -> dict | None:
  """A cached program and how it is called, as JSON (what `preload` needs to load it again), or
  None where a sharding is not a NamedSharding of one mesh."""
  shardings = [*(a.sharding for a in arg_specs), *in_shardings, *out_shardings]
  if not shardings or not all(isinstance(s, jax.sharding.NamedSharding) for s in shardings):
    return None
  mesh = shardings[0].mesh
  if any(s.mesh != mesh for s in shardings):
    return None

  def spec(s: jax.sharding.NamedSharding) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in s.spec]

  try:
    return json.loads(json.dumps({
        "file": file,
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.devices.shape),
                 "devices": [d.id for d in mesh.devices.flat]},
        "args": [[list(a.shape), str(a.dtype), spec(a.sharding)] for a in arg_specs],
        "in": [spec(s) for s in in_shardings], "out": [spec(s) for s in out_shardings],
        "donate": donate, "compiler_options": compiler_options or {},
    }, sort_keys=True))
  except (TypeError, ValueError):  # something JSON cannot hold: such a program is not preloaded
    return None


class Loading:
  """Stands in for the `Lowered` of a program `preload` is loading in its thread: `compile()`
  waits for that and returns it, or lowers and compiles here if that failed."""

  def __init__(self, program: dict, calls: tuple, future: concurrent.futures.Future):
    # `calls`: the (arg_specs, in_shardings, out_shardings) the program was loaded with.
    self.program, self.calls, self.future = program, calls, future
    self.taken = self.fell_back = False
    self._fallback = None

  def calls_like(self, program: dict | None, arg_specs: list, in_shardings: list,
                 out_shardings: list) -> bool:
    """Whether this is `program`, called exactly so (the description, and the jax objects
    themselves: a sharding can differ in what the description leaves out)."""
    return program is not None and program == self.program and \
        self.calls == (list(arg_specs), list(in_shardings), list(out_shardings))

  def take(self, fallback: Callable[[], jax.stages.Lowered]) -> "Loading":
    self.taken, self._fallback = True, fallback
    return self

  def compile(self):
    try:
      return self.future.result()
    except Exception:
      self.fell_back = True
      return self._fallback().compile()


PRELOADED: dict[str, Loading] = {}  # by file name; `preload` puts, `cached_lower` takes
USED: list[dict] = []  # `describe` of every cached program this process lowered or took


def enabled() -> bool:
  return os.environ.get("JAXTRAIN_NO_AOT") != "1"


def cache_dir() -> Path:
  return Path(default_cache_dir()) / "aot"
