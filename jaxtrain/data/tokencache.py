"""The token cache: a text corpus tokenized once into a memmap, read from then on.

An entry (its files, and how they are written and trusted on disk: cache_entry.py) is keyed by
the files' names, sizes and mtimes and every setting that changes the tokens or the split. The
token stream is the documents in order, each followed by the tokenizer's end-of-text token. A
tokenizer learned from several corpora together (a mixture's bpe or char) is an entry of its own
(KEY-tokenizer.json), so that it too is learned once.
"""

import contextlib
import hashlib
import json
import os
from pathlib import Path

import ml_collections
import numpy as np

from jaxtrain.data import chat_format, heldout
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.data.cache_entry import Entry
from jaxtrain.data.chat_format import is_chat
from jaxtrain.data.documents import Documents, describe
from jaxtrain.data.records import is_records
from jaxtrain.system import fmt, paths, signals
from jaxtrain.system.console import Ticker
from jaxtrain.system.errors import ConfigError, UserError

_CACHE_VERSION = 4  # 4: a text file's BOM dropped, CR line ends noted
_BATCH_CHARS = 4 << 20  # text encoded per call: BPE spreads a batch over all cores


def load(files: list[Path], data: ml_collections.ConfigDict, show_progress: bool = True, log=print,
         tokenizer=None) -> dict:
  """`files` tokenized once (cached by file names, sizes, mtimes and the tokenizer's settings),
  mapped, as corpus.Corpus's fields. `tokenizer`: this one instead of `data.tokenizer`'s."""
  files = _ordered(files)
  entry = Entry(_directory(data), _cache_key(files, data, tokenizer))
  meta, damage = entry.load()
  if meta is None:
    with entry.writing(log):
      meta, damage = entry.load()  # another process may have written it while this one waited
      if meta is None:
        if damage:
          log(f"data: ignoring the token cache {entry.bin} ({damage}); tokenizing again")
        meta = _tokenize(files, data, entry, show_progress, log, tokenizer)
  n = meta["n_tokens"]
  tokens = np.memmap(entry.bin, dtype=np.dtype(meta["dtype"]), mode="r", shape=(n,))
  mask = np.memmap(entry.mask, dtype=np.uint8, mode="r", shape=(n,)) if meta.get("masked") \
      else None
  return dict(tokens=tokens, mask=mask, tokenizer=tokenizer_lib.from_cache(meta),
              **{k: meta[k] for k in ("n_train", "fingerprint", "n_files", "n_bytes", "notes", "n_docs")})


def shared_tokenizer(files: list[Path], data: ml_collections.ConfigDict, show_progress: bool = True,
                     log=print):
  """The one tokenizer of `data.tokenizer` for `files` together (a mixture's sources): a learned
  one (cached) as `load` of all the files would learn it, but with nothing tokenized."""
  if data.tokenizer == "byte":
    return tokenizer_lib.ByteTokenizer()
  if data.tokenizer not in tokenizer_lib.BUILTIN:
    _cache_key(files, data)  # a tokenizer.json that cannot be read: one line naming the field
    return tokenizer_lib.read_file(os.path.expanduser(data.tokenizer))
  files = _ordered(files)
  entry = Entry(_directory(data), _cache_key(files, data) + "-tokenizer")
  tok = entry.load_tokenizer()
  if tok is None:
    with entry.writing(log):
      tok = entry.load_tokenizer()
      if tok is None:
        docs, sizes, chars, cut = _survey(files, data, show_progress, log, "learning a tokenizer from",
                                          data.tokenizer == "char")
        tok = _learned(data, docs, sizes, chars, cut, log)
        entry.write_tokenizer(tok)
  return tok


def _directory(data: ml_collections.ConfigDict) -> Path:
  return Path(data.cache_dir or paths.cache_dir()) / "tokens"


def _ordered(files: list[Path]) -> list[Path]:
  # A fixed permutation (independent of the run's seed): the validation tail then samples
  # the whole corpus instead of the files that sort last.
  return [files[i] for i in np.random.default_rng(0).permutation(len(files))]


def _cache_key(files: list[Path], data: ml_collections.ConfigDict, fixed=None) -> str:
  """Names, sizes and mtimes of the files, and every setting that changes the tokens or split."""
  tok = data.tokenizer
  if fixed is not None:
    tok = hashlib.sha256(json.dumps(fixed.to_json(), sort_keys=True).encode()).hexdigest()
  elif tok not in tokenizer_lib.BUILTIN + tokenizer_lib.NAMED:  # a tokenizer.json: its content
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
    key.update(field=data.messages_field, chat=list(chat_format.TOKENS))
  h = hashlib.sha256(json.dumps(key).encode())
  for f in files:
    st = os.stat(f)
    h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()[:24]


def _why_empty(docs: Documents, n_files: int) -> str:
  """Why a corpus came out empty, for the error: after "holds no text"."""
  n = len(docs.binary)
  if not n:
    return " (no documents, or only empty ones)"
  which = f"all {n} files were" if n == n_files else \
      f"{n} of the {n_files} files {'was' if n == 1 else 'were'}"
  rest = "" if n == n_files else " and the rest are empty"
  return f": {which} skipped as binary (they have NUL bytes, e.g. {docs.binary[0]}){rest}"


def _survey(files: list[Path], data: ml_collections.ConfigDict, show_progress: bool, log, doing: str,
            want_chars: bool) -> tuple[Documents, np.ndarray, str, tuple[int, int]]:
  """The files' documents, the bytes of each, their characters (if `want_chars`) and the split's
  cut: one pass over the text, which finds bad input before anything is written."""
  docs = Documents(files, data, show_progress, log)
  if not show_progress:
    log(f"data: {doing} {len(files)} file(s), {docs.total / 1e6:.1f} MB, once (then cached)")
  sizes, chars = heldout.survey(docs, want_chars)
  if not sizes.sum():
    raise UserError(f"{describe(data.path)} holds no text{_why_empty(docs, len(files))}; "
                    "point --config.data.path at non-empty text, .jsonl or .parquet files")
  return docs, sizes, chars, heldout.cut(sizes, data.val_fraction)


def _learned(data: ml_collections.ConfigDict, docs: Documents, sizes: np.ndarray, chars: str,
             cut: tuple[int, int], log):
  """`data.tokenizer`'s builtin tokenizer for these documents: bpe learns its vocabulary from the
  training split, char takes the text's characters."""
  if data.tokenizer == "bpe":
    log(f"data: training a {data.vocab_size}-token BPE vocabulary on the training split "
        f"({fmt.nbytes(int(sizes[:cut[0]].sum()) + cut[1])})")
    read = []  # set once the text is read: the merges are being computed

    def texts():
      for text, _, train, _ in heldout.split(docs("BPE"), cut):
        signals.check()  # stopping (the main thread raised): no more text
        if not train:
          break
        if not isinstance(text, chat_format.Special):
          yield text
      read.append(True)

    said = []

    def waiting(seconds: float) -> None:  # every Ticker.FIRST_S; a line every Ticker.EVERY_S
      if read and (not said or seconds - said[-1] >= Ticker.EVERY_S):
        said.append(seconds)
        log(f"data: BPE: computing the merges, {fmt.duration(seconds)} so far")

    # In a thread of its own: a signal stops the run at once, not when the merges are done.
    return signals.interruptible(tokenizer_lib.train_bpe, texts(), data.vocab_size,
                                 waiting=waiting, every_s=Ticker.FIRST_S)
  if data.tokenizer == "char":
    return tokenizer_lib.CharTokenizer(chars)
  return tokenizer_lib.ByteTokenizer()


def _tokenize(files, data, entry: Entry, show_progress: bool, log, fixed=None) -> dict:
  """Writes the cache entry (the tokens, then the .json that marks them complete); its meta."""
  tok = fixed if fixed is not None else None if data.tokenizer in tokenizer_lib.BUILTIN else \
      tokenizer_lib.read_file(os.path.expanduser(data.tokenizer))  # one that does not load: now
  records = is_records(data) or is_chat(data)  # a loss mask beside the tokens
  docs, sizes, chars, cut = _survey(files, data, show_progress, log, "tokenizing",
                                    tok is None and data.tokenizer == "char")
  if tok is None:
    tok = _learned(data, docs, sizes, chars, cut, log)
  if is_chat(data):
    tok = chat_format.with_chat(tok)
  tmp, tmp_meta, tmp_mask = entry.tmp(entry.bin), entry.tmp(entry.meta), entry.tmp(entry.mask)
  try:
    entry.meta.unlink(missing_ok=True)  # a damaged entry's: only a complete new one may count
    with open(tmp, "wb") as out, \
        (open(tmp_mask, "wb") if records else contextlib.nullcontext()) as mask_out:
      writer = _Writer(tok, out, mask_out, chat_format.special_ids(tok) if is_chat(data) else None)
      for piece in heldout.split(docs("tokenizing"), cut):
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
      os.replace(tmp_mask, entry.mask)
    os.replace(tmp, entry.bin)
    meta = {"tokenizer": tok.to_json(), "dtype": np.dtype(tok.dtype).name,
            "n_tokens": writer.n_tokens, "n_train": writer.n_train,
            "fingerprint": writer.sha.hexdigest(), "n_files": len(files) - len(docs.binary),
            "n_bytes": int(sizes.sum()), "n_docs": int((sizes > 0).sum()),
            "notes": docs.notes() + tokenizer_lib.vocab_notes(tok),
            "source": describe(data.path), "masked": records}
    if isinstance(tok, tokenizer_lib.HFTokenizer):
      meta["tokenizer_json"] = tok.hf_json()
    entry.write_json(tmp_meta, meta)
    signals.check()  # a Ctrl-C that Python dropped while tokenizing: no trusted entry
    os.replace(tmp_meta, entry.meta)  # last: from now on the entry is trusted
  except OSError as e:
    raise entry.write_error(e, docs.total * np.dtype(tok.dtype).itemsize) from None
  finally:
    for leftover in (tmp, tmp_meta, tmp_mask):
      leftover.unlink(missing_ok=True)
  return meta


class _Writer:
  """Encodes pieces in batches, writes the tokens with end-of-text after each non-empty
  document, and counts what the training split holds; with `mask_out`, a byte per token too:
  1 where it counts in the loss (its piece's; end-of-text: that of the piece ending the document).
  `specials`: the ids of chat_format.Special pieces."""

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
    texts = [p[0] for p in self.pending if not isinstance(p[0], chat_format.Special)]
    encoded = iter(self.tok.encode_batch(texts) if texts else [])
    parts, masks = [], []
    for text, end, train, loss in self.pending:
      ids = np.array([self.specials[text]], self.tok.dtype) if isinstance(text, chat_format.Special) \
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
