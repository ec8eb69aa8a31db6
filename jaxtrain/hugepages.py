"""Transparent huge pages for the buffers XLA:CPU allocates, which glibc sets up at start only.

Kept free of heavy imports: `python -m jaxtrain` calls `reexec()` before it imports jax.
"""

import os
import sys

HUGE_PAGES = "glibc.malloc.hugetlb=1"


def environment() -> dict | None:
  """The environment that backs malloc'd memory with transparent huge pages, if it helps here.

  XLA:CPU allocates a step's large buffers fresh each step; glibc serves them with mmap, and the
  kernel then faults in (and zeroes) every 4 KiB page on first touch: a quarter of the large
  benchmark's step time. With glibc's hugetlb tunable the same buffers come in 2 MiB pages
  (measured: 12.7 s -> 9.5 s per step). glibc reads it only at process start. None where the
  system already does it, cannot, or the user opted out (JAXTRAIN_NO_REEXEC=1).
  """
  if sys.platform != "linux" or os.environ.get("JAXTRAIN_NO_REEXEC") == "1":
    return None
  if HUGE_PAGES.split("=")[0] in os.environ.get("GLIBC_TUNABLES", ""):
    return None
  try:
    version = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # "glibc 2.36"
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      mode = f.read()
  except (ValueError, OSError, IndexError, AttributeError):
    return None
  if tuple(int(x) for x in version.split(".")[:2]) < (2, 35) or "[madvise]" not in mode:
    return None  # too old to know the tunable, or pages are always (or never) huge anyway
  tunables = ":".join(t for t in (os.environ.get("GLIBC_TUNABLES"), HUGE_PAGES) if t)
  return dict(os.environ, GLIBC_TUNABLES=tunables)


def reexec() -> None:
  """Restarts this process (same pid, same arguments) under `environment()`, if any."""
  env = environment()
  if env is not None:
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
