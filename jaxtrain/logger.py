"""What a person sees (a progress bar or plain lines) and what programs read (metrics.jsonl, PNG)."""

import json
import sys
from pathlib import Path


def fmt_time(seconds: float) -> str:
  seconds = max(0.0, seconds)
  if seconds < 60:
    return f"{seconds:.1f}s"
  m, s = divmod(int(seconds), 60)
  if m < 60:
    return f"{m}m{s:02d}s"
  h, m = divmod(m, 60)
  return f"{h}h{m:02d}m"


def fmt_count(n: float) -> str:
  for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(n) >= scale:
      return f"{n / scale:.2f}{unit}"
  return f"{n:.0f}"


class MetricsFile:
  """metrics.jsonl: one JSON object per line, appended and flushed as the run goes."""

  def __init__(self, path: Path, enabled: bool = True):
    self.path, self.enabled = path, enabled

  def write(self, **record) -> None:
    if self.enabled:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")

  def drop_after(self, step: int) -> int:
    """On resume: lines past the restored step will be recomputed, so they go. Returns how many."""
    if not self.enabled or not self.path.exists():
      return 0
    lines = self.path.read_text(encoding="utf-8").splitlines()
    keep = [l for l in lines if _step_of(l) is not None and _step_of(l) <= step]
    if len(keep) != len(lines):
      tmp = self.path.with_name(self.path.name + ".tmp")
      tmp.write_text("".join(l + "\n" for l in keep), encoding="utf-8")
      tmp.replace(self.path)
    return len(lines) - len(keep)


def _step_of(line: str) -> int | None:
  """The line's step, or None for a line a kill cut short mid-write."""
  try:
    return json.loads(line)["step"]
  except (ValueError, KeyError, TypeError):
    return None


class Console:
  """Prints on process 0 only; a tqdm bar on a terminal unless headless, plain lines otherwise."""

  def __init__(self, enabled: bool = True, headless: bool = False):
    self.enabled = enabled
    self.use_bar = enabled and not headless and sys.stderr.isatty()
    self.bar = None

  def print(self, line: str) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.write(line)
    else:
      print(line, flush=True)

  def start(self, total: int, initial: int) -> None:
    if self.use_bar:
      from tqdm.auto import tqdm

      self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

  def progress(self, step: int, total: int, loss: float, lr: float, tokens_per_sec: float,
               elapsed: float, eta: float) -> None:
    if self.bar is not None:
      self.bar.update(step - self.bar.n)
      self.bar.set_postfix_str(f"loss {loss:.4f} lr {lr:.2e} {fmt_count(tokens_per_sec)} tok/s",
                               refresh=False)
    else:
      self.print(f"step {step:>6}/{total} | loss {loss:.4f} | lr {lr:.2e} | "
                 f"{fmt_count(tokens_per_sec)} tok/s | elapsed {fmt_time(elapsed)} | "
                 f"eta {fmt_time(eta)}")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


def plot_losses(metrics_path: Path, png_path: Path) -> Path | None:
  """Train and validation loss against step, as a PNG next to metrics.jsonl."""
  if not metrics_path.exists():
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  train, val = [], []
  for line in metrics_path.read_text(encoding="utf-8").splitlines():
    r = json.loads(line)
    if "loss" in r:
      train.append((r["step"], r["loss"]))
    if "val_loss" in r:
      val.append((r["step"], r["val_loss"]))
  if not train and not val:
    return None
  fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
  if train:
    ax.plot(*zip(*train), label="train", lw=1.2)
  if val:
    ax.plot(*zip(*val), "o-", label="validation", lw=1.5, ms=3)
  ax.set_xlabel("optimizer step")
  ax.set_ylabel("loss (nats/token)")
  ax.set_title(png_path.parent.name)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(png_path)
  plt.close(fig)
  return png_path
