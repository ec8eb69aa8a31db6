"""Where things live on disk: the shared cache directory, and a run's workdir."""

import json
import os
import shutil
from pathlib import Path

from jaxtrain.system import lock
from jaxtrain.system.errors import UserError

RUN_FILE = "run.json"  # its presence marks a directory as a jaxtrain run
STATUS_FILE = "status.json"  # running, finished, stopped or failed: trackers/status.py keeps it


def cache_dir() -> str:
  """Token caches, XLA's compile cache and measured peaks: $JAXTRAIN_CACHE or ~/.cache/jaxtrain."""
  return os.environ.get("JAXTRAIN_CACHE") or os.path.expanduser("~/.cache/jaxtrain")


def write_json(path: Path, obj) -> None:
  """Atomic: a reader sees the old file or the new one, never half of one."""
  write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_text(path: Path, text: str) -> None:
  """Atomic, as `write_json` (an OSError leaves nothing behind)."""
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  try:
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
  except OSError:
    tmp.unlink(missing_ok=True)
    raise


def read_dict(path: Path) -> dict:
  """A JSON file's object (status.json, the cache dir's measurements); {} where it is missing,
  unreadable or not an object."""
  try:
    data = read_json(path)
  except (OSError, ValueError):
    return {}
  return data if isinstance(data, dict) else {}


def read_json(path: Path):
  return json.loads(path.read_text())


def read_jsonl(path: Path) -> list[dict]:
  """The records of a .jsonl file such as metrics.jsonl ([] if there is none); a line that does
  not parse (cut short by a kill mid-write) is skipped. The one reader of metrics.jsonl."""
  records = []
  if path.exists():
    for line in path.read_text(encoding="utf-8").splitlines():
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict):
        records.append(record)
  return records


def remove_stub(workdir: Path, keep: tuple[str, ...] = (), remove_dir: bool = True) -> None:
  """Removes what a new run wrote into `workdir` before it failed (all but `keep`), and the
  directory itself if `remove_dir` and nothing is kept."""
  if not workdir.is_dir():
    return
  for child in workdir.iterdir():
    if child.name not in keep:
      shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
  if remove_dir and not any(workdir.iterdir()):
    workdir.rmdir()


def is_run(path: Path) -> bool:
  return (Path(path) / RUN_FILE).is_file()


def check_workdir(workdir: str) -> Path:
  """Refuses a workdir that is a file or holds something other than a jaxtrain run."""
  path = Path(workdir).expanduser()
  if path.exists() and not path.is_dir():
    raise UserError(f"workdir {path} is a file, not a directory; pass --config.workdir=<a new "
                    "directory>")
  if path.is_dir() and not (path / RUN_FILE).exists():
    # Hidden files (the run's lock) and logs/ are not results: without them the directory is
    # empty and a run may start there.
    others = [p.name for p in path.iterdir() if not p.name.startswith(".") and p.name != "logs"]
    if others and lock.is_held(path / lock.WORKDIR_LOCK):  # a run that is writing its first files
      raise lock.in_use_error(path)
    if others:
      raise UserError(f"workdir {path} is not empty and is not a jaxtrain run (no {RUN_FILE}; "
                      f"holds {', '.join(sorted(others)[:3])}); pass --config.workdir=<a new or "
                      "empty directory> so nothing there is overwritten")
  return path


def create_workdir(path: Path) -> None:
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write_probe{os.getpid()}"
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    raise UserError(f"workdir {path} is not writable ({e.strerror}); pass "
                    "--config.workdir=<a directory you can write to>") from None
