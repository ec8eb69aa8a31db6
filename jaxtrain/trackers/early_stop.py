"""Early stopping: a training-loop hook that ends the run once `train.early_stop_patience`
evaluations in a row bring no new best of `train.early_stop_metric` (val_loss by default; val_bpb,
or a task's number from `train.eval_tasks`: task/<name>/exact_match and mc_accuracy are better
higher, the rest lower). The run then saves and finishes as at max_steps (exit status 0); the
checkpoint with the best val loss is kept by checkpoints/store.py's retention policy, so
`--step=best` in sample and export finds it."""

import math

from jaxtrain.config import defaults
from jaxtrain.trackers.hooks import Hook


class EarlyStop(Hook):
  """Counts evaluations since the best value of `metric` this process has seen (after a resume it
  counts again from the resumed step's first evaluation). A record without the metric (task
  scores come on process 0 only) counts on no side."""

  def __init__(self, patience: int, metric: str = "val_loss"):
    self.patience, self.metric = patience, metric
    self.sign = -1.0 if defaults.higher_is_better(metric) else 1.0  # sign * value: lower is better
    self.best = math.inf * self.sign
    self.best_step: int | None = None
    self.since_best = 0

  def on_eval(self, step: int, record: dict) -> None:
    value = record.get(self.metric)
    if value is None:
      return
    if self.sign * value < self.sign * self.best:
      self.best, self.best_step, self.since_best = value, step, 0
    else:
      self.since_best += 1

  def stop_reason(self) -> str | None:
    if self.since_best < self.patience:
      return None
    if self.metric == "val_loss":
      return (f"early stop: no new best val loss in {self.since_best} evaluations "
              f"(train.early_stop_patience={self.patience}); the best, {self.best:.4f} at step "
              f"{self.best_step}, is kept: --step=best")
    return (f"early stop: no new best {self.metric} in {self.since_best} evaluations "
            f"(train.early_stop_patience={self.patience}); the best, {self.best:.4f}, was at step "
            f"{self.best_step} (--step=best is the checkpoint with the lowest val loss)")
