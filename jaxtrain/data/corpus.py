"""Documents in, batches out: tokenize once into a cached memmap, feed random windows.

The token stream is the documents (jaxtrain/data/documents.py) in order, each followed by the
tokenizer's end-of-text token; several files come in a fixed pseudo-random order, so the held-out
tail samples the whole corpus. Validation is the smallest tail of whole documents holding
`val_fraction` of the text's bytes (documents too large for that: the stream is cut inside
one), so every tokenizer sees the same validation text. The micro-batch with index i holds
`batch_size` windows of `seq_len + 1` tokens at offsets drawn from a generator seeded by
(seed, i), packed across documents: any batch can be rebuilt from the seed and its index.
Prompt/completion records also get a mask beside the tokens (KEY.mask, a uint8 per token: 1 where
the token counts in the loss, i.e. completions and their end-of-text), and their batches a
`"weights"` entry, float32[B, T], one per target; so do chat records (data/chat_format.py: 1 on the
assistant turns' tokens and their end-of-turn tokens), whose tokenizer gets the chat tokens.
Token files (data/tokenfiles.py: ids already, nanoGPT's and llm.c's .bin) are read in place.
"""

import contextlib
import dataclasses
import errno
import hashlib
import itertools
import json
import os
import socket
from pathlib import Path

import grain  # noqa: F401 (API: data.grain)
import ml_collections
import numpy as np

from jaxtrain.data import chat_format as chat
from jaxtrain.data import documents as corpus_lib
from jaxtrain.data import tokenfiles
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.data.documents import Documents, describe, resolve_files, stdlib_dir  # noqa: F401 (API)
from jaxtrain.data.windows import (  # noqa: F401 (API)
  _EVAL_STREAM,
  _TRAIN_STREAM,
  Shards,
  WindowBatches,
  batches_bpb,
  bits_per_byte,
  check_lengths,
  eval_batches,
  eval_weights,
  process_rows,
  train_iterator,
)
from jaxtrain.system import fmt, signals
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.system.lock import FileLock, describe_holder, is_held
from jaxtrain.system.paths import cache_dir as default_cache_dir

_CACHE_VERSION = 2
_BATCH_CHARS = 4 << 20  # text encoded per call: BPE spreads a batch over all cores


@dataclasses.dataclass
class Corpus:
  tokens: np.ndarray | Shards  # the whole token stream: a read-only memmap (token files: theirs)
  tokenizer: object
  n_train: int
  fingerprint: str  # sha256 of the token stream: same text and tokenizer, same fingerprint
  n_files: int
  n_bytes: int
  notes: list[str]  # what was skipped or replaced, for the log
  n_docs: int = 0
  mask: np.ndarray | None = None  # uint8 per token, 1: a target in the loss; None: all are
  sources: list = dataclasses.field(default_factory=list)  # data.mixture's (mixture.Source)
  about: str = ""  # token files: what they are, for the summary ("": text)

  @property
  def train(self) -> np.ndarray | Shards:
    return self.tokens[:self.n_train]

  @property
  def val(self) -> np.ndarray | Shards:
    return self.tokens[self.n_train:]

  def split_mask(self, train: bool) -> np.ndarray | None:
    if self.mask is None:
      return None
    return self.mask[:self.n_train] if train else self.mask[self.n_train:]


def _ordered(files: list[Path]) -> list[Path]:
  # A fixed permutation (independent of the run's seed): the validation tail then samples
  # the whole corpus instead of the files that sort last.
  if len(files) < 2:
    return files
  return [files[i] for i in np.random.default_rng(0).permutation(len(files))]


def _cache_key(files: list[Path], data: ml_collections.ConfigDict, fixed=None) -> str:
  """Names, sizes and mtimes of the files, and every setting that changes the tokens or split."""
  tok = data.tokenizer
  if fixed is not None:
    tok = hashlib.sha256(json.dumps(fixed.to_json(), sort_keys=True).encode()).hexdigest()
  elif tok not in tokenizer_lib.BUILTIN:  # a tokenizer.json: its content
    try:
      tok = hashlib.sha256(Path(tok).expanduser().read_bytes()).hexdigest()
    except OSError as e:
      raise ConfigError("data.tokenizer", f"cannot read {tok} ({e.strerror})", "pass byte, "
                        "char, bpe or the path of a Hugging Face tokenizer.json") from None
  key = {"v": _CACHE_VERSION, "tokenizer": tok, "field": data.text_field,
         "vocab": data.vocab_size if tok == "bpe" else 0, "val": data.val_fraction}
  if is_records(data):  # (text corpora keep the keys they had)
    key.update(field=[data.prompt_field, data.completion_field])
  if is_chat(data):
    key.update(field=data.messages_field, chat=list(chat.TOKENS))
  h = hashlib.sha256(json.dumps(key).encode())
  for f in files:
    st = os.stat(f)
    h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()[:24]


def is_records(data: ml_collections.ConfigDict) -> bool:
  """Whether `data` is prompt/completion records (only completions in the loss)."""
  return bool(data.get("prompt_field") and data.get("completion_field"))


def is_chat(data: ml_collections.ConfigDict) -> bool:
  """Whether `data` is chat records (only assistant turns in the loss)."""
  return bool(data.get("messages_field"))


def loss_scope(data: ml_collections.ConfigDict) -> str:
  """What the loss counts, as the eval line says it ("": every token)."""
  return "completions" if is_records(data) else "assistant turns" if is_chat(data) else ""


def prepare(data: ml_collections.ConfigDict, show_progress: bool = True, log=print,
            files: list[Path] | None = None, tokenizer=None, vocab_size: int = 0) -> Corpus:
  """Tokenizes `data.path` (or `files`) once (cached by file names, sizes, mtimes and the
  tokenizer's settings) and maps it. `tokenizer`: this one instead of `data.tokenizer`'s.
  Token files are mapped as they are; `vocab_size` (model.vocab_size) counts flat files' ids."""
  files = resolve_files(data.path) if files is None else files
  if not files:
    raise ConfigError("data.path", f"{describe(data.path)!r} matches no file (not a file, a "
                      "directory with files, or a glob)", "point --config.data.path at your text "
                      "(file, directory or glob), or leave it empty for the Python standard library")
  if (chosen := tokenfiles.select(data, files)) is not None:
    t = tokenfiles.prepare(data, *chosen, vocab_size, show_progress, log)
    return Corpus(tokens=t.tokens, tokenizer=t.tokenizer, n_train=t.n_train,
                  fingerprint=t.fingerprint, n_files=t.n_files, n_bytes=0, notes=t.notes,
                  about=t.about)
  files = _ordered(files)
  cache = _Cache(Path(data.cache_dir or default_cache_dir()) / "tokens",
                 _cache_key(files, data, tokenizer))
  meta, damage = cache.load()
  if meta is None:
    with cache.writing(log):
      meta, damage = cache.load()  # another process may have written it while this one waited
      if meta is None:
        if damage:
          log(f"data: ignoring the token cache {cache.bin} ({damage}); tokenizing again")
        meta = _tokenize(files, data, cache, show_progress, log, tokenizer)
  tok = tokenizer_lib.from_cache(meta)
  n = meta["n_tokens"]
  tokens = np.memmap(cache.bin, dtype=np.dtype(meta["dtype"]), mode="r", shape=(n,))
  mask = np.memmap(cache.mask, dtype=np.uint8, mode="r", shape=(n,)) if meta.get("masked") \
      else None
  return Corpus(tokens=tokens, tokenizer=tok, n_train=meta["n_train"],
                fingerprint=meta["fingerprint"], n_files=meta["n_files"], n_bytes=meta["n_bytes"],
                notes=meta["notes"], n_docs=meta["n_docs"], mask=mask)


class _Cache:
  """One corpus's entry in the token cache: KEY.bin holds the tokens, KEY.json says how to read
  them. Both are written under temporary names and renamed when complete, the .json last: a
  .json whose .bin is present with the size it states is the only state trusted. Writers hold
  KEY.lock, so one process tokenizes and the others wait for it and then read its result."""

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
    try:
      size = self.bin.stat().st_size
    except FileNotFoundError:
      return None, f"{self.bin.name} is missing"
    if size != expected:
      return None, f"{self.bin.name} holds {size} bytes, not {expected}"
    if meta.get("masked"):
      try:
        size = self.mask.stat().st_size
      except FileNotFoundError:
        return None, f"{self.mask.name} is missing"
      if size != int(meta["n_tokens"]):
        return None, f"{self.mask.name} holds {size} bytes, not {meta['n_tokens']}"
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


def _tokenize(files, data, cache: _Cache, show_progress: bool, log, fixed=None) -> dict:
  """Writes the cache entry (the tokens, then the .json that marks them complete); its meta.
  Bad input is found by the first pass, before anything is written."""
  kind = "fixed" if fixed is not None else data.tokenizer
  tok = fixed if fixed is not None else None if kind in tokenizer_lib.BUILTIN else \
      tokenizer_lib.read_file(os.path.expanduser(data.tokenizer))  # one that does not load: now
  records = is_records(data) or is_chat(data)  # a loss mask beside the tokens
  docs = Documents(files, data.path, data.text_field, show_progress,
                   data.get("prompt_field", ""), data.get("completion_field", ""),
                   data.get("messages_field", ""))
  if not show_progress:
    log(f"data: tokenizing {len(files)} file(s), {docs.total / 1e6:.1f} MB, once (then cached)")
  sizes, chars = corpus_lib.survey(docs, kind == "char")
  if not sizes.sum():
    raise UserError(f"{describe(data.path)} holds no text{_why_empty(docs, len(files))}; "
                    "point --config.data.path at non-empty text, .jsonl or .parquet files")
  cut = corpus_lib.cut(sizes, data.val_fraction)
  if kind == "bpe":
    log(f"data: training a {data.vocab_size}-token BPE vocabulary on the training split "
        f"({fmt.nbytes(int(sizes[:cut[0]].sum()) + cut[1])})")
    pieces = itertools.takewhile(lambda p: p[2], corpus_lib.split(docs("BPE"), cut))
    tok = tokenizer_lib.train_bpe((p[0] for p in pieces if not isinstance(p[0], chat.Special)),
                                  data.vocab_size)
  elif kind == "char":
    tok = tokenizer_lib.CharTokenizer(chars)
  elif kind == "byte":
    tok = tokenizer_lib.ByteTokenizer()
  if is_chat(data):
    tok = chat.with_chat(tok)
  tmp, tmp_meta, tmp_mask = cache.tmp(cache.bin), cache.tmp(cache.meta), cache.tmp(cache.mask)
  try:
    cache.meta.unlink(missing_ok=True)  # a damaged entry's: only a complete new one may count
    with open(tmp, "wb") as out, \
        (open(tmp_mask, "wb") if records else contextlib.nullcontext()) as mask_out:
      writer = _Writer(tok, out, mask_out, chat.special_ids(tok) if is_chat(data) else None)
      for piece in corpus_lib.split(docs("tokenizing"), cut):
        writer.add(*piece)
      writer.flush()
      for f in (out, mask_out) if records else (out,):
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename: a crash never leaves a short .bin
    if records and not writer.loss_chars:
      raise UserError(f"{describe(data.path)} holds no completion text (every "
                      f"{data.completion_field!r} is empty); nothing would be learned: check "
                      "--config.data.completion_field")
    if records:
      os.replace(tmp_mask, cache.mask)
    os.replace(tmp, cache.bin)
    meta = {"tokenizer": tok.to_json(), "dtype": np.dtype(tok.dtype).name,
            "n_tokens": writer.n_tokens, "n_train": writer.n_train,
            "fingerprint": writer.sha.hexdigest(), "n_files": len(files) - len(docs.binary),
            "n_bytes": int(sizes.sum()), "n_docs": int((sizes > 0).sum()), "notes": docs.notes(),
            "source": describe(data.path), "masked": records}
    if isinstance(tok, tokenizer_lib.HFTokenizer):
      meta["tokenizer_json"] = tok.hf_json()
    with open(tmp_meta, "w") as out:
      out.write(json.dumps(meta, ensure_ascii=False))
      out.flush()
      os.fsync(out.fileno())
    signals.check()  # a Ctrl-C that Python dropped while tokenizing: no trusted entry
    os.replace(tmp_meta, cache.meta)  # last: from now on the entry is trusted
  except OSError as e:
    raise cache.write_error(e, docs.total * np.dtype(tok.dtype).itemsize) from None
  finally:
    tmp.unlink(missing_ok=True)
    tmp_meta.unlink(missing_ok=True)
    tmp_mask.unlink(missing_ok=True)
  return meta


class _Writer:
  """Encodes pieces in batches, writes the tokens with end-of-text after each non-empty
  document, and counts what the training split holds; with `mask_out`, a byte per token too:
  1 where it counts in the loss (its piece's; end-of-text: that of the piece ending the document).
  `specials`: the ids of chat.Special pieces."""

  def __init__(self, tok, out, mask_out=None, specials: dict[str, int] | None = None):
    self.tok, self.out, self.mask_out, self.specials = tok, out, mask_out, specials or {}
    self.sha, self.n_tokens, self.n_train = hashlib.sha256(), 0, 0
    self.pending: list[tuple[str, bool, bool, bool]] = []
    self.chars, self.doc_chars, self.loss_chars = 0, 0, 0
    self.eot = np.array([tok.eot_id], tok.dtype)

  def add(self, text: str, end: bool, train: bool, loss: bool = True) -> None:
    self.pending.append((text, end, train, loss))
    self.chars += len(text)
    self.loss_chars += len(text) if loss else 0
    if self.chars >= _BATCH_CHARS:
      self.flush()

  def flush(self) -> None:
    signals.check()
    if not self.pending:
      return
    texts = [p[0] for p in self.pending if not isinstance(p[0], chat.Special)]
    encoded = iter(self.tok.encode_batch(texts) if texts else [])
    parts, masks = [], []
    for text, end, train, loss in self.pending:
      ids = np.array([self.specials[text]], self.tok.dtype) if isinstance(text, chat.Special) \
          else next(encoded)
      self.doc_chars += len(text)
      eot = end and self.doc_chars > 0
      n = len(ids) + eot
      parts += [ids, self.eot] if eot else [ids]
      masks += [np.full(len(ids) + eot, loss, np.uint8)]
      self.n_tokens += n
      self.n_train += n if train else 0
      self.doc_chars = 0 if end else self.doc_chars
    block = np.concatenate(parts).astype(self.tok.dtype, copy=False).tobytes()
    self.out.write(block)
    self.sha.update(block)
    if self.mask_out is not None:
      mask = np.concatenate(masks).tobytes()
      self.mask_out.write(mask)
      self.sha.update(mask)  # the fingerprint covers what the loss counts
    self.pending, self.chars = [], 0
