"""Which checkpoint a restore uses: the newest that reads whole. One that fails to read is set
aside only on positive evidence of damage (its own checksums, a file missing inside it, metadata
that does not parse, tensorstore's words for corrupted data); any other error (I/O, too many open
files, a stale NFS handle, a storage timeout) stops the restore with one line and moves nothing,
since the checkpoint may well be intact. A step directory removed meanwhile is skipped.
"""

import json
import re
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxtrain.checkpoints.store import Damaged
from jaxtrain.system import peers, runtime
from jaxtrain.system.errors import UserError

OK, GONE, DAMAGED, FATAL = 0, 1, 2, 3  # what a process found; the processes act on the worst
# Tensorstore's and orbax's words for files whose contents are wrong or missing inside a step
# (not for failing to read).
_CORRUPT = re.compile(r"DATA_LOSS|ZSTD|decompress|truncated|checksum|not valid JSON|corrupt|"
                      r"was not found in the checkpoint", re.IGNORECASE)


def newest_intact(ckpts, read: Callable, warn: Callable[[str], None], *, using: str, fresh: str,
                  collective: bool = True, move: bool = True,
                  held: bool = False) -> tuple[int, object, object]:
  """(step, state, extra) of the newest checkpoint of `ckpts` (a store.Checkpoints) that
  reads whole; the damaged ones newer than it are set aside, each reported in one line to
  `warn`. `read(step)` returns (state, saved checksums, extra) from `Checkpoints.read` or raises.
  If none reads whole, none is moved and a UserError lists why, ending with `fresh`; an error
  that is not damage is a UserError naming the step, and nothing is moved either.

  `collective`: the processes of a run go through process 0's list of steps and agree on every
  step before going on (they read their own parts of it); process 0 moves the damaged ones,
  after all of them have looked. `move=False` (a command that only reads the run): nothing is
  moved, the damaged ones are only reported as left in place; `held`: because another process
  holds the workdir (what looks damaged may be a save under way).
  """
  # A failed array read makes orbax abandon the other reads of that step: they end later as
  # unraisable errors or asyncio log lines, which a CLI run sends to workdir/logs/.
  multi = collective and jax.process_count() > 1
  damaged = []
  for step in _steps(ckpts, multi):
    code = OK
    try:
      state, saved, extra = read(step)
    except Exception as e:  # noqa: BLE001 - tensorstore raises bare Exceptions
      code, reason, error = classify(e, ckpts.directory / str(step)), _reason(e), e
    codes = [int(c) for c in runtime.host_copy(np.array([code], np.int32))] if multi else [code]
    if FATAL in codes:
      if code == FATAL:
        raise error if isinstance(error, UserError) else unreadable(ckpts, step, reason)
      raise unreadable(ckpts, step, f"process {codes.index(FATAL)} could not read its part: "
                                    "see its output")
    if DAMAGED in codes:
      damaged.append((step, reason if code == DAMAGED else
                      "another process could not read its part"))
      continue
    if GONE in codes:
      continue  # removed meanwhile (a live run's retention): not damage, nothing to move
    reason = ckpts.verify(state, saved)  # the same answer on every process
    if reason is None:
      _set_aside(ckpts, damaged, f"{using} step {step}", warn, collective, move, held)
      return step, state, extra
    damaged.append((step, reason))
  found = "; ".join(f"step {step}: {r}" for step, r in damaged) or "each was removed while being read"
  raise UserError(f"no checkpoint in {ckpts.directory} can be read ({found}); {fresh}")


def read_one(ckpts, step: int, read: Callable):
  """The state of step `step` (asked for by name: no other step instead), verified."""
  try:
    state, saved, _ = read(step)
    problem = ckpts.verify(state, saved)
  except Exception as e:  # noqa: BLE001 - tensorstore raises bare Exceptions
    code = classify(e, ckpts.directory / str(step))
    if code == FATAL:
      raise e if isinstance(e, UserError) else unreadable(ckpts, step, _reason(e)) from None
    if code == GONE:
      raise UserError(f"the checkpoint of step {step} in {ckpts.directory} was removed while "
                      "being read; load another step") from None
    problem = _reason(e)
  if problem:
    raise UserError(f"checkpoint {ckpts.directory / str(step)} is damaged ({problem}); load "
                    "another step, or leave out step= for the newest intact one")
  return state


def unreadable(ckpts, step: int, reason: str) -> UserError:
  return UserError(f"cannot read the checkpoint of step {step} in {ckpts.directory} ({reason}); "
                   "it may be intact, so nothing was moved: fix the cause, then try again")


def _steps(ckpts, multi: bool) -> list[int]:
  """The steps on disk, newest first: process 0's list on every process (listings of a shared
  file system may differ for a while, and each step is a collective)."""
  steps = sorted(ckpts.all_steps(), reverse=True)
  if not multi:
    return steps
  with peers.ends_if_lost():
    n = int(multihost_utils.broadcast_one_to_all(np.array([len(steps)], np.int32))[0])
    mine = np.zeros(n, np.int32)
    mine[:min(n, len(steps))] = steps[:n]
    return [int(s) for s in multihost_utils.broadcast_one_to_all(mine)]


def _set_aside(ckpts, damaged: list, then: str, warn, collective: bool, move: bool,
               held: bool) -> None:
  if not damaged:
    return
  if not move:
    for step, reason in damaged:
      where = ckpts.directory / str(step)
      warn(f"warning: checkpoint {where} could not be read ({reason}); left in place, since a run "
           f"holds {ckpts.directory.parent}; {then}" if held else
           f"warning: checkpoint {where} is damaged ({reason}); left in place (reading a run "
           f"changes none of its files; resuming its training sets it aside); {then}")
    return
  if not collective or jax.process_index() == 0:
    for step, reason in damaged:
      moved = ckpts.set_aside(step)
      where = f"moved it to {moved}" if moved else "it is gone"
      warn(f"warning: checkpoint {ckpts.directory / str(step)} is damaged ({reason}); {where}; "
           f"{then}")
  if collective:
    runtime.barrier("jaxtrain: damaged checkpoints set aside")
  ckpts.manager.reload()  # it lists the steps on disk when it starts


def classify(e: BaseException, step_dir: Path) -> int:
  """GONE, DAMAGED or FATAL: what a failed read of `step_dir` says about its files. Damage only
  on positive evidence; a UserError is the run's own refusal (a config that does not fit)."""
  if isinstance(e, UserError):
    return FATAL
  try:
    if not step_dir.is_dir():
      return GONE
  except OSError:
    return FATAL
  chain = _chain(e)
  for x in chain:
    if isinstance(x, (Damaged, json.JSONDecodeError)):
      return DAMAGED
    if isinstance(x, FileNotFoundError):
      inside = x.filename is None or step_dir in Path(str(x.filename)).absolute().parents
      return DAMAGED if inside else FATAL
  text = " ".join(str(x) for x in chain)
  if _CORRUPT.search(text) or ("NOT_FOUND" in text and str(step_dir) in text):
    return DAMAGED
  return FATAL


def _chain(e: BaseException) -> list[BaseException]:
  chain = [e]
  while len(chain) < 20:
    inner = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    if inner is None:
      break
    chain.append(e := inner)
  return chain


def _reason(e: BaseException) -> str:
  """The innermost error's whole explanation on one line (orbax's tree-structure mismatch names
  every differing path on lines of its own); tensorstore's outer errors only say where it read."""
  e = next((x for x in reversed(_chain(e)) if str(x)), e)
  text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
  lines = [re.sub(r' in OCDBT database at local file "[^"]*"| ?\[tensorstore_spec=.*', "", line).strip()
           for line in text.splitlines()]
  text = " ".join(line for line in lines if line)
  name = type(e).__name__
  text = text if name in ("Damaged", "ValueError", "Exception") else f"{name}: {text}"
  return text if len(text) <= 4000 else text[:3997] + "..."
