"""The hook that keeps a run's status.json (running, finished, stopped by a signal, failed) up to
date, for compare and sweep to read."""

import time
from pathlib import Path

import jax

from jaxtrain.system import paths
from jaxtrain.trackers.hooks import Hook, RunResult, RunView


class Status(Hook):
  """status.json in the workdir (process 0): what state the run is in, its step and params."""

  def __init__(self):
    self.path: Path | None = None
    self.info: dict = {}

  def on_start(self, run: RunView, step: int) -> None:
    if jax.process_index() != 0:
      return
    self.path = Path(run.workdir) / paths.STATUS_FILE
    self.info = {"state": "running", "step": step, "max_steps": run.cfg.train.max_steps,
                 "params": int(sum(x.size for x in jax.tree.leaves(run.programs.abstract.params))),
                 "started": time.time()}
    paths.write_json(self.path, self.info)

  def on_end(self, result: RunResult | None) -> None:
    if self.path is None:
      return
    if result is None:
      self.info["state"] = "failed"
    else:
      self.info["max_steps"] = result.max_steps or self.info["max_steps"]  # a time budget's end
      unfinished = result.stopped_by and result.step < self.info["max_steps"]
      self.info.update(state="stopped" if unfinished else "finished", step=result.step,
                       stopped_by=result.stopped_by)
    self.info["ended"] = time.time()
    paths.write_json(self.path, self.info)
