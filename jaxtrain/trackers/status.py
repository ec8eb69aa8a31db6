"""The hook that keeps a run's status.json (running, finished, stopped by a signal, failed) up to
date, for compare and sweep to read, and what a `running` status left behind means.

The file names the process that writes it (PID, host, start time), the wall time of the run's
commands so far (`wall_s`: every leg's, start-up included; `compile_s`, every finished leg's
compiles before its first step) and the last step it logged or
evaluated, so that a process ended without a word (SIGKILL, the out-of-memory killer) leaves a
status that says how far it got: the next start of the run, and compare, find it `running` with
its process gone, and call it killed."""

import os
import socket
import time
from pathlib import Path

import jax

from jaxtrain.system import paths
from jaxtrain.trackers.hooks import Hook, RunResult, RunView


def killed_line(info: dict) -> str:
  """The line for the start of a run whose previous process left `running` behind."""
  started = info.get("started")
  who = (f" (PID {info.get('pid')} on host {info.get('host')}, started "
         f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))})"
         if "pid" in info and isinstance(started, int | float) else "")
  return (f"note: the previous start of this run{who} was killed at step {info.get('step', 0)} "
          "without a word (SIGKILL, or out of memory); what it trained after its last checkpoint "
          "is trained again")


WRITE_EVERY_S = 1.0  # the most often a logged step rewrites the file (see Status._reached)


class Status(Hook):
  """status.json in the workdir (process 0's: standard.py attaches it there)."""

  def __init__(self):
    self.path: Path | None = None
    self.info: dict = {}
    self.checkpoint_every, self.written = 1, 0.0
    self.wall_before, self.t_start = 0.0, 0.0  # the earlier legs' wall time; this leg's start
    self.compile_before = 0.0  # the earlier legs' compile seconds

  def on_start(self, run: RunView, step: int) -> None:
    self.path = Path(run.workdir) / paths.STATUS_FILE
    previous = read(self.path)
    if previous.get("state") == "running":  # its writer is gone: this process holds the lock
      run.out.print(killed_line(previous))
    self.info = {"state": "running", "step": step, "max_steps": run.cfg.train.max_steps,
                 "params": int(sum(x.size for x in jax.tree.leaves(run.programs.abstract.params))),
                 "started": time.time(), "pid": os.getpid(), "host": socket.gethostname()}
    wall = previous.get("wall_s")  # to its last write, for a leg that was killed
    self.wall_before = wall if isinstance(wall, int | float) else 0.0
    compiled = previous.get("compile_s")
    self.compile_before = compiled if isinstance(compiled, int | float) else 0.0
    self.t_start = run.t_start or time.time()
    self._write()
    self.checkpoint_every, self.written = run.cfg.train.checkpoint_every, time.monotonic()

  def _reached(self, step: int, now: bool = False) -> None:
    """The step in the file: at every evaluation and every `train.checkpoint_every` step, and at
    other logged steps once a second at most, since an atomic write costs milliseconds on a
    network or sandboxed file system, as much as a tiny model's step."""
    self.info["step"] = step  # in the file at the latest when the run ends, also on a failure
    t = time.monotonic()
    if now or step % self.checkpoint_every == 0 or t - self.written >= WRITE_EVERY_S:
      self._write()
      self.written = t

  def _write(self) -> None:
    self.info["wall_s"] = round(self.wall_before + time.time() - self.t_start, 3)
    paths.write_json(self.path, self.info)

  def on_log(self, step: int, record: dict) -> None:
    self._reached(step)

  def on_eval(self, step: int, record: dict) -> None:
    self._reached(step, now=True)

  def on_end(self, result: RunResult | None) -> None:
    if self.path is None:
      return
    if result is None:
      self.info["state"] = "failed"  # at the last step it logged
    else:
      self.info["max_steps"] = result.max_steps or self.info["max_steps"]  # a time budget's end
      unfinished = result.stopped_by and (result.step < self.info["max_steps"] or result.end_left)
      self.info.update(state="stopped" if unfinished else "finished", step=result.step,
                       stopped_by=result.stopped_by, end_left=result.end_left)
      if result.compile_s is not None:  # every leg's (compare warns where runs' differ)
        self.info["compile_s"] = round(self.compile_before + result.compile_s, 3)
    self.info["ended"] = time.time()
    self._write()


def read(path: Path) -> dict:
  """status.json's contents; {} where it is missing or damaged."""
  try:
    info = paths.read_json(path)
  except (OSError, ValueError):
    return {}
  return info if isinstance(info, dict) else {}

