"""Checkpoints through orbax: the state's arrays, the grain iterator and the run's metadata.

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never leaves a checkpoint that `latest_step` would pick. Kept: the `keep` latest steps
plus the one with the best validation loss.
"""

from pathlib import Path

import grain
import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from jaxtrain import steps


def _val_loss(metrics: dict) -> float:
  return metrics["val_loss"]


class Checkpoints:

  def __init__(self, workdir: str, keep: int):
    self.directory = Path(workdir).absolute() / "checkpoints"
    policy = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # reverse=True sorts by descending loss, and BestN keeps the tail: the lowest loss.
        policies.BestN(get_metric_fn=_val_loss, reverse=True, n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=True,
                                           enable_async_checkpointing=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, state: steps.TrainState, iterator: grain.DatasetIterator, meta: dict,
           val_loss: float | None = None) -> None:
    """Starts an async save of `state` at its step; returns once the arrays are copied."""
    step = int(state.step)
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state.arrays()),
        data=grain.checkpoint.CheckpointSave(iterator),
        meta=ocp.args.JsonSave(meta),
    )
    metrics = None if val_loss is None else {"val_loss": float(val_loss)}
    self.manager.save(step, args=args, metrics=metrics, force=True)

  def read_meta(self, step: int) -> dict:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore(self, step: int, state: steps.TrainState, shardings: steps.TrainState,
              iterator: grain.DatasetIterator) -> steps.TrainState:
    """Restores into `state`'s structure with `shardings`; `iterator` is repositioned in place."""
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          state.arrays(), shardings.arrays())
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target),
        data=grain.checkpoint.CheckpointRestore(iterator),
    ))
    return state.with_arrays(restored.state)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
