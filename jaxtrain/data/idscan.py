"""The ids of token files checked once (`scan`): each file's largest id and a sha256 of its ids,
read in blocks on a few threads, and cached by the file's path, size and modification time, so
that later starts read no ids at all."""

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np

from jaxtrain.system import fmt, machine, paths, signals
from jaxtrain.system.console import Ticker
from jaxtrain.system.errors import UserError

_BLOCK_BYTES = 32 << 20  # read, checked and hashed at a time, per file
_SCAN_VERSION = 1


@dataclasses.dataclass
class TokenFile:
  """A file of token ids: where they start, how many."""

  path: Path
  format: str  # uint16 | llmc
  offset: int  # bytes before the first id
  n_ids: int


def scan(found: list[TokenFile], cache: Path, show_progress: bool, log) -> list[tuple[int, str]]:
  """(largest id, sha256 of the ids) of each file: from the cache, else read in blocks on a few
  threads (reading, numpy and hashlib let go of the GIL) and cached."""
  from tqdm import tqdm

  keys = [_cache_file(cache, f) for f in found]
  results = [_cached(k, f) for k, f in zip(keys, found)]
  todo = [i for i, r in enumerate(results) if r is None]
  total = sum(2 * found[i].n_ids for i in todo)
  if todo and not show_progress:
    log(f"data: checking the ids of {len(todo)} token file(s), {fmt.nbytes(total)}, once "
        "(then cached)")
  with tqdm(total=total, unit="B", unit_scale=True, desc="checking ids", leave=False,
            disable=not show_progress or not todo) as bar, \
      concurrent.futures.ThreadPoolExecutor(max(1, min(len(todo), machine.cores(), 8))) as pool:
    lock = threading.Lock()
    shown = bar if show_progress else Ticker(log, "data: checking ids", total)

    def progress(n: int) -> None:
      with lock:
        shown.update(n)

    for i, r in zip(todo, pool.map(lambda i: _read_ids(found[i], progress), todo)):
      results[i] = r
  unwritable = None
  for i in todo:
    unwritable = unwritable or _store(keys[i], found[i], results[i])
  if unwritable:
    log(f"data: cannot cache the token files' check in {cache} ({unwritable}); it is done again "
        "at every start (--config.data.cache_dir=<a writable directory> keeps it)")
  return results


def _read_ids(f: TokenFile, progress) -> tuple[int, str]:
  sha, largest, buf = hashlib.sha256(), 0, bytearray(_BLOCK_BYTES)
  left = 2 * f.n_ids
  try:
    with open(f.path, "rb") as src:
      src.seek(f.offset)
      while left:
        signals.check()
        n = src.readinto(memoryview(buf)[:min(left, _BLOCK_BYTES)])
        if not n:
          raise UserError(f"{f.path} ended while it was read (it holds fewer ids than it did a "
                          "moment ago); leave it out of --config.data.path or wait until it is "
                          "written")
        block = memoryview(buf)[:n]
        sha.update(block)
        largest = max(largest, int(np.frombuffer(block, "<u2").max()))
        left -= n
        progress(n)
  except OSError as e:
    raise UserError(f"cannot read {f.path} ({e.strerror}); fix it or leave it out of "
                    "--config.data.path") from None
  return largest, sha.hexdigest()


def _cache_file(cache: Path, f: TokenFile) -> Path:
  name = f"{os.path.abspath(f.path)}\0{f.format}\0{f.offset}\0{f.n_ids}"
  return cache / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.json"


def _stamp(f: TokenFile) -> dict:
  st = f.path.stat()
  return {"v": _SCAN_VERSION, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _cached(key: Path, f: TokenFile) -> tuple[int, str] | None:
  with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
    entry = json.loads(key.read_text())
    if {k: entry.get(k) for k in ("v", "size", "mtime_ns")} == _stamp(f):
      return int(entry["max_id"]), str(entry["sha256"])
  return None


def _store(key: Path, f: TokenFile, result: tuple[int, str]) -> str | None:
  """Writes a cache entry (whole or not at all); what went wrong, if anything."""
  try:
    key.parent.mkdir(parents=True, exist_ok=True)
    paths.write_json(key, {**_stamp(f), "path": str(f.path), "max_id": result[0],
                           "sha256": result[1]})
  except OSError as e:
    return e.strerror or str(e)
  return None
