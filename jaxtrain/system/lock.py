"""Exclusive file locks (fcntl.flock): one run per workdir, one writer per token cache entry.

The kernel drops a flock when its process dies, so a run killed with SIGKILL leaves no stale
lock behind. The holder writes its host, PID and start time into the locked file, so whoever
finds it taken can say by whom; `run_alive` tells a run that still runs from one killed silently.
"""

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from jaxtrain.system import fmt, machine
from jaxtrain.system.errors import UserError

WORKDIR_LOCK = ".lock"  # hidden: a workdir holding only this file still counts as empty


class FileLock:
  """An exclusive flock on `path`, created if missing and removed on release."""

  def __init__(self, path: Path):
    self.path = Path(path)
    self._fd: int | None = None

  def acquire(self, blocking: bool = False) -> bool:
    """True once held; False if another process (or another FileLock) holds it and `blocking`
    is False. OSError where the file cannot be created or the file system has no locks."""
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
      except BlockingIOError:
        os.close(fd)
        return False
      except BaseException:
        os.close(fd)
        raise
      # The previous holder removes the file on release: if it did so after our open, the lock
      # we got is on a file nobody else will open again, so open the one on disk now.
      with contextlib.suppress(FileNotFoundError):
        if os.path.samestat(os.fstat(fd), os.stat(self.path)):
          break
      os.close(fd)
    self._fd = fd
    with contextlib.suppress(OSError):  # a full disk: the lock holds, only its holder goes unnamed
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "since": time.time()}).encode())
    return True

  @property
  def held(self) -> bool:
    return self._fd is not None

  def release(self) -> None:
    """Removes the file (while still holding it, so no one else holds that file) and unlocks."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    with contextlib.suppress(OSError):
      self.path.unlink(missing_ok=True)
    os.close(fd)

  def holder(self, wait_s: float = 1.0) -> dict | None:
    """Who holds it, as the holder wrote it (waits briefly for a holder that has just locked)."""
    deadline = time.time() + wait_s
    while True:
      with contextlib.suppress(OSError, ValueError):
        info = json.loads(self.path.read_text())
        if isinstance(info, dict) and {"host", "pid", "since"} <= info.keys():
          return info
      if time.time() >= deadline:
        return None
      time.sleep(0.05)


def is_held(path: Path) -> bool:
  """Whether a live process holds the lock at `path` (a shared lock, taken and dropped at once)."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  except OSError:
    return False
  finally:
    os.close(fd)


def describe_holder(info: dict | None) -> str:
  """'PID 4242 on host node1, since 2026-11-23 14:02:11, 3m05s ago'."""
  if info is None:
    return "a process that has not named itself yet"
  since = float(info["since"])
  return (f"PID {info['pid']} on host {info['host']}, since "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}, "
          f"{fmt.duration(time.time() - since)} ago")


def in_use_error(workdir: Path) -> UserError:
  holder = FileLock(workdir / WORKDIR_LOCK).holder()
  stop = (f"kill {holder['pid']} on {holder['host']} saves a checkpoint and stops it" if holder
          else "SIGTERM saves a checkpoint and stops it")
  return UserError(f"workdir {workdir} is in use by another run ({describe_holder(holder)}); "
                   f"wait for it to end or stop it ({stop}), or pass "
                   "--config.workdir=<another directory>")


def _alive(pid: int, started: float | None) -> bool:
  """Whether the process that wrote a status at `started` still runs: its PID is in use, and
  not by a process that began later (a PID the system gave out again)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: it exists
    pass
  began = machine.started(pid)
  return began is None or started is None or began <= started + 1.0  # clock ticks, rounded


def run_alive(workdir: Path, info: dict) -> bool:
  """Whether the process that wrote `info` (a run's status: `pid`, `host`, `started`) still runs:
  it holds the workdir's lock, or (where the file system has no locks) its PID on this host is
  still that process."""
  if is_held(Path(workdir) / WORKDIR_LOCK):
    return True
  pid = info.get("pid")
  if info.get("host") == socket.gethostname() and isinstance(pid, int):
    return _alive(pid, info.get("started"))
  return False  # its host's kernel dropped the lock with the process
