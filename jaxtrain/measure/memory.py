"""Memory as a run goes: the process's peak resident set, the accelerator's memory in use, and a
warning (once) when the host or the device gets within 10% of running out.

"The host" is what this process may take of it: its RAM, or less where the process's cgroup
(a container's, a Slurm job's) has a lower memory limit, since the kernel kills a process over
that limit (exit status 137) however much RAM the machine has free."""

import dataclasses
import functools
import resource
import sys
from collections.abc import Callable
from pathlib import Path

import jax

from jaxtrain.system import fmt

LOW_FRACTION = 0.10  # warn when less than this fraction of the memory is left

KNOBS = ("lower train.batch_size (raise train.grad_accum to keep the tokens per step)",
         "lower model.seq_len", "use model.dtype=bfloat16", "fewer CPU devices (mesh.cpu_devices)",
         "or a smaller model (model.d_model, model.n_layers)")


def peak_rss() -> int:
  """This process's largest resident set so far, in bytes."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak if sys.platform == "darwin" else peak * 1024  # Linux counts KiB, macOS bytes


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


def _stat(path: Path, key: str) -> int:
  try:
    for line in path.read_text().splitlines():
      name, _, value = line.partition(" ")
      if name == key and value.strip().isdigit():
        return int(value)
  except OSError:
    pass
  return 0


def host_memory(root: Path = Path("/")) -> tuple[int, int, str] | None:
  """(total, available, what) of the memory this process may take: the host's RAM, or its
  cgroup's limit where less is available under that; None where neither can be read."""
  host = ram(root)
  limit = container_limit(root, host[0] if host else None)
  if limit is not None and (host is None or limit.available < host[1]):
    return limit.limit, limit.available, f"container memory limit ({limit.source})"
  return (*host, "RAM") if host else None


def device_memory(device: jax.Device) -> tuple[int, int | None] | None:
  """(bytes in use, limit) on an accelerator; None on a CPU or where the backend has no stats."""
  if device.platform == "cpu":
    return None
  stats = device.memory_stats() or {}
  if "bytes_in_use" not in stats:
    return None
  return stats["bytes_in_use"], stats.get("bytes_limit")


class Watch:
  """Read at each log line: `read()` gives the record's memory fields, their text for the
  progress line, and a warning the first time memory runs low (None otherwise)."""

  def __init__(self, host: Callable[[], tuple | None] = host_memory):
    self.host = host
    self.warned = False

  def read(self) -> tuple[dict, str, str | None]:
    record = {"peak_rss_bytes": peak_rss()}
    text = f"rss {fmt.nbytes(record['peak_rss_bytes'])}"
    on_device = device_memory(jax.local_devices()[0])
    low = []
    if on_device is not None:
      record["device_bytes_in_use"] = in_use = on_device[0]
      text += f" | device {fmt.nbytes(in_use)}"
      if on_device[1] and on_device[1] - in_use < LOW_FRACTION * on_device[1]:
        low.append(f"the device has {fmt.nbytes(on_device[1] - in_use)} of "
                   f"{fmt.nbytes(on_device[1])} left")
    host = self.host()
    if host is not None and host[1] < LOW_FRACTION * host[0]:
      what = host[2] if len(host) > 2 else "RAM"
      low.append(f"{fmt.nbytes(host[1])} of {fmt.nbytes(host[0])} {what} available")
    if not low or self.warned:
      return record, text, None
    self.warned = True
    return record, text, (f"warning: memory is running low ({'; '.join(low)}; this process "
                          f"peaked at {fmt.nbytes(record['peak_rss_bytes'])}). To use less: "
                          f"{'; '.join(KNOBS)}")
