"""The JAX stack this process runs on: its versions, said in a run's first line, and a flax too
old for the installed jax refused in one line that names the fix, before flax fails to import.

pip cannot tell: flax 0.12.8 asks only for jax >= 0.10.0, yet `import flax.nnx` fails on jax
0.11.1 and newer (jax removed what it used); flax 0.12.9 fails likewise on jax 0.11.2. The
versions are read from the installed packages' metadata, without importing jax or flax.
"""

import contextlib
import re
import sys

from jaxtrain.system import invocation

# (oldest jax, the oldest flax that imports and trains on it), newest first; checked by installing
# each pair (docs/install.md has the table).
FLAX_FOR_JAX = [("0.11.2", "0.12.10"), ("0.11.1", "0.12.9"), ("0.10.2", "0.12.8")]
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain")


def versions() -> dict[str, str]:
  import importlib.metadata  # here: `python -m jaxtrain` restarts itself before it is needed

  found = {}
  for name in PACKAGES:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # not installed
      found[name] = importlib.metadata.version(name)
  return found


def _tuple(version: str) -> tuple[int, ...]:
  return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:4])


def mismatch(found: dict[str, str]) -> str | None:
  """What is wrong with the jax/flax pair in `found` (see `versions`), with the pip command that
  mends it; None when the pair works or either is missing."""
  if "jax" not in found or "flax" not in found:
    return None
  jax, flax = _tuple(found["jax"]), _tuple(found["flax"])
  need = next((f for j, f in FLAX_FOR_JAX if jax >= _tuple(j)), None)
  if need is None or flax >= _tuple(need):
    return None
  return (f"flax {found['flax']} does not work with jax {found['jax']} (flax {need} or "
          f"newer does): pip install 'flax>={need}'")


def line(found: dict[str, str] | None = None) -> str:
  """'jax 0.12.0.1, flax 0.12.12' (jaxlib too where it differs from jax): a run's first line."""
  found = versions() if found is None else found
  parts = [f"jax {found.get('jax', '?')}"]
  if found.get("jaxlib", found.get("jax")) != found.get("jax"):
    parts.append(f"jaxlib {found['jaxlib']}")
  return ", ".join([*parts, f"flax {found.get('flax', '?')}"])


def check() -> None:
  """Refuses a flax that cannot import on the installed jax: for a jaxtrain command, `error: ...`
  and exit status 2; for a program importing jaxtrain, an ImportError with the same line."""
  problem = mismatch(versions())
  if problem is None:
    return
  ran = invocation.started() or ""
  if ran.startswith("-m jaxtrain") or invocation.script() in invocation.SCRIPTS.values():
    print(f"error: {problem}", file=sys.stderr)
    raise SystemExit(2)
  raise ImportError(problem)
