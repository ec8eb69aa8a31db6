"""Checkpoints through orbax: the state's arrays, the grain iterator and the run's metadata.

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never leaves a checkpoint that `latest_step` would pick. Kept: the `keep` latest steps
plus the one with the best validation loss.
"""

import json
from pathlib import Path

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from jaxtrain import programs as programs_lib
from jaxtrain import steps
from jaxtrain import tokenizer as tokenizer_lib


def _val_loss(metrics: dict) -> float:
  return metrics["val_loss"]


class Checkpoints:

  def __init__(self, workdir: str, keep: int = 1, read_only: bool = False):
    self.directory = Path(workdir).absolute() / "checkpoints"
    policy = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # reverse=True sorts by descending loss, and BestN keeps the tail: the lowest loss.
        policies.BestN(get_metric_fn=_val_loss, reverse=True, n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    # cleanup_tmp_directories: a save cut short by a kill leaves a temporary directory; it is
    # never mistaken for a checkpoint, and the next start removes it.
    options = ocp.CheckpointManagerOptions(
        preservation_policy=None if read_only else policy, create=not read_only,
        read_only=read_only, enable_async_checkpointing=True,
        cleanup_tmp_directories=not read_only)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self._closed = False

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def complete_steps(self) -> list[int]:
    """Steps whose checkpoint is whole on disk: orbax gives a step's directory its number only
    once everything in it is written (a failed save stays a temporary directory)."""
    if not self.directory.is_dir():
      return []
    return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

  def save(self, state: steps.TrainState, iterator: grain.DatasetIterator | None = None,
           meta: dict | None = None, val_loss: float | None = None) -> None:
    """Starts an async save of `state` at its step; returns once the arrays are copied."""
    step = int(state.step)
    items = {"state": ocp.args.StandardSave(state.arrays()),
             "meta": ocp.args.JsonSave(meta or {})}
    if iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(iterator)
    args = ocp.args.Composite(**items)
    metrics = None if val_loss is None else {"val_loss": float(val_loss)}
    self.manager.save(step, args=args, metrics=metrics, force=True)

  def restore_arrays(self, step: int, target) -> dict:
    """Only the state's arrays, into `target` (a tree of ShapeDtypeStructs with shardings)."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
    return self.manager.restore(step, args=args).state

  def read_meta(self, step: int) -> dict:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore(self, step: int, state: steps.TrainState, shardings: steps.TrainState | None = None,
              iterator: grain.DatasetIterator | None = None) -> steps.TrainState:
    """Restores into `state`'s structure (and `shardings`, default: one device); an `iterator`
    is repositioned in place."""
    if shardings is None:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: device, state)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          state.arrays(), shardings.arrays())
    if iterator is None:
      return state.with_arrays(self.restore_arrays(step, target))
    data_dir = self.directory / str(step) / "data"
    mine = data_dir / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if mine.exists():
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target),
          data=grain.checkpoint.CheckpointRestore(iterator),
      ))
      return state.with_arrays(restored.state)
    # Saved by another number of processes. Every process's iterator stands at the same
    # micro-batch index (each reads its own rows of the same global batch), so any file will do.
    saved = sorted(data_dir.glob("process_*-of-*.json"))
    if not saved:
      raise FileNotFoundError(f"checkpoint {step} has no data iterator state in {data_dir}")
    iterator.set_state(json.loads(saved[0].read_text()))
    return state.with_arrays(self.restore_arrays(step, target))

  def check(self) -> None:
    """Raises the error of a background save that failed, if any."""
    self.manager.check_for_errors()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves; raises what a failed background write raised."""
    if not self._closed:
      self._closed = True
      try:
        self.manager.wait_until_finished()
      finally:
        self.manager.close()


def load_tokenizer(workdir: str):
  """The tokenizer a run in `workdir` trained with: `.encode(text)`, `.decode(ids)`."""
  return tokenizer_lib.load(str(Path(workdir) / "tokenizer.json"))


def load_state(workdir: str, step: int | None = None) -> steps.TrainState:
  """The train state saved in a run's workdir (its latest step by default), on one device.

  For sampling, evaluation or inspection outside the training loop: no data is needed.
  """
  ckpts = Checkpoints(workdir, read_only=True)
  try:
    step = ckpts.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {ckpts.directory}")
    cfg = ml_collections.ConfigDict(ckpts.read_meta(step)["config"])
    cfg.mesh.data, cfg.mesh.fsdp = 1, 1  # one device, whatever the run trained on
    if jax.devices()[0].platform == "cpu" and cfg.model.dtype == "float16":
      cfg.model.dtype = "float32"  # compute dtype only (params are float32): CPUs lack float16
    vocab_size = cfg.model.vocab_size or load_tokenizer(workdir).vocab_size
    programs = programs_lib.build(cfg, vocab_size, devices=jax.devices()[:1])
    return ckpts.restore(step, programs.abstract, programs.shardings)
  finally:
    ckpts.close()
