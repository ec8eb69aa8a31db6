"""What this machine is, asked in one place: its CPU (/proc/cpuinfo, read once), the cores this
process may use, the memory it may take (RAM, or less under a cgroup's limit), when a process
started, how long work takes (`seconds`) and how busy other processes keep the cores meanwhile
(`with_load`). What was measured on it is
kept by `measured`."""

import dataclasses
import functools
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


@functools.cache
def _cpuinfo() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return f.read(1 << 16)  # the first processor's block is enough
  except OSError:
    return ""


def cpu_id(cpuinfo: str | None = None) -> tuple[str, int, int, str]:
  """(vendor, family, model, model name) of this CPU, or of the /proc/cpuinfo text `cpuinfo`
  (("", -1, -1, "") where there is none)."""
  text = _cpuinfo() if cpuinfo is None else cpuinfo
  field = lambda key: (re.search(rf"^{key}\s*:\s*(.*)$", text, re.M) or [None, ""])[1].strip()
  number = lambda key: int(field(key)) if field(key).isdigit() else -1
  name = field("model name") or field("Hardware") or field("cpu model")  # x86, ARM, MIPS
  return field("vendor_id"), number("cpu family"), number("model"), name


def core_ids() -> list[int]:
  """The cores this process may run on (a pinned affinity: a sweep's share, `taskset`); [] where
  the system does not say (macOS)."""
  return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def cores() -> int:
  return len(core_ids()) or os.cpu_count() or 1


def started(pid: int | None = None) -> float | None:
  """When process `pid` (default: this one) started, in seconds since the epoch (Linux: /proc),
  or None where that cannot be read."""
  try:
    with open(f"/proc/{pid or os.getpid()}/stat") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command's name
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None
  return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def process_age_s() -> float:
  """Seconds since this process started, else 0: a time budget covers the whole command."""
  began = started()
  return 0.0 if began is None else max(0.0, time.time() - began)


def seconds(work: Callable[[], Any], at_least: int = 3, for_s: float = 0.0, at_most: int = 1000,
            untimed: int = 1, pick: Callable = statistics.median) -> float:
  """How long `work()` takes here: the median (or `pick`) of at least `at_least` timed calls,
  more while under `for_s` seconds and at most `at_most`, after `untimed` calls (the first call
  of a compiled program pays extra)."""
  for _ in range(untimed):
    work()
  times, end = [], time.perf_counter() + for_s
  while len(times) < at_least or (time.perf_counter() < end and len(times) < at_most):
    t = time.perf_counter()
    work()
    times.append(time.perf_counter() - t)
  return pick(times)


def _busy_seconds() -> tuple[float, float, float] | None:
  """(CPU seconds the cores this process may use have been busy, this process's own CPU seconds
  with its children's that ended, the time), or None without /proc/stat."""
  ids = set(core_ids())
  try:
    with open("/proc/stat") as f:
      rows = [line.split() for line in f if re.match(r"cpu\d+ ", line)]
  except OSError:
    return None
  # user nice system idle iowait irq softirq steal: all but idle and iowait is work
  ticks = sum(sum(map(int, r[1:4])) + sum(map(int, r[6:9])) for r in rows
              if not ids or int(r[0][3:]) in ids)
  return ticks / os.sysconf("SC_CLK_TCK"), sum(os.times()[:4]), time.time()


def with_load(work: Callable[[], Any]) -> tuple[Any, float | None]:
  """(what `work` returns, the share of this process's cores other processes kept busy while it
  ran; None where that cannot be read)."""
  before = _busy_seconds()
  value = work()
  after = _busy_seconds()
  if before is None or after is None or after[2] <= before[2]:
    return value, None
  others = (after[0] - before[0]) - (after[1] - before[1])
  return value, min(max(others / ((after[2] - before[2]) * cores()), 0.0), 1.0)


def ram(root: Path = Path("/")) -> tuple[int, int] | None:
  """(total, available) bytes of this host's RAM, or None where /proc/meminfo is not there.
  MemAvailable counts reclaimable page cache, as the kernel does before it kills anything."""
  try:
    with open(root / "proc/meminfo") as f:
      fields = dict(line.split(":", 1) for line in f)
    return (int(fields["MemTotal"].split()[0]) * 1024,
            int(fields["MemAvailable"].split()[0]) * 1024)
  except (OSError, KeyError, ValueError):
    return None


@dataclasses.dataclass(frozen=True)
class Limit:
  """A cgroup's memory limit, and what the processes in it use of it."""

  limit: int
  used: int  # page cache the kernel can drop left out, as it does before it kills anything
  source: str  # the file that sets it: "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes"

  @property
  def available(self) -> int:
    return max(self.limit - self.used, 0)


_FILES = {2: ("memory.max", "memory.current", "inactive_file"),
          1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}


def _number(path: Path) -> int | None:
  try:
    text = path.read_text().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None  # "max": no limit


@functools.lru_cache(maxsize=8)
def _cgroup_dirs(root: Path) -> list[tuple[int, Path, Path]]:
  """(version, this process's memory cgroup directory, its hierarchy's mount point) for each
  hierarchy that has the memory controller: from /proc/self/cgroup and where each is mounted.
  Found once: a process stays in its cgroup, and the memory watch asks at every log line."""
  try:
    groups = (root / "proc/self/cgroup").read_text().splitlines()
    mounts = (root / "proc/self/mountinfo").read_text().splitlines()
  except OSError:
    return []
  found = []
  for line in mounts:
    fields, _, rest = line.partition(" - ")
    fields, rest = fields.split(), rest.split()
    if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
      continue
    version = 2 if rest[0] == "cgroup2" else 1
    if version == 1 and "memory" not in rest[2].split(","):
      continue
    mount_root, mount = fields[3], root / fields[4].lstrip("/")
    for group in groups:
      if group.count(":") < 2:
        continue
      _, controllers, path = group.split(":", 2)
      if (version == 2 and controllers == "") or (version == 1 and "memory" in controllers.split(",")):
        inside = path[len(mount_root):] if path.startswith(mount_root) else ""
        found.append((version, mount / inside.lstrip("/"), mount))
  return found


def container_limit(root: Path = Path("/"), total: int | None = None) -> Limit | None:
  """The lowest memory limit on this process's cgroup and those above it, or None where none is
  set ("max", or a number beyond the host's RAM, `total`: a limit that binds nothing)."""
  total = total or (ram(root) or (None, None))[0]
  best = None
  for version, directory, mount in _cgroup_dirs(root):
    limit_file, usage_file, cache_key = _FILES[version]
    for d in [directory, *directory.parents]:
      limit = _number(d / limit_file)
      if limit is not None and (total is None or limit < total) and \
          (best is None or limit < best.limit):
        used = _number(d / usage_file) or 0
        best = Limit(limit, max(used - _stat(d / "memory.stat", cache_key), 0),
                     f"cgroup v{version} {limit_file}")
      if d == mount:
        break
  return best


def _stat(path: Path, name: str) -> int:
  try:
    found = re.search(rf"^{name} (\d+)$", path.read_text(), re.M)
  except OSError:
    return 0
  return int(found[1]) if found else 0


def host_memory(root: Path = Path("/")) -> tuple[int, int, str] | None:
  """(total, available, what) of the memory this process may take: the host's RAM, or its
  cgroup's limit where less is available under that; None where neither can be read."""
  host = ram(root)
  limit = container_limit(root, host[0] if host else None)
  if limit is not None and (host is None or limit.available < host[1]):
    return limit.limit, limit.available, f"container memory limit ({limit.source})"
  return (*host, "RAM") if host else None
