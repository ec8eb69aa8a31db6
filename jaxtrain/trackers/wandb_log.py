"""Weights & Biases beside TensorBoard (`log.wandb=True`; `pip install 'jaxtrain[wandb]'`): the
same scalars under the same names (tensorboard_log.scalars), the config, and the end-of-run
samples as a table.

The W&B run's id is kept in workdir/wandb.json: a resumed jaxtrain run continues the same W&B run.
W&B's own environment variables win over the config (WANDB_PROJECT, WANDB_MODE, WANDB_DIR,
WANDB_RUN_ID, WANDB_NAME, WANDB_RESUME); its files go to workdir/wandb/ unless WANDB_DIR says
otherwise. W&B missing or failing (no package, no login, no network) costs one warning line: the
run goes on with TensorBoard only.
"""

import os
import secrets
from pathlib import Path

from jaxtrain.system import paths
from jaxtrain.trackers import tensorboard_log
from jaxtrain.trackers.hooks import Hook, RunResult, RunView

RUN_FILE = "wandb.json"
# wandb.init's arguments that the environment variable beside each sets instead, when it is set.
ENV = {"project": "WANDB_PROJECT", "mode": "WANDB_MODE", "dir": "WANDB_DIR", "id": "WANDB_RUN_ID",
       "name": "WANDB_NAME", "resume": "WANDB_RESUME"}


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class WandB(Hook):
  """Logs the run to W&B (process 0's: standard.py attaches it there)."""

  def __init__(self, project: str, mode: str):
    self.project, self.mode = project, mode
    self.run = None
    self.say = print

  def prepare(self) -> None:
    import wandb  # noqa: F401

  def on_start(self, run: RunView, step: int) -> None:
    self.say = run.out.print
    try:
      import wandb
    except ImportError:
      self._warn("log.wandb=True but the wandb package is not installed (pip install "
                 "'jaxtrain[wandb]')")
      return
    workdir = Path(run.workdir)
    saved = paths.read_json(workdir / RUN_FILE) if (workdir / RUN_FILE).is_file() else {}
    args = {"project": self.project, "mode": self.mode, "dir": str(workdir),
            "id": saved.get("id") or secrets.token_hex(4), "name": workdir.name, "resume": "allow"}
    args = {k: v for k, v in args.items() if not os.environ.get(ENV[k])}
    try:
      self.run = wandb.init(**args, settings=wandb.Settings(console="off", silent=True))
      self.run.config.update(run.cfg.to_dict(), allow_val_change=True)
    except Exception as e:  # W&B raises its own errors, and others (network, files) through them
      self.run = None
      self._warn(f"W&B did not start ({_first_line(e)})")
      return
    paths.write_json(workdir / RUN_FILE, {"id": self.run.id, "project": self.run.project})
    offline = self.run.settings.mode == "offline"
    where = f"offline in {Path(self.run.dir).parent}; upload it with: wandb sync " \
        f"{Path(self.run.dir).parent}" if offline else self.run.url
    self.say(f"W&B: run {self.run.id} ({'resumed at step ' + str(step) if step else 'new'}), {where}")

  def _warn(self, what: str) -> None:
    self.say(f"warning: {what}; training goes on with TensorBoard only")

  def _log(self, data: dict, step: int) -> None:
    if self.run is None or not data:
      return
    try:
      self.run.log(data, step=step)
    except Exception as e:
      self._warn(f"W&B stopped logging at step {step} ({_first_line(e)})")
      self._finish(1)

  def on_log(self, step: int, record: dict) -> None:
    self._log(tensorboard_log.scalars("train", record), step)

  def on_eval(self, step: int, record: dict) -> None:
    self._log(tensorboard_log.scalars("val", record), step)

  def on_end(self, result: RunResult | None) -> None:
    if self.run is None:
      return
    if result is not None and result.samples:
      import wandb
      self._log({"samples": wandb.Table(columns=["sample", "text"],
                                        data=[[i, s] for i, s in enumerate(result.samples)])},
                result.step)
    self._finish(0 if result is not None else 1)

  def _finish(self, exit_code: int) -> None:
    run, self.run = self.run, None
    if run is not None:
      try:
        run.finish(exit_code=exit_code)
      except Exception as e:
        self._warn(f"W&B did not finish cleanly ({_first_line(e)})")
