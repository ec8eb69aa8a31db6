"""Memory as a run goes: the process's peak resident set, the accelerator's memory in use, and a
warning (once) when the host or the device gets within 10% of running out.

"The host" is what this process may take of it (`system.machine.host_memory`): its RAM, or less
where the process's cgroup (a container's, a Slurm job's) has a lower memory limit, since the
kernel kills a process over that limit (exit status 137) however much RAM the machine has free."""

import resource
import sys
from collections.abc import Callable

import jax

from jaxtrain.system import fmt, machine

LOW_FRACTION = 0.10  # warn when less than this fraction of the memory is left

KNOBS = ("lower train.batch_size (raise train.grad_accum to keep the tokens per step)",
         "lower model.seq_len", "use model.dtype=bfloat16", "fewer CPU devices (mesh.cpu_devices)",
         "or a smaller model (model.d_model, model.n_layers)")


class Watch:
  """Read at each log line: `read()` gives the record's memory fields, their text for the
  progress line, and a warning the first time memory runs low (None otherwise)."""

  def __init__(self, host: Callable[[], tuple | None] = machine.host_memory):
    self.host = host
    self.warned = False

  def read(self) -> tuple[dict, str, str | None]:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # this process's largest RSS
    record = {"peak_rss_bytes": peak if sys.platform == "darwin" else peak * 1024}  # Linux: KiB
    text = f"rss {fmt.nbytes(record['peak_rss_bytes'])}"
    device = jax.local_devices()[0]  # an accelerator's stats; a CPU's are the host's
    stats = {} if device.platform == "cpu" else device.memory_stats() or {}
    low = []
    if "bytes_in_use" in stats:
      record["device_bytes_in_use"] = in_use = stats["bytes_in_use"]
      text += f" | device {fmt.nbytes(in_use)}"
      limit = stats.get("bytes_limit")
      if limit and limit - in_use < LOW_FRACTION * limit:
        low.append(f"the device has {fmt.nbytes(limit - in_use)} of {fmt.nbytes(limit)} left")
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
