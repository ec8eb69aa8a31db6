"""The hooks a run has: the files' (on process 0, which writes the run's files), the given ones,
and those its config asks for."""

from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections

from jaxtrain.trackers.early_stop import EarlyStop
from jaxtrain.trackers.hooks import Hook, Hooks
from jaxtrain.trackers.metrics_jsonl import MetricsJsonl
from jaxtrain.trackers.profile import Profile
from jaxtrain.trackers.status import Status
from jaxtrain.trackers.tensorboard_log import TensorBoard
from jaxtrain.trackers.wandb_log import WandB


def for_run(cfg: ml_collections.ConfigDict, workdir: Path, given: Sequence[Hook] = ()) -> Hooks:
  """metrics.jsonl's hook comes first: a record is on disk before any other hook sees it; then
  status.json's, so that its step is the record's even where a later hook fails on it."""
  t, main = cfg.train, jax.process_index() == 0
  hooks = [*([MetricsJsonl(), Status()] if main else []), *given, *([TensorBoard()] if main else [])]
  if main and cfg.log.wandb:
    hooks.append(WandB(cfg.log.wandb_project, cfg.log.wandb_mode))
  if t.early_stop_patience > 0:
    hooks.append(EarlyStop(t.early_stop_patience, t.early_stop_metric))
  if main and t.profile_steps > 0:  # process 0 traces
    hooks.append(Profile(t.profile_steps, Path(workdir) / "profile"))
  return Hooks(hooks)
