"""metrics.jsonl, what programs and people read after a run (compare, sweep, `--step=best`, the
notebooks), and its loss plot (loss.png, the learning rate below the losses). The file is one JSON
object a line: each logged step's record and each evaluation's, appended and flushed as the run
goes; a resumed leg first drops the lines past the step it restored, which it trains again, as
TensorBoard's hook drops its events."""

import json
from pathlib import Path

from jaxtrain.system import paths
from jaxtrain.trackers.hooks import Hook, RunView

FILE = "metrics.jsonl"


def drop_after(path: Path, step: int) -> int:
  """The lines of `path` past `step` removed (a line a kill cut short too); returns how many."""
  if not path.exists():
    return 0
  n_lines = len(path.read_text(encoding="utf-8").splitlines())
  keep = [r for r in paths.read_jsonl(path) if isinstance(r.get("step"), int) and r["step"] <= step]
  if len(keep) != n_lines:
    paths.write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
  return n_lines - len(keep)


class MetricsJsonl(Hook):
  """Writes the run's metrics.jsonl (process 0's: standard.py attaches it there)."""

  def __init__(self):
    self.path: Path | None = None

  def prepare(self) -> None:
    import matplotlib.figure  # noqa: F401  (for the loss plot at the end)

  def on_start(self, run: RunView, step: int) -> None:
    self.path = Path(run.workdir) / FILE
    dropped = drop_after(self.path, step)
    if dropped:
      run.out.print(f"{FILE}: dropped {dropped} lines past step {step}, which is trained again")

  def on_log(self, step: int, record: dict) -> None:
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")

  on_eval = on_log  # an evaluation's record is a line of the file too


def plot_losses(metrics_path: Path, png_path: Path) -> Path | None:
  """Train and validation loss against step, with the learning rate below them, as a PNG next to
  metrics.jsonl. Safe in a thread of its own: matplotlib's objects, not pyplot's shared state."""
  if not metrics_path.exists():
    return None
  fig = figure(paths.read_jsonl(metrics_path), png_path.parent.name)
  if fig is None:
    return None
  fig.savefig(png_path)
  return png_path


def figure(records: list[dict], title: str):
  """The loss plot of metrics.jsonl's records (None without a loss): train and validation loss,
  and in a panel below on the same steps, the learning rate, whose schedule explains most
  bends of the loss (warmup, a WSD decay, a resume with a new schedule)."""
  from matplotlib.figure import Figure

  train = [(r["step"], r["loss"]) for r in records if "loss" in r]
  val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
  lr = [(r["step"], r["lr"]) for r in records if isinstance(r.get("lr"), int | float)]
  if not train and not val:
    return None
  fig = Figure(figsize=(7, 5.5), dpi=110)
  ax, ax_lr = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
  if train:
    ax.plot(*zip(*train), label="train", lw=1.2)
  if val:
    ax.plot(*zip(*val), "o-", label="validation", lw=1.5, ms=3)
  ax.set_ylabel("loss (nats/token)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  if lr:
    ax_lr.plot(*zip(*lr), color="tab:green", lw=1.2)
  ax_lr.set_ylabel("learning rate")
  ax_lr.set_xlabel("optimizer step")
  ax_lr.grid(alpha=0.3)
  fig.tight_layout()
  return fig
