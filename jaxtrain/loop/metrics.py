"""What programs and people read after a run: metrics.jsonl and its loss plot."""

import json
from pathlib import Path

from jaxtrain.system import paths


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
    n_lines = len(self.path.read_text(encoding="utf-8").splitlines())
    keep = [r for r in paths.read_jsonl(self.path)
            if isinstance(r.get("step"), int) and r["step"] <= step]
    if len(keep) != n_lines:
      tmp = self.path.with_name(self.path.name + ".tmp")
      tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
      tmp.replace(self.path)
    return n_lines - len(keep)


def plot_losses(metrics_path: Path, png_path: Path) -> Path | None:
  """Train and validation loss against step, as a PNG next to metrics.jsonl."""
  if not metrics_path.exists():
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  train, val = [], []
  for r in paths.read_jsonl(metrics_path):
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
