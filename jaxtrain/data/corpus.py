"""Documents in, batches out: tokenize once into a cached memmap, feed random windows.

The token stream is the documents (jaxtrain/corpus.py) in order, each followed by the
tokenizer's end-of-text token; several files come in a fixed pseudo-random order, so the held-out
tail samples the whole corpus. Validation is the smallest tail of whole documents holding
`val_fraction` of the text's bytes (documents too large for that: the stream is cut inside
one), so every tokenizer sees the same validation text. The micro-batch with index i holds
`batch_size` windows of `seq_len + 1` tokens at offsets drawn from a generator seeded by
(seed, i), packed across documents: any batch can be rebuilt from the seed and its index.
"""

import contextlib
import dataclasses
import errno
import hashlib
import itertools
import json
import math
import os
import socket
from pathlib import Path

import grain
import ml_collections
import numpy as np

from jaxtrain.data import documents as corpus_lib
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.data.documents import Documents, describe, resolve_files, stdlib_dir  # noqa: F401 (API)
from jaxtrain.system import fmt
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.system.lock import FileLock, describe_holder, is_held
from jaxtrain.system.paths import cache_dir as default_cache_dir

_CACHE_VERSION = 2
_BATCH_CHARS = 4 << 20  # text encoded per call: BPE spreads a batch over all cores
_TRAIN_STREAM, _EVAL_STREAM = 0, 1


@dataclasses.dataclass
class Corpus:
  tokens: np.ndarray  # the whole token stream, a read-only memmap
  tokenizer: object
  n_train: int
  fingerprint: str  # sha256 of the token stream: same text and tokenizer, same fingerprint
  n_files: int
  n_bytes: int
  notes: list[str]  # what was skipped or replaced, for the log
  n_docs: int = 0

  @property
  def train(self) -> np.ndarray:
    return self.tokens[:self.n_train]

  @property
  def val(self) -> np.ndarray:
    return self.tokens[self.n_train:]


def _ordered(files: list[Path]) -> list[Path]:
  # A fixed permutation (independent of the run's seed): the validation tail then samples
  # the whole corpus instead of the files that sort last.
  if len(files) < 2:
    return files
  return [files[i] for i in np.random.default_rng(0).permutation(len(files))]


def _cache_key(files: list[Path], data: ml_collections.ConfigDict) -> str:
  """Names, sizes and mtimes of the files, and every setting that changes the tokens or split."""
  tok = data.tokenizer
  if tok not in tokenizer_lib.BUILTIN:  # a tokenizer.json: its content
    try:
      tok = hashlib.sha256(Path(tok).expanduser().read_bytes()).hexdigest()
    except OSError as e:
      raise ConfigError("data.tokenizer", f"cannot read {tok} ({e.strerror})", "pass byte, "
                        "char, bpe or the path of a Hugging Face tokenizer.json") from None
  h = hashlib.sha256(json.dumps({"v": _CACHE_VERSION, "tokenizer": tok, "field": data.text_field,
                                 "vocab": data.vocab_size if tok == "bpe" else 0,
                                 "val": data.val_fraction}).encode())
  for f in files:
    st = os.stat(f)
    h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()[:24]


def prepare(data: ml_collections.ConfigDict, show_progress: bool = True, log=print) -> Corpus:
  """Tokenizes `data.path` once (cached by file names, sizes, mtimes and the tokenizer's
  settings) and maps it."""
  files = _ordered(resolve_files(data.path))
  if not files:
    raise ConfigError("data.path", f"{describe(data.path)!r} matches no file (not a file, a "
                      "directory with files, or a glob)", "point --config.data.path at your text "
                      "(file, directory or glob), or leave it empty for the Python standard library")
  cache = _Cache(Path(data.cache_dir or default_cache_dir()) / "tokens", _cache_key(files, data))
  meta, damage = cache.load()
  if meta is None:
    with cache.writing(log):
      meta, damage = cache.load()  # another process may have written it while this one waited
      if meta is None:
        if damage:
          log(f"data: ignoring the token cache {cache.bin} ({damage}); tokenizing again")
        meta = _tokenize(files, data, cache, show_progress, log)
  tok = tokenizer_lib.from_cache(meta)
  n = meta["n_tokens"]
  tokens = np.memmap(cache.bin, dtype=np.dtype(meta["dtype"]), mode="r", shape=(n,))
  return Corpus(tokens=tokens, tokenizer=tok, n_train=meta["n_train"],
                fingerprint=meta["fingerprint"], n_files=meta["n_files"], n_bytes=meta["n_bytes"],
                notes=meta["notes"], n_docs=meta["n_docs"])


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


_META_KEYS = {"tokenizer", "dtype", "n_tokens", "n_train", "fingerprint", "n_files", "n_bytes",
              "n_docs", "notes"}


def _why_empty(docs: Documents, n_files: int) -> str:
  """Why a corpus came out empty, for the error: after "holds no text"."""
  n = len(docs.binary)
  if not n:
    return " (no documents, or only empty ones)"
  which = f"all {n} files were" if n == n_files else \
      f"{n} of the {n_files} files {'was' if n == 1 else 'were'}"
  rest = "" if n == n_files else " and the rest are empty"
  return f": {which} skipped as binary (they have NUL bytes, e.g. {docs.binary[0]}){rest}"


def _tokenize(files, data, cache: _Cache, show_progress: bool, log) -> dict:
  """Writes the cache entry (the tokens, then the .json that marks them complete); its meta.
  Bad input is found by the first pass, before anything is written."""
  tok = None if data.tokenizer in tokenizer_lib.BUILTIN else \
      tokenizer_lib.read_file(os.path.expanduser(data.tokenizer))  # one that does not load: now
  docs = Documents(files, data.path, data.text_field, show_progress)
  if not show_progress:
    log(f"data: tokenizing {len(files)} file(s), {docs.total / 1e6:.1f} MB, once (then cached)")
  sizes, chars = corpus_lib.survey(docs, data.tokenizer == "char")
  if not sizes.sum():
    raise UserError(f"{describe(data.path)} holds no text{_why_empty(docs, len(files))}; "
                    "point --config.data.path at non-empty text, .jsonl or .parquet files")
  cut = corpus_lib.cut(sizes, data.val_fraction)
  if data.tokenizer == "bpe":
    log(f"data: training a {data.vocab_size}-token BPE vocabulary on the training split "
        f"({fmt.nbytes(int(sizes[:cut[0]].sum()) + cut[1])})")
    pieces = itertools.takewhile(lambda p: p[2], corpus_lib.split(docs("BPE"), cut))
    tok = tokenizer_lib.train_bpe((text for text, _, _ in pieces), data.vocab_size)
  elif data.tokenizer == "char":
    tok = tokenizer_lib.CharTokenizer(chars)
  elif data.tokenizer == "byte":
    tok = tokenizer_lib.ByteTokenizer()
  tmp, tmp_meta = cache.tmp(cache.bin), cache.tmp(cache.meta)
  try:
    cache.meta.unlink(missing_ok=True)  # a damaged entry's: only a complete new one may count
    with open(tmp, "wb") as out:
      writer = _Writer(tok, out)
      for piece in corpus_lib.split(docs("tokenizing"), cut):
        writer.add(*piece)
      writer.flush()
      out.flush()
      os.fsync(out.fileno())  # on disk before the rename: a crash never leaves a short .bin
    os.replace(tmp, cache.bin)
    meta = {"tokenizer": tok.to_json(), "dtype": np.dtype(tok.dtype).name,
            "n_tokens": writer.n_tokens, "n_train": writer.n_train,
            "fingerprint": writer.sha.hexdigest(), "n_files": len(files) - len(docs.binary),
            "n_bytes": int(sizes.sum()), "n_docs": int((sizes > 0).sum()), "notes": docs.notes(),
            "source": describe(data.path)}
    if isinstance(tok, tokenizer_lib.HFTokenizer):
      meta["tokenizer_json"] = tok.hf_json()
    with open(tmp_meta, "w") as out:
      out.write(json.dumps(meta, ensure_ascii=False))
      out.flush()
      os.fsync(out.fileno())
    os.replace(tmp_meta, cache.meta)  # last: from now on the entry is trusted
  except OSError as e:
    raise cache.write_error(e, docs.total * np.dtype(tok.dtype).itemsize) from None
  finally:
    tmp.unlink(missing_ok=True)
    tmp_meta.unlink(missing_ok=True)
  return meta


class _Writer:
  """Encodes pieces in batches, writes the tokens with end-of-text after each non-empty
  document, and counts what the training split holds."""

  def __init__(self, tok, out):
    self.tok, self.out = tok, out
    self.sha, self.n_tokens, self.n_train = hashlib.sha256(), 0, 0
    self.pending: list[tuple[str, bool, bool]] = []
    self.chars, self.doc_chars = 0, 0
    self.eot = np.array([tok.eot_id], tok.dtype)

  def add(self, text: str, end: bool, train: bool) -> None:
    self.pending.append((text, end, train))
    self.chars += len(text)
    if self.chars >= _BATCH_CHARS:
      self.flush()

  def flush(self) -> None:
    if not self.pending:
      return
    encoded = self.tok.encode_batch([t for t, _, _ in self.pending])
    parts = []
    for ids, (text, end, train) in zip(encoded, self.pending):
      self.doc_chars += len(text)
      n = len(ids) + (end and self.doc_chars > 0)
      parts += [ids, self.eot] if end and self.doc_chars > 0 else [ids]
      self.n_tokens += n
      self.n_train += n if train else 0
      self.doc_chars = 0 if end else self.doc_chars
    block = np.concatenate(parts).astype(self.tok.dtype, copy=False).tobytes()
    self.out.write(block)
    self.sha.update(block)
    self.pending, self.chars = [], 0


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


def bits_per_byte(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                  n_batches: int) -> float:
  """What turns the mean validation loss (nats per target token) into val_bpb, bits per UTF-8
  byte: targets / (ln 2 x the bytes they stand for), over every row of the evaluation batches.
  End-of-text targets count in the loss and as no bytes."""
  nbytes = corpus.tokenizer.token_bytes()
  targets = [b["tokens"][:, 1:] for b in eval_batches(corpus, batch_size, seq_len, seed, n_batches)]
  text = sum(int(nbytes[t].sum()) for t in targets)
  return sum(t.size for t in targets) / (math.log(2) * text) if text else math.nan
