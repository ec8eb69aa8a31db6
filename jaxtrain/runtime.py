"""Process-level JAX setup, done once before any other JAX work: compile cache and platform."""

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


def check_platform() -> str:
  """Touches the backend so a missing one fails here with a fix, not deep inside a step."""
  try:
    return jax.devices()[0].platform
  except RuntimeError as e:
    wanted = jax.config.jax_platforms or "the default platform"
    if any(p in str(wanted) for p in ("cuda", "gpu")):
      raise UserError(
          f"--jax_platforms={wanted} but this jax has no working CUDA backend; install one with "
          "`pip install -e '.[cuda12]'` (or .[cuda13]; needs an NVIDIA driver) or pass --jax_platforms=cpu"
      ) from None
    raise UserError(f"jax could not start {wanted} ({str(e).splitlines()[0]}); "
                    "pass --jax_platforms=cpu") from None


def setup() -> str:
  enable_compile_cache()
  return check_platform()
