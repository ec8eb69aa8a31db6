"""Text in, batches out: find the files, tokenize once into a cached memmap, feed random windows.

The token stream is the files concatenated (several files in a fixed pseudo-random order, so the
held-out tail is a sample of the whole corpus). The last `val_fraction` of it is validation.
The micro-batch with index i holds `batch_size` windows of `seq_len + 1` tokens at offsets drawn
from a generator seeded by (seed, i): any batch can be rebuilt from the seed and its index.
"""

import codecs
import contextlib
import dataclasses
import errno
import glob
import hashlib
import json
import os
import socket
import sysconfig
from pathlib import Path

import grain
import ml_collections
import numpy as np

from jaxtrain import fmt
from jaxtrain import tokenizer as tokenizer_lib
from jaxtrain.errors import ConfigError, UserError
from jaxtrain.lock import FileLock, describe_holder, is_held
from jaxtrain.paths import cache_dir as default_cache_dir

_CACHE_VERSION = 1
_CHUNK_BYTES = 8 << 20
_TRAIN_STREAM, _EVAL_STREAM = 0, 1


def stdlib_dir() -> Path:
  return Path(sysconfig.get_paths()["stdlib"])


def resolve_files(path: str) -> list[Path]:
  """The files behind `data.path`: one file, every non-hidden file under a directory, or a glob."""
  if not path:
    return _walk(stdlib_dir(), suffix=".py", skip=("site-packages", "dist-packages"))
  p = Path(path).expanduser()
  if p.is_file():
    return [p]
  if p.is_dir():
    return _walk(p)
  return sorted(Path(f) for f in glob.glob(os.path.expanduser(path), recursive=True)
                if os.path.isfile(f))


def _walk(root: Path, suffix: str = "", skip: tuple[str, ...] = ()) -> list[Path]:
  """Non-hidden files under `root`, sorted (os.walk: several times faster than Path.rglob)."""
  root = root.absolute()
  found = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip]
    found.extend(os.path.join(folder, f) for f in files
                 if f.endswith(suffix) and not f.startswith("."))
  return [Path(f) for f in sorted(found)]


def describe(path: str) -> str:
  return path or f"the Python standard library's .py files in {stdlib_dir()}"


@dataclasses.dataclass
class Corpus:
  tokens: np.ndarray  # the whole token stream, a read-only memmap
  tokenizer: object
  n_train: int
  fingerprint: str  # sha256 of the token stream: same text and tokenizer, same fingerprint
  n_files: int
  n_bytes: int
  notes: list[str]  # what was skipped or replaced, for the log

  @property
  def train(self) -> np.ndarray:
    return self.tokens[:self.n_train]

  @property
  def val(self) -> np.ndarray:
    return self.tokens[self.n_train:]


class _Counter:
  """A codec error handler that replaces undecodable bytes with U+FFFD and counts them."""

  def __init__(self):
    self.count = 0
    self.name = f"jaxtrain_count_{id(self)}"
    codecs.register_error(self.name, self._handle)

  def _handle(self, err: UnicodeDecodeError):
    self.count += err.end - err.start
    return "\ufffd", err.end


def _read_text(path: Path, counter: _Counter, progress=None):
  """Yields the file's text in chunks; raises _Binary on a NUL byte."""
  decoder = codecs.getincrementaldecoder("utf-8")(errors=counter.name)
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK_BYTES):
      if b"\0" in chunk:
        raise _Binary(path)
      if progress is not None:
        progress.update(len(chunk))
      yield decoder.decode(chunk)
  yield decoder.decode(b"", final=True)


class _Binary(Exception):
  pass


def _ordered(files: list[Path]) -> list[Path]:
  # A fixed permutation (independent of the run's seed): the validation tail then samples
  # the whole corpus instead of the files that sort last.
  if len(files) < 2:
    return files
  return [files[i] for i in np.random.default_rng(0).permutation(len(files))]


def _cache_key(files: list[Path], tok_name: str) -> str:
  h = hashlib.sha256(json.dumps({"v": _CACHE_VERSION, "tokenizer": tok_name}).encode())
  for f in files:
    st = os.stat(f)
    h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()[:24]


def prepare(data: ml_collections.ConfigDict, show_progress: bool = True, log=print) -> Corpus:
  """Tokenizes `data.path` once (cached by file names, sizes and mtimes) and maps it."""
  files = _ordered(resolve_files(data.path))
  if not files:
    raise ConfigError("data.path", f"{describe(data.path)!r} matches no file (not a file, a "
                      "directory with files, or a glob)", "point --config.data.path at your text "
                      "(file, directory or glob), or leave it empty for the Python standard library")
  cache = _Cache(Path(data.cache_dir or default_cache_dir()) / "tokens",
                 _cache_key(files, data.tokenizer))
  meta, damage = cache.load()
  if meta is None:
    with cache.writing(log):
      meta, damage = cache.load()  # another process may have written it while this one waited
      if meta is None:
        if damage:
          log(f"data: ignoring the token cache {cache.bin} ({damage}); tokenizing again")
        meta = _tokenize(files, data, cache, show_progress, log)
  tok = tokenizer_lib.from_json(meta["tokenizer"])
  n = meta["n_tokens"]
  tokens = np.memmap(cache.bin, dtype=np.dtype(meta["dtype"]), mode="r", shape=(n,))
  n_val = int(n * data.val_fraction)
  return Corpus(tokens=tokens, tokenizer=tok, n_train=n - n_val, fingerprint=meta["fingerprint"],
                n_files=meta["n_files"], n_bytes=meta["n_bytes"], notes=meta["notes"])


class _Cache:
  """One corpus's entry in the token cache: KEY.bin holds the tokens, KEY.json says how to read
  them. Both are written under temporary names and renamed when complete, the .json last: a
  .json whose .bin is present with the size it states is the only state trusted. Writers hold
  KEY.lock, so one process tokenizes and the others wait for it and then read its result."""

  def __init__(self, directory: Path, key: str):
    self.dir, self.key = directory, key
    self.bin, self.meta = directory / f"{key}.bin", directory / f"{key}.json"

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
    try:
      size = self.bin.stat().st_size
    except FileNotFoundError:
      return None, f"{self.bin.name} is missing"
    if size != expected:
      return None, f"{self.bin.name} holds {size} bytes, not {expected}"
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


_META_KEYS = {"tokenizer", "dtype", "n_tokens", "fingerprint", "n_files", "n_bytes", "notes"}


def _tokenize(files, data, cache: _Cache, show_progress: bool, log) -> dict:
  """Writes the cache entry (the tokens, then the .json that marks them complete); its meta."""
  total = sum(f.stat().st_size for f in files)
  if not show_progress:
    log(f"data: tokenizing {len(files)} file(s), {total / 1e6:.1f} MB, once (then cached)")
  source = _Texts(files, data.path, total, show_progress)
  if data.tokenizer == "char":
    seen = set()
    for text in source("reading"):
      seen.update(np.unique(tokenizer_lib.CharTokenizer.codepoints(text)).tolist())
    tok = tokenizer_lib.CharTokenizer("".join(map(chr, seen)))
    source.counter.count = 0
  else:
    tok = tokenizer_lib.ByteTokenizer()
  sha = hashlib.sha256()
  n_tokens = 0
  tmp, tmp_meta = cache.tmp(cache.bin), cache.tmp(cache.meta)
  try:
    cache.meta.unlink(missing_ok=True)  # a damaged entry's: only a complete new one may count
    with open(tmp, "wb") as out:
      for text in source("tokenizing"):
        ids = tok.encode(text)
        out.write(ids.tobytes())
        sha.update(ids.tobytes())
        n_tokens += len(ids)
      out.flush()
      os.fsync(out.fileno())  # on disk before the rename: a crash never leaves a short .bin
    if n_tokens <= 1 + len(files):
      raise UserError(f"{describe(data.path)} holds no text (empty files); point "
                      "--config.data.path at a non-empty UTF-8 text")
    os.replace(tmp, cache.bin)
    meta = {"tokenizer": tok.to_json(), "dtype": np.dtype(tok.dtype).name, "n_tokens": n_tokens,
            "fingerprint": sha.hexdigest(), "n_files": len(files) - len(source.binary),
            "n_bytes": total, "notes": source.notes(), "source": describe(data.path)}
    with open(tmp_meta, "w") as out:
      out.write(json.dumps(meta, ensure_ascii=False))
      out.flush()
      os.fsync(out.fileno())
    os.replace(tmp_meta, cache.meta)  # last: from now on the entry is trusted
  except OSError as e:
    raise cache.write_error(e, total * np.dtype(tok.dtype).itemsize) from None
  finally:
    tmp.unlink(missing_ok=True)
    tmp_meta.unlink(missing_ok=True)
  return meta


class _Texts:
  """Each usable file's text in chunks, once per call; binary files are skipped (or fatal)."""

  def __init__(self, files: list[Path], path: str, total: int, show_progress: bool):
    self.files, self.path, self.total, self.show_progress = files, path, total, show_progress
    self.counter = _Counter()
    self.binary: list[Path] = []

  def __call__(self, desc: str):
    from tqdm import tqdm  # the terminal bar: tqdm.auto would want ipywidgets in notebooks

    single = len(self.files) == 1
    with tqdm(total=self.total, unit="B", unit_scale=True, desc=desc,
              disable=not self.show_progress, leave=False) as bar:
      for f in self.files:
        if f in self.binary:
          continue
        try:
          yield from _read_text(f, self.counter, bar)
          if not single:
            yield "\n"  # files never run into each other
        except _Binary:
          if single:
            raise UserError(f"{f} looks binary (it has NUL bytes), not text; point "
                            "--config.data.path at UTF-8 text") from None
          self.binary.append(f)
        except OSError as e:
          raise UserError(f"cannot read {f} ({e.strerror}); fix its permissions or leave it "
                          "out of --config.data.path") from None

  def notes(self) -> list[str]:
    notes = []
    if self.binary:
      notes.append(f"skipped {len(self.binary)} binary file(s), e.g. {self.binary[0]}")
    if self.counter.count:
      notes.append(f"replaced {self.counter.count} byte(s) that are not UTF-8 with U+FFFD")
    return notes


class WindowBatches:
  """Random-access micro-batches of random windows: item i is a pure function of (seed, i).

  `rows` picks this process's share of every global batch, so processes never read each
  other's rows.
  """

  def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, stream: int,
               rows: slice = slice(None)):
    self.tokens, self.batch_size, self.window = tokens, batch_size, seq_len + 1
    self.seed, self.stream, self.rows = seed, stream, rows
    self.n_starts = len(tokens) - self.window + 1

  def __len__(self) -> int:
    return 2**62  # endless: the loop decides when to stop

  def __getitem__(self, index: int) -> dict:
    rng = np.random.default_rng([self.seed, self.stream, index])
    starts_B = rng.integers(0, self.n_starts, size=self.batch_size)[self.rows]
    return {"tokens": self.tokens[starts_B[:, None] + np.arange(self.window)].astype(np.int32)}


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
  per = batch_size // process_count
  return slice(process_index * per, (process_index + 1) * per)


def train_iterator(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                   process_index: int = 0, process_count: int = 1) -> grain.DatasetIterator:
  """Grain iterator over training micro-batches; its state is the next micro-batch index."""
  source = WindowBatches(corpus.train, batch_size, seq_len, seed, _TRAIN_STREAM,
                         process_rows(batch_size, process_index, process_count))
  # One reader thread a few batches ahead keeps batch assembly off the step's critical path.
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
  return iter(grain.MapDataset.source(source).to_iter_dataset(options))


def eval_batches(corpus: Corpus, batch_size: int, seq_len: int, seed: int, n_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[dict]:
  """The same `n_batches` validation batches at every evaluation, so val losses compare."""
  source = WindowBatches(corpus.val, batch_size, seq_len, seed, _EVAL_STREAM,
                         process_rows(batch_size, process_index, process_count))
  return [source[i] for i in range(n_batches)]


def check_lengths(corpus: Corpus, seq_len: int, val_fraction: float) -> None:
  window = seq_len + 1
  if len(corpus.val) < window:
    need = int(window / val_fraction) + window
    raise UserError(f"the corpus has {len(corpus.tokens)} tokens: its validation split "
                    f"({len(corpus.val)}) is shorter than one window of seq_len+1={window}; use "
                    f"at least ~{need} tokens of text or a smaller --config.model.seq_len")
  if len(corpus.train) < window:
    raise UserError(f"the corpus has {len(corpus.tokens)} tokens: its training split "
                    f"({len(corpus.train)}) is shorter than one window of seq_len+1={window}; "
                    "pass a smaller --config.data.val_fraction or --config.model.seq_len, or "
                    "use more text")
