"""Early stopping: a training-loop hook that ends the run once `train.early_stop_patience`
evaluations in a row bring no new best validation loss. The run then saves and finishes as at
max_steps (exit status 0); the best checkpoint is kept by checkpoint.py's retention policy, so
`--step=best` in sample and export finds it."""

import math

import ml_collections

from jaxtrain.loop.hooks import Hook


class EarlyStop(Hook):
  """Counts evaluations since the best validation loss this process has seen (after a resume it
  counts again from the resumed step's first evaluation)."""

  def __init__(self, patience: int):
    self.patience = patience
    self.best = math.inf
    self.best_step: int | None = None
    self.since_best = 0

  def on_eval(self, step: int, record: dict) -> None:
    val = record["val_loss"]
    if val < self.best:
      self.best, self.best_step, self.since_best = val, step, 0
    else:
      self.since_best += 1

  def stop_reason(self) -> str | None:
    if self.since_best < self.patience:
      return None
    return (f"early stop: no new best val loss in {self.since_best} evaluations "
            f"(train.early_stop_patience={self.patience}); the best, {self.best:.4f} at step "
            f"{self.best_step}, is kept: --step=best")


def hooks(train: ml_collections.ConfigDict) -> list[EarlyStop]:
  return [EarlyStop(train.early_stop_patience)] if train.early_stop_patience > 0 else []
