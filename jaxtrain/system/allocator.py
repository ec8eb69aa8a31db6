"""The memory allocator under XLA:CPU's buffers, which a process can only choose when it starts.

XLA:CPU allocates a step's temporaries (GiBs) and frees them every step; glibc hands such blocks
back to the kernel at once, which maps and zeroes them afresh every step. mimalloc, told never to
return freed memory, reuses the same pages; without it, glibc's `hugetlb` tunable at least brings
them in 2 MiB at a time. XLA's compiles are the exception (`purging`): what they free goes back at
once, or the compiler's garbage would stay in the process as its peak memory.

Kept free of heavy imports: `python -m jaxtrain` restarts itself (`reexec`) before it imports
jax. Linux, CPU runs only (system/startup.py decides the platform); `JAXTRAIN_NO_REEXEC=1` leaves
the process as it is, `JAXTRAIN_MIMALLOC=0` keeps glibc (with huge pages), and so does anything
already in `LD_PRELOAD`. A notebook or a script cannot restart: a run there says so in one line
(`lost_note`), with what avoids it.
"""

import contextlib
import ctypes
import os
import sys
from pathlib import Path

from jaxtrain.system import invocation, machine

HUGE_PAGES = "glibc.malloc.hugetlb=1"
MIMALLOC = Path("cmeel.prefix", "lib", "libmimalloc.so.3")  # where the cmeel-mimalloc wheel puts it
# Keep freed memory mapped (a step frees and takes back the same blocks); back it with huge
# pages; one address-space reservation up front, so that GiB-sized blocks come from one arena.
MIMALLOC_OPTIONS = {"MIMALLOC_PURGE_DELAY": "-1", "MIMALLOC_ALLOW_LARGE_OS_PAGES": "1"}
MI_OPTION_PURGE_DELAY = 15  # mimalloc.h's mi_option_purge_delay (mimalloc 2.1 to 3.x)
RESTARTED = "JAXTRAIN_REEXECED"  # set for the restarted process only; it removes it at once


def mimalloc_library() -> str | None:
  """The installed libmimalloc.so (the `cmeel-mimalloc` dependency), or None."""
  for entry in sys.path:
    path = Path(entry) / MIMALLOC
    # ld.so splits LD_PRELOAD at spaces and colons and expands `$`: such a path cannot be given.
    if os.path.isabs(entry) and path.is_file() and not set(str(path)) & set(" :\t$"):
      return str(path)
  return None


def _glibc_hugetlb() -> bool:
  """Whether glibc knows the hugetlb tunable and the kernel gives huge pages only on request."""
  try:
    version = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # "glibc 2.36"
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      mode = f.read()
  except (ValueError, OSError, IndexError, AttributeError, TypeError):
    return False
  return tuple(int(x) for x in version.split(".")[:2]) >= (2, 35) and "[madvise]" in mode


def environment(base: dict | None = None, on_cpu: bool = True) -> dict | None:
  """The environment a process started with `base` (default: this one's) should run under, or
  None where it already does (or cannot, or the user opted out); mimalloc only `on_cpu`."""
  base = dict(os.environ if base is None else base)
  if sys.platform != "linux" or base.get("JAXTRAIN_NO_REEXEC") == "1":
    return None
  env = dict(base)
  wanted = env.get("JAXTRAIN_MIMALLOC") != "0" and not env.get("LD_PRELOAD") and on_cpu
  library = mimalloc_library() if wanted else None
  if library:
    env["LD_PRELOAD"] = library
    gib = (machine.host_memory() or (2**33,))[0] // 2**30  # RAM, or a container's lower limit
    for name, value in {**MIMALLOC_OPTIONS, "MIMALLOC_ARENA_RESERVE": f"{max(1, min(16, gib))}GiB"}.items():
      env.setdefault(name, value)  # the user's own settings win
  tunables = env.get("GLIBC_TUNABLES", "")
  if HUGE_PAGES.split("=")[0] not in tunables and _glibc_hugetlb():
    env["GLIBC_TUNABLES"] = ":".join(t for t in (tunables, HUGE_PAGES) if t)
  return None if env == base else env


def started_as_cli() -> bool:
  """Whether this process is `python -m jaxtrain` or the `jaxtrain` console script, not a notebook
  or another script running the module (a restart would restart them)."""
  return invocation.started() == "-m jaxtrain" or invocation.script() == "jaxtrain"


def lost_note() -> str | None:
  """In a process of a CPU run that was not started under `environment()` (a notebook, a script:
  no restart is possible there), the line that says what the command line has that it lacks, and
  how to start Python to get it; None where nothing is lost."""
  env = environment()
  if started_as_cli() or env is None or "LD_PRELOAD" not in env or in_use() == "mimalloc":
    return None
  start = " ".join(f"{k}={v}" for k, v in env.items() if os.environ.get(k) != v)
  return (f"note: {in_use()} allocator, where `python -m jaxtrain` restarts itself under mimalloc "
          "(XLA's per-step buffers stay mapped: faster CPU steps); to get it, start Python (jupyter "
          f"lab, your script) as `{start} python`")


def reexec(env: dict | None) -> None:
  """Restarts this process (same pid, same arguments) under `env` (None: not). In the restarted
  process, drops the preload from the environment its own subprocesses inherit (the library
  stays loaded here)."""
  if os.environ.pop(RESTARTED, None) is not None:
    if os.environ.get("LD_PRELOAD") == mimalloc_library():
      del os.environ["LD_PRELOAD"]
    return
  if env is not None:
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**env, RESTARTED: "1"})


def describe(env: dict) -> str:
  """How a process started with `env` allocates memory, in words: mimalloc, or glibc (with huge
  pages)."""
  if "libmimalloc" in env.get("LD_PRELOAD", ""):
    return "mimalloc"
  return "glibc" + (" with huge pages" if "hugetlb=1" in env.get("GLIBC_TUNABLES", "") else "")


def in_use() -> str:
  """The allocator this process runs on, for the log (its preload is no longer in os.environ)."""
  try:
    with open("/proc/self/maps") as f:
      mapped = "libmimalloc" in f.read()
  except OSError:
    return "default"
  return "mimalloc" if mapped else describe({**os.environ, "LD_PRELOAD": ""})


@contextlib.contextmanager
def purging():
  """In this block (around compiles), what mimalloc frees goes back to the kernel at once (its
  purge delay 0; then again what it was): the compiler's garbage, in other threads' heaps, would
  otherwise stay as the process's peak. A process without mimalloc 2.1 to 3.x is left alone."""
  lib = ctypes.CDLL(None)
  version = lib.mi_version() if hasattr(lib, "mi_version") else 0  # 2.1.x is 21x, 3.4.3 is 30403
  if not (210 <= version < 400 or 30000 <= version < 40000):
    yield
    return
  lib.mi_option_get.restype = ctypes.c_long
  before = lib.mi_option_get(MI_OPTION_PURGE_DELAY)
  lib.mi_option_set(MI_OPTION_PURGE_DELAY, ctypes.c_long(0))
  try:
    yield
  finally:
    lib.mi_option_set(MI_OPTION_PURGE_DELAY, ctypes.c_long(before))
