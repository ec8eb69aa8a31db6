"""Numbers as a person reads them: counts, bytes and durations."""

import re


def count(n: float) -> str:
  for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(n) >= scale:
      return f"{n / scale:.2f}{unit}"
  return f"{n:.0f}"


def nbytes(n: float) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{n:.0f} B"


def duration(seconds: float) -> str:
  seconds = max(0.0, seconds)
  if seconds < 60:
    return f"{seconds:.1f}s"
  m, s = divmod(int(seconds), 60)
  if m < 60:
    return f"{m}m{s:02d}s"
  h, m = divmod(m, 60)
  return f"{h}h{m:02d}m"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def parse_duration(text: str) -> float | None:
  """Seconds in "90", "90s", "10m", "1h30m", "1.5h"; None for anything else."""
  text = str(text).strip().lower()
  pos, total = 0, 0.0
  while pos < len(text):
    m = _PART.match(text, pos)
    if not m:
      return None
    total += float(m.group(1)) * _UNITS[m.group(2) or "s"]
    pos = m.end()
  return total if text and total > 0 else None
