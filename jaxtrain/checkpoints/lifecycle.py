"""Saving a run so that nothing good is lost, and resuming it only where that is sound.

When the loop saves is `Saving.should_save`'s to say (a new best val loss included: the best
model so far is always on disk). A failed write becomes one line that says what to do, and the
last complete checkpoint stays the latest. A state whose params are not finite, or a disk without
room for it, is never written.
"""

import contextlib
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import jax
import ml_collections

from jaxtrain.checkpoints import store
from jaxtrain.checkpoints.recover import Damaged, newest_intact
from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.config import extensions, loading
from jaxtrain.core.steps import TrainState
from jaxtrain.system import fmt, peers, runtime
from jaxtrain.system.errors import NonFiniteLoss, UserError, first_line


class BestVal:
  """The lowest validation loss so far, and how many evaluations ago it was reached."""

  def __init__(self, best: float = math.inf):
    self.best = best
    self.since = 0

  def update(self, val: float) -> bool:  # whether `val` is a new best
    if val < self.best:
      self.best, self.since = val, 0
      return True
    self.since += 1
    return False

  @property
  def value(self) -> float | None:
    return self.best if self.best < math.inf else None


class Saving:
  """A run's checkpoints as its loop writes them, and when (`should_save`). `meta` is saved with
  every checkpoint (the run's config, tokenizer and data fingerprint) and checked on resume."""

  def __init__(self, ckpts: Checkpoints, meta: dict, every: int):
    self.ckpts, self.meta, self.every = ckpts, meta, every

  def should_save(self, step: int, end: int, *, new_best: bool = False,
                  stopping: bool = False) -> bool:
    """Every `every` steps, at the run's last step (`end`), at a new best val loss, and when the
    run stops before its end (a signal, a hook)."""
    return step % self.every == 0 or step == end or new_best or stopping

  def save(self, state: TrainState, iterator, val: float | None, elapsed: float,
           best: float | None, end: int) -> None:
    """Starts an async save of `state` at its step, after checking it can be written whole; its
    meta says the training seconds, the best val loss and the run's end (`end`) so far."""
    step = int(state.step)
    finite, sums = store.survey(state.arrays())
    if not finite:
      raise NonFiniteLoss(f"parameters became non-finite by step {step}: stopped without saving "
                          "them; the last good checkpoint is kept. Lower --config.optim.lr")
    size = sum(x.nbytes for x in jax.tree.leaves(state.arrays()))
    free, needed = shutil.disk_usage(self.ckpts.directory).free, 1.1 * size + 2**20
    if runtime.any_process(free < needed):  # before writing: the last checkpoint stays whole
      raise UserError(f"not enough disk space for the checkpoint of step {step} in "
                      f"{self.ckpts.directory} (needs ~{fmt.count(needed)}B, {fmt.count(free)}B "
                      f"free); free some space, then run again to {_resume_hint(self.ckpts)}")
    config = self.meta["config"]
    meta = dict(self.meta, elapsed_s=elapsed, best_val_loss=best,
                config={**config, "train": {**config["train"], "max_steps": end}})
    _writing(self.ckpts, lambda: self.ckpts.save(state, iterator, meta, val, sums), step)

  def check(self, step: int) -> None:
    """Raises, as one line, the error of a background write that failed."""
    _writing(self.ckpts, self.ckpts.manager.check_for_errors, step)

  def finish(self, step: int) -> None:
    """Waits for pending writes; a failed one raises as one line."""
    _writing(self.ckpts, self.ckpts.close, step)

  def close(self) -> None:
    """On the way out of a run, also after an error: a write going well still completes; one
    that failed was the error, or is reported by it."""
    with contextlib.suppress(Exception):  # the previous checkpoint stays the latest complete one
      self.ckpts.close()

  def peers_watched(self, step: Callable[[], int]):
    """Around the training loop of a multi-process run: if another process is lost, this one ends
    at once with one line naming it and the checkpoint a restart resumes from (`step()`: the step
    the loop is at). It exits, since jax and orbax would otherwise wait for the lost process."""
    return peers.watch_peers(step, lambda: _resume_hint(self.ckpts))


def _writing(ckpts: Checkpoints, action, step: int) -> None:
  try:
    action()
  except (OSError, ValueError, RuntimeError) as e:
    peers.end_if_lost(e)  # a collective that failed for a lost process is no disk fault
    raise UserError(f"writing a checkpoint (by step {step}) in {ckpts.directory} failed "
                    f"({_os_reason(e)}); fix the cause (disk space, permissions), then "
                    f"run again to {_resume_hint(ckpts)}") from None


def _os_reason(e: Exception) -> str:
  """The operating system's words for a failed write, also when tensorstore wraps them."""
  if getattr(e, "strerror", None):
    return e.strerror
  code = re.search(r"os_error_code='?(\d+)", str(e))
  if code:
    return f"{os.strerror(int(code.group(1)))}, errno {code.group(1)}"
  return first_line(e)[:160]


def _resume_hint(ckpts: Checkpoints) -> str:
  """What a restart resumes from: a half-written checkpoint is not among the complete steps."""
  complete = store.complete_steps(ckpts.directory.parent)
  if not complete:
    return "start afresh (no checkpoint was saved yet)"
  return f"resume from the intact checkpoint of step {complete[-1]}"


def resume(ckpts: Checkpoints, programs, iterator, run_meta: dict,
           cfg: ml_collections.ConfigDict, out) -> tuple[int, TrainState, dict, tuple[str, ...]]:
  """(step, state, meta, the harmless config changes since it) of the newest checkpoint that
  reads whole and fits this config, with `iterator` at its position. A damaged one is set aside
  with a warning line, and an earlier one used; none that reads whole is a UserError that says
  how to start afresh."""
  def read(step: int):
    meta = ckpts.read_meta(step)
    notes, changes = check_resumable(meta, run_meta, cfg.workdir, cfg.data.allow_changed)
    state, saved = ckpts.read(step, programs.abstract, programs.shardings, iterator)
    position, k = iterator.get_state()["next_index"], cfg.train.grad_accum
    if position != step * k:
      raise Damaged(f"its data position {position} is not step x grad_accum = {step * k}")
    return state, saved, (meta, notes, changes)

  step, state, (meta, notes, changes) = newest_intact(
      ckpts, read, out.print, using="resuming from",
      fresh=f"to start afresh, pass a new --config.workdir, or move {ckpts.directory} away")
  for note in notes:
    out.print(note)
  return step, state, meta, tuple(changes)


def refuse_changes(saved: dict, config: dict, workdir: str, other_vocabulary: bool = False
                   ) -> list[str]:
  """The harmless changes from the `saved` config to `config`; a change a resume may not cross
  (or `other_vocabulary`) is a UserError. Checked on the workdir's config.json before the data is
  read (loop/resolution.py), and on the checkpoint itself where the run resumes."""
  breaking, harmless = loading.config_changes(saved, config)
  code = extensions.changed(saved.get(extensions.SOURCES_KEY, {}), config.get(extensions.SOURCES_KEY, {}))
  if code and not config.get("allow_changed_extend"):
    raise UserError(f"cannot resume {workdir}: the code of its extensions is not what the run ran: "
                    f"{', '.join(code)} (what the run ran is in {Path(workdir).expanduser() / 'extend'}/); "
                    "change it back, pass --config.allow_changed_extend=True to resume with it "
                    "anyway, or a new --config.workdir")
  if code:
    harmless.append(f"extension code: {', '.join(code)} (allow_changed_extend=True)")
  if other_vocabulary:
    breaking.append("the tokenizer's vocabulary differs from the checkpoint's")
  if breaking:
    raise UserError(f"cannot resume {workdir} with this config: {'; '.join(breaking)}. "
                    "Change these back, or pass a new --config.workdir to start a fresh run")
  return harmless


def check_resumable(meta: dict, run_meta: dict, workdir: str,
                    allow_changed_data: bool) -> tuple[list[str], list[str]]:
  """Refuses a resume whose config or data changed what the checkpoint's numbers mean; returns
  (the lines that say what changed harmlessly, the harmless config changes)."""
  harmless = refuse_changes(meta.get("config", {}), run_meta["config"], workdir,
                            meta.get("tokenizer") != run_meta["tokenizer"])
  notes = []
  if meta.get("data_fingerprint") != run_meta["data_fingerprint"]:
    if not allow_changed_data:
      raise UserError(f"the data differs from the data {workdir} was trained on (fingerprint "
                      f"now {run_meta['data_fingerprint'][:12]}, then "
                      f"{str(meta.get('data_fingerprint'))[:12]}); pass "
                      "--config.data.allow_changed=True to resume on it anyway, or a new "
                      "--config.workdir")
    notes.append("data: resuming on different data than before (data.allow_changed=True)")
  if harmless:
    notes.append(f"config changes since the checkpoint: {'; '.join(harmless)}")
  return notes, harmless
