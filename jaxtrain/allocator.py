"""The memory allocator under XLA:CPU's buffers, which a process can only choose when it starts.

XLA:CPU allocates a step's temporaries (GiBs for a 10M-param model) and frees them again every
step. glibc hands such blocks back to the kernel at once, so every step the kernel maps them
afresh and zeroes every page: a third of a large CPU step (`benchmarks/README.md`). mimalloc,
told never to return freed memory, reuses the same pages from step to step instead. Without it,
glibc's `hugetlb` tunable at least brings those pages in 2 MiB at a time rather than 4 KiB.

Kept free of heavy imports: `python -m jaxtrain` calls `reexec()` before it imports jax.
Linux only; `JAXTRAIN_NO_REEXEC=1` leaves the process as it is, `JAXTRAIN_MIMALLOC=0` keeps
glibc (with huge pages).
"""

import importlib.util
import os
import sys
from pathlib import Path

HUGE_PAGES = "glibc.malloc.hugetlb=1"
MIMALLOC = Path("cmeel.prefix", "lib", "libmimalloc.so.3")  # where the cmeel-mimalloc wheel puts it
# Keep freed memory mapped (a step frees and takes back the same blocks); back it with huge
# pages; one address-space reservation up front, so that GiB-sized blocks come from one arena.
# Measured together (large benchmark step: 13.2-13.4 -> 9.5-10.7 s, no page faults after the
# first step); without the reservation or with a 1 s purge delay, steps kept faulting.
MIMALLOC_OPTIONS = {"MIMALLOC_PURGE_DELAY": "-1", "MIMALLOC_ALLOW_LARGE_OS_PAGES": "1"}


def mimalloc_library() -> str | None:
  """The installed libmimalloc.so (the `cmeel-mimalloc` dependency), or None."""
  for entry in sys.path:
    path = Path(entry or ".") / MIMALLOC
    if path.is_file():
      return str(path.resolve())
  return None


def cuda_installed() -> bool:
  return any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


def _runs_on_cpu(base: dict, argv: list[str]) -> bool:
  """Whether the command trains on the CPU: mimalloc was measured there, not under GPU runs."""
  platforms = base.get("JAX_PLATFORMS", "")
  for i, arg in enumerate(argv):
    if arg.startswith("--jax_platforms="):
      platforms = arg.split("=", 1)[1]
    elif arg == "--jax_platforms" and i + 1 < len(argv):
      platforms = argv[i + 1]
  return platforms.split(",")[0] == "cpu" if platforms else not cuda_installed()


def _glibc_hugetlb() -> bool:
  """Whether glibc knows the hugetlb tunable and the kernel gives huge pages only on request."""
  try:
    version = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # "glibc 2.36"
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      mode = f.read()
  except (ValueError, OSError, IndexError, AttributeError, TypeError):
    return False
  return tuple(int(x) for x in version.split(".")[:2]) >= (2, 35) and "[madvise]" in mode


def _reserve() -> str:
  """mimalloc's up-front reservation: the machine's RAM, at most 16 GiB (address space only)."""
  try:
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError):
    return "4GiB"
  return f"{max(1, min(16, ram // 2**30))}GiB"


def environment(base: dict | None = None, argv: list[str] | None = None) -> dict | None:
  """The environment a process started with `base` and `argv` (default: this one's) should run
  under, or None where it already does (or cannot, or the user opted out)."""
  base = dict(os.environ if base is None else base)
  argv = sys.argv if argv is None else argv
  if sys.platform != "linux" or base.get("JAXTRAIN_NO_REEXEC") == "1":
    return None
  env = dict(base)
  wanted = env.get("JAXTRAIN_MIMALLOC") != "0" and _runs_on_cpu(base, argv)
  library = mimalloc_library() if wanted else None
  if library and "malloc" not in env.get("LD_PRELOAD", ""):  # nor any allocator the user chose
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD")) if p)
    for name, value in {**MIMALLOC_OPTIONS, "MIMALLOC_ARENA_RESERVE": _reserve()}.items():
      env.setdefault(name, value)  # the user's own settings win
  tunables = env.get("GLIBC_TUNABLES", "")
  if HUGE_PAGES.split("=")[0] not in tunables and _glibc_hugetlb():
    env["GLIBC_TUNABLES"] = ":".join(t for t in (tunables, HUGE_PAGES) if t)
  return None if env == base else env


def reexec() -> None:
  """Restarts this process (same pid, same arguments) under `environment()`, if any."""
  env = environment()
  if env is not None:
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
