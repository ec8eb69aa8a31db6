"""A run's workdir: held by one run at a time (`claimed`: the lock, and what a new run that never
reached its first step leaves behind: nothing), and the files that say what the run is
(config.json, run.json, tokenizer.json, legs.jsonl, and extend/: the user's code it runs)."""

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import ml_collections

from jaxtrain.config import extensions
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import paths, runtime
from jaxtrain.system.console import Console, LibraryLog
from jaxtrain.system.errors import UserError
from jaxtrain.system.lock import WORKDIR_LOCK, FileLock, in_use_error

LEGS_FILE = "legs.jsonl"  # one line per leg of the run: where it started, what changed
EXTEND_DIR = "extend"  # a copy of each file of config.extend, as the newest leg ran it


class Claim:
  """One run's hold on its workdir: process 0 locks it (`take`) once the workdir is checked, until
  the run's last write. `started` once the run has a state to train: from then on what it wrote
  stays, whatever ends it."""

  def __init__(self, workdir: Path, library_log: bool):
    self.workdir, self.library_log, self.started = workdir, library_log, False
    try:  # a new run's: what is in it when the run ends, the run wrote
      self.existed = workdir.exists()
      self.fresh = not self.existed or (workdir.is_dir() and not any(workdir.iterdir()))
    except (OSError, ValueError):  # a name the file system refuses: the resolution names it
      self.existed, self.fresh = True, False
    self.lock: FileLock | None = None  # held by this run (process 0, where files lock)
    self.log: LibraryLog | None = None  # where the libraries' messages go, once the run starts it
    self.out: Console | None = None

  def take(self, workdir: Path, out: Console) -> None:
    """Once every process has checked the workdir: created, and locked by process 0 (another run
    holding it is an error before anything is written)."""
    runtime.barrier("jaxtrain: workdir checked")  # every process looked before any writes
    paths.create_workdir(workdir)
    self.workdir, self.out = workdir, out
    lock = FileLock(workdir / WORKDIR_LOCK) if jax.process_index() == 0 else None
    try:
      taken = lock is None or lock.acquire()
    except OSError as e:  # the directory is writable (create_workdir checked): no flock there
      out.print(f"note: cannot lock {lock.path} ({e.strerror}); a second run started into this "
                "workdir would not be refused")
      lock, taken = None, True
    if runtime.any_process(not taken):  # one run per workdir
      raise in_use_error(workdir)
    self.lock = lock
    if self.library_log:
      self.log = LibraryLog(workdir / "logs" / f"process_{jax.process_index()}.log")

  def errors(self) -> int:  # how many the libraries logged
    return self.log.errors if self.log is not None else 0

  def release(self, leave_stub: bool) -> None:
    """The lock released (after the run's last write), then a new run that never started leaves
    nothing that looks like a run; the libraries' log stays where a note points to it."""
    if self.lock is None:
      return
    self.lock.release()  # first: it removes its file, which the emptiness check must not see
    if self.fresh and not (self.started or leave_stub):
      paths.remove_stub(self.workdir, keep=("logs",) if self.errors() else (),
                        remove_dir=not self.existed)


@contextlib.contextmanager
def claimed(workdir: str, library_log: bool = False) -> Iterator[Claim]:
  """The workdir of one run, from its check to its end, on every way out: the lock released, a new
  run refused or stopped before its first step (a bad init_from, data that does not fit, Ctrl-C
  while compiling) leaves no stub behind (an error that is no UserError leaves it, to look at),
  and the libraries' errors are pointed to."""
  claim = Claim(Path(str(workdir)).expanduser(), library_log)
  try:
    yield claim
  except BaseException as e:
    claim.release(leave_stub=not isinstance(e, UserError | KeyboardInterrupt))
    if claim.errors():
      e.add_note(f"the libraries' own messages are in {claim.log.path}")
    raise
  claim.release(leave_stub=False)
  if claim.errors():
    claim.out.print(f"note: the libraries logged {claim.errors()} error(s); see {claim.log.path}")


def write_run_files(workdir: Path, cfg: ml_collections.ConfigDict, run_meta: dict, tok,
                    start_step: int = 0, changes: tuple[str, ...] = ()) -> None:
  """The files that say what the run is, as of the leg that starts at `start_step`: config.json
  holds that leg's config, legs.jsonl one line per leg with the config changes it brought."""
  paths.write_json(workdir / "config.json", extensions.saved_config(cfg))
  for source in extensions.load(cfg.extend):  # the code as this leg runs it, to diff against
    (workdir / EXTEND_DIR).mkdir(exist_ok=True)
    paths.write_text(workdir / EXTEND_DIR / Path(source.path).name,
                     Path(source.path).read_text(encoding="utf-8"))
  paths.write_json(workdir / paths.RUN_FILE, {k: v for k, v in run_meta.items() if k != "config"})
  tokenizer_lib.save(tok, str(workdir / "tokenizer.json"))
  with open(workdir / LEGS_FILE, "a", encoding="utf-8") as f:
    f.write(json.dumps({"start_step": start_step, "max_steps": cfg.train.max_steps,
                        "changes": list(changes), "time": round(time.time(), 3)}) + "\n")

