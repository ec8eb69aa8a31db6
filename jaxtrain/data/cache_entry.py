"""One entry of the token cache on disk (`Entry`): KEY.bin holds the tokens, KEY.mask a loss mask
where there is one, KEY.json how to read them (or, for a learned tokenizer's entry, the tokenizer
alone); what goes into an entry is tokencache.py's."""

import contextlib
import errno
import json
import os
import socket
from pathlib import Path

import numpy as np

from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import fmt
from jaxtrain.system.errors import UserError
from jaxtrain.system.lock import FileLock, describe_holder, is_held

# What a complete entry's .json holds (tokencache.py writes them).
_META_KEYS = {"tokenizer", "dtype", "n_tokens", "n_train", "fingerprint", "n_files", "n_bytes",
              "n_docs", "notes"}


class Entry:
  """Written under temporary names and renamed when complete, the .json last: a .json whose .bin
  (and .mask) hold the sizes it states is the only state trusted. Writers hold KEY.lock, so one
  process tokenizes and the others wait for it and then read its result."""

  def __init__(self, directory: Path, key: str):
    self.dir, self.key = directory, key
    self.bin, self.meta = directory / f"{key}.bin", directory / f"{key}.json"
    self.mask = directory / f"{key}.mask"

  def load(self) -> tuple[dict | None, str]:
    """(meta, "") for a complete entry; (None, what is wrong) otherwise ("" if nothing is there)."""
    try:
      meta = json.loads(self.meta.read_text())
      expected = int(meta["n_tokens"]) * np.dtype(meta["dtype"]).itemsize
      missing = _META_KEYS - meta.keys()
    except FileNotFoundError:
      return None, ""
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
      return None, f"{self.meta.name} is unreadable"
    if missing:
      return None, f"{self.meta.name} lacks {sorted(missing)[0]}"
    masked = [(self.mask, int(meta["n_tokens"]))] if meta.get("masked") else []
    for path, want in [(self.bin, expected), *masked]:
      try:
        size = path.stat().st_size
      except FileNotFoundError:
        return None, f"{path.name} is missing"
      if size != want:
        return None, f"{path.name} holds {size} bytes, not {want}"
    return meta, ""

  @contextlib.contextmanager
  def writing(self, log):
    """Holds KEY.lock while the entry is written; dead writers' leftovers are removed first."""
    try:
      self.dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise UserError(f"cannot create the token cache {self.dir} ({e.strerror}); pass "
                      "--config.data.cache_dir=<a writable directory>") from None
    lock = FileLock(self.dir / f"{self.key}.lock")
    try:
      if not lock.acquire():
        log(f"data: waiting for {describe_holder(lock.holder())}, which is tokenizing the same "
            "files")
        lock.acquire(blocking=True)
    except OSError:
      pass  # unwritable here (reported when the tokens are written) or no locks: go unguarded
    try:
      if lock.held:
        self._sweep()
      yield
    finally:
      lock.release()

  def _sweep(self) -> None:
    """Removes temporary files of writers that died: theirs is the only live lock on an entry,
    so a temporary file whose entry no live process holds is left over."""
    for tmp in self.dir.glob("*.tmp*"):
      key = tmp.name.split(".", 1)[0]
      if key == self.key or not is_held(self.dir / f"{key}.lock"):
        tmp.unlink(missing_ok=True)

  def load_tokenizer(self):
    """The tokenizer of a tokenizer entry (KEY.json alone), or None if there is none intact."""
    try:
      return tokenizer_lib.from_cache(json.loads(self.meta.read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
      return None

  def write_tokenizer(self, tok) -> None:
    meta = {"tokenizer": tok.to_json()}
    if isinstance(tok, tokenizer_lib.HFTokenizer):
      meta["tokenizer_json"] = tok.hf_json()
    tmp = self.tmp(self.meta)
    try:
      self.write_json(tmp, meta)
      os.replace(tmp, self.meta)
    except OSError as e:
      raise self.write_error(e, 0) from None
    finally:
      tmp.unlink(missing_ok=True)

  @staticmethod
  def write_json(path: Path, meta: dict) -> None:
    with open(path, "w") as out:
      out.write(json.dumps(meta, ensure_ascii=False))
      out.flush()
      os.fsync(out.fileno())

  def tmp(self, path: Path) -> Path:
    # The host too: hosts sharing a cache directory may have no working locks, and equal PIDs.
    return path.with_name(f"{path.name}.tmp{socket.gethostname()}-{os.getpid()}")

  def write_error(self, e: OSError, need: int) -> UserError:
    if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
      return UserError(f"writing the token cache in {self.dir} failed ({e.strerror}; it needs "
                       f"about {fmt.nbytes(need)}); free space there or pass "
                       "--config.data.cache_dir=<a directory with room>")
    return UserError(f"writing the token cache in {self.dir} failed ({e.strerror}); pass "
                     "--config.data.cache_dir=<a writable directory>")
