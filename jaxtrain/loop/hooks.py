"""What can watch a run from outside the loop: a `Hook` sees the run start, each record the loop
writes, and the run end, and may ask it to stop. TensorBoard and the run's status file are hooks
every run has (jaxtrain/tblog.py, jaxtrain/runs.py); `run(cfg, hooks=[...])` adds more."""

from typing import Any


class Hook:
  """Attach to a run (`run(cfg, hooks=[...])`): sees each record the loop writes, may stop it.

  Hooks run on every process; one that writes files checks `jax.process_index() == 0` itself.
  """

  def on_start(self, run: Any, step: int) -> None:
    """Before the first step of this leg: `run` is what setup prepared (train.Run: cfg, workdir,
    programs, ...), `step` where training starts (0, or the step a resume restored)."""

  def on_step(self, step: int, state: Any) -> None:
    """After each optimizer step is queued (`step` steps done; its work may still be running on
    the device: `jax.block_until_ready(state)` waits for it)."""

  def on_log(self, step: int, record: dict) -> None: ...

  def on_eval(self, step: int, record: dict) -> None: ...

  def stop_reason(self) -> str | None:
    """A reason to end the run after this step (it then saves and finishes), or None. Asked
    after each step; the processes of a multi-process run stop when any of theirs asks."""
    return None

  def on_end(self, result: Any) -> None:
    """When the run ends: `result` is its train.RunResult, or None when it failed with an error.
    Also called for a run that failed before `on_start`."""


def end_all(hooks: list[Hook], result: Any) -> None:
  """Every hook's `on_end`. While an error is already on its way out (result None), a hook that
  fails too must not hide it."""
  for hook in hooks:
    try:
      hook.on_end(result)
    except Exception:
      if result is not None:
        raise
