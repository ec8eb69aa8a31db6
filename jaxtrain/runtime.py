"""Process-level JAX setup, done once before any other JAX work: compile cache and platform."""

import importlib.util
import os

import jax

from jaxtrain.config import default_cache_dir
from jaxtrain.errors import UserError


def enable_compile_cache() -> None:
  """Persistent XLA cache: a restart compiles nothing it compiled before."""
  if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR wins if set
    jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


_NO_CUDA = ("this jax has no working CUDA backend{why}; install one with `pip install -e "
            "'.[cuda12]'` (or '.[cuda13]'; needs an NVIDIA driver), or pass --jax_platforms=cpu")


def check_platform() -> str:
  """Touches the backend so a missing one fails here with a fix, not deep inside a step."""
  wanted = jax.config.jax_platforms or ""
  wants_gpu = any(p in wanted for p in ("cuda", "gpu"))
  if wants_gpu and not any(importlib.util.find_spec(m) for m in
                           ("jax_cuda12_plugin", "jax_cuda13_plugin", "jaxlib.cuda")):
    raise UserError(f"--jax_platforms={wanted}: " + _NO_CUDA.format(why=" (no CUDA plugin installed)"))
  try:
    return jax.devices()[0].platform
  except Exception as e:  # jax raises RuntimeError or AssertionError depending on the platform
    first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
    if wants_gpu:
      raise UserError(f"--jax_platforms={wanted}: " + _NO_CUDA.format(why=f" ({first})")) from None
    raise UserError(f"jax could not start {wanted or 'its default platform'} ({first}); "
                    "pass --jax_platforms=cpu") from None


def setup() -> str:
  enable_compile_cache()
  return check_platform()
