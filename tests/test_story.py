"""A run that tells its story: the latest val loss beside the loss as it trains, the learning rate
under the loss curves, one summary at the end (best val and its step, tokens seen, where the time
went), and `--dry_run`: the plan of a run without running it."""

import json

import matplotlib.image

from jaxtrain.system.console import Console
from jaxtrain.trackers import metrics_jsonl


def test_the_progress_line_shows_the_latest_val_loss_beside_the_loss(capsys):
  out = Console(headless=True)
  out.progress(5, 100, 2.5, 1e-3, 1000.0, 3.0, 60.0, "rss 1.00 GiB")
  out.progress(15, 100, 2.25, 1e-3, 1000.0, 4.0, 50.0, "rss 1.00 GiB", val=2.375)
  before, after = capsys.readouterr().out.splitlines()
  assert before.startswith("step      5/100 | loss 2.5000 | lr 1.00e-03 |")  # no eval yet
  assert after.startswith("step     15/100 | loss 2.2500 | val 2.3750 | lr 1.00e-03 |")


def test_the_loss_plot_has_the_learning_rate_below_the_losses(tmp_path):
  records = [{"step": s, "loss": 3.0 - s / 100, "lr": min(s, 20) * 1e-4} for s in range(5, 105, 5)]
  records += [{"step": s, "val_loss": 3.1 - s / 100} for s in (50, 100)]
  fig = metrics_jsonl.figure(records, "run")
  losses, lrs = fig.axes
  assert [line.get_label() for line in losses.get_lines()] == ["train", "validation"]
  assert list(lrs.get_lines()[0].get_ydata()) == [r["lr"] for r in records if "lr" in r]
  assert lrs.get_ylabel() == "learning rate" and lrs.get_xlabel() == "optimizer step"
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  png = metrics_jsonl.plot_losses(path, tmp_path / "loss.png")
  assert matplotlib.image.imread(png).shape[0] > 500  # two panels, one over the other
