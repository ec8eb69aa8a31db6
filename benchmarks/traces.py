"""GPU kernel time by kernel name, from a jax.profiler trace (`perfetto_trace.json.gz`, which
`train.profile_steps` writes) or a torch.profiler trace (`*.pt.trace.json`, which nanoGPT's
bench.py writes): what a step's device time goes to, side by side.

Both files are Chrome trace-event JSON: complete events (`"ph": "X"`) with a start and duration in
microseconds. jax puts each GPU's kernels under a process named `/device:GPU:N`; torch marks its
kernels with the category `kernel`. Copies and memsets are counted apart from kernels.
"""

import collections
import gzip
import json
from pathlib import Path

COPY_WORDS = ("memcpy", "memset")


def _events(path: Path) -> list[dict]:
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8") as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def _device_events(events: list[dict]) -> list[dict]:
  """The complete events that ran on a GPU, in either trace's convention."""
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and str(e.get("args", {}).get("name", "")).startswith("/device:GPU")}
  return [e for e in events if e.get("ph") == "X" and
          (e.get("pid") in devices or e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))]


def kernel_table(path: Path, steps: int, top: int = 15) -> dict:
  """{"kernel_ms_per_step", "copy_ms_per_step", "span_ms_per_step", "idle_ms_per_step",
  "kernels": [(name, ms per step, share of kernel time)]}: the `top` kernels by time, the trace's
  device time divided by the `steps` it holds. Idle is the device's span minus its busy time."""
  events = _device_events(_events(path))
  if not events:
    raise ValueError(f"{path} holds no GPU events (a CPU trace, or not a profiler trace)")
  per_name: dict[str, float] = collections.defaultdict(float)
  copies = 0.0
  for e in events:
    if any(w in e["name"].lower() for w in COPY_WORDS):
      copies += e["dur"]
    else:
      per_name[e["name"]] += e["dur"]
  total = sum(per_name.values())
  kernels = [e for e in events if not any(w in e["name"].lower() for w in COPY_WORDS)]
  busy = _busy_us(kernels)
  span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
  ranked = sorted(per_name.items(), key=lambda kv: -kv[1])[:top]
  return {"steps": steps, "kernel_ms_per_step": total / steps / 1e3,
          "copy_ms_per_step": copies / steps / 1e3, "span_ms_per_step": span / steps / 1e3,
          "idle_ms_per_step": (span - busy) / steps / 1e3,
          "kernels": [(name, us / steps / 1e3, us / total) for name, us in ranked]}


def _busy_us(events: list[dict]) -> float:
  """Microseconds during which at least one of `events` ran (overlaps counted once)."""
  busy, end = 0.0, None
  for e in sorted(events, key=lambda e: e["ts"]):
    start, stop = e["ts"], e["ts"] + e["dur"]
    if end is None or start > end:
      busy += stop - start
      end = stop
    elif stop > end:
      busy += stop - end
      end = stop
  return busy


def find_trace(directory: Path, pattern: str) -> Path | None:
  """The newest file matching `pattern` under `directory`, if any."""
  found = sorted(directory.rglob(pattern), key=lambda p: p.stat().st_mtime)
  return found[-1] if found else None


def markdown(tables: dict[str, dict]) -> str:
  """The sides' tables one after the other: totals, then their top kernels."""
  lines = ["| side | kernels ms/step | copies ms/step | device idle ms/step | traced steps |",
           "|---|---|---|---|---|"]
  for side, t in tables.items():
    lines.append(f"| {side} | {t['kernel_ms_per_step']:.2f} | {t['copy_ms_per_step']:.2f} | "
                 f"{t['idle_ms_per_step']:.2f} | {t['steps']} |")
  for side, t in tables.items():
    lines += ["", f"{side}'s largest kernels:", "", "| kernel | ms/step | share |", "|---|---|---|"]
    lines += [f"| `{name[:90]}` | {ms:.2f} | {share:.1%} |" for name, ms, share in t["kernels"]]
  return "\n".join(lines) + "\n"
