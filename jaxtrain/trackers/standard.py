"""The hooks a run has: metrics.jsonl, status.json, the given ones, TensorBoard, W&B where
`log.wandb` asks (these four on process 0, which writes the run's files), early stopping where
`train.early_stop_patience` asks, and a profile where `train.profile_steps` does."""

from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections

from jaxtrain.trackers import early_stop, profile, wandb_log
from jaxtrain.trackers.hooks import Hook, Hooks
from jaxtrain.trackers.metrics_jsonl import MetricsJsonl
from jaxtrain.trackers.status import Status
from jaxtrain.trackers.tensorboard_log import TensorBoard


def for_run(cfg: ml_collections.ConfigDict, workdir: Path, given: Sequence[Hook] = ()) -> Hooks:
  """metrics.jsonl's hook comes first: a record is on disk before any other hook sees it; then
  status.json's, so that its step is the record's even where a later hook fails on it."""
  main = jax.process_index() == 0
  return Hooks([*([MetricsJsonl(), Status()] if main else []), *given,
                *([TensorBoard(), *wandb_log.hooks(cfg.log)] if main else []),
                *early_stop.hooks(cfg.train), *profile.hooks(cfg.train, workdir)])
