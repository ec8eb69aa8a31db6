"""Token files: data that is token ids already, read in place (memmaps, never joined or copied).

Two formats (docs/data.md says when each is read): a flat array of uint16 ids with no header
(nanoGPT's `train.bin`/`val.bin`), and llm.c's shards (a header of 256 little-endian int32: [0]
the magic 20240520, [1] the version 1, [2] the number of ids; then that many uint16 ids of GPT-2's
vocabulary). `select` says whether `data.path` is token files; `prepare` picks what decodes them,
splits off validation (the files named so, else the last `data.val_fraction` of the ids) and
checks every id below the vocabulary's size once per file (`scan`, cached by the file's path,
size and modification time): the data's fingerprint is made of the files' hashes, so later
starts read no ids.
"""

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import threading
from pathlib import Path

import ml_collections
import numpy as np

from jaxtrain.data import meta_pkl
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.data.windows import Shards
from jaxtrain.system import fmt, machine, paths, signals
from jaxtrain.system.console import Ticker
from jaxtrain.system.errors import ConfigError, UserError

LLMC_MAGIC, LLMC_VERSION = 20240520, 1
HEADER_BYTES = 256 * 4
GPT2_VOCAB, GPT2_EOT = 50257, 50256  # what llm.c's version 1 (GPT-2's ids) implies
_OTHER_LLMC = {20240522: "an llm.c evaluation file (HellaSwag or MMLU examples), not training "
                         "tokens; leave it out of --config.data.path",
               20240801: "an llm.c Llama 3 shard (uint32 ids); only GPT-2 shards (version 1, "
                         "uint16 ids) are read"}
_BLOCK_BYTES = 32 << 20  # ids read, checked and hashed at a time, per file
_SCAN_VERSION = 1
_VAL_NAME = re.compile(r"(?:^|[^a-z0-9])(?:val|valid|validation)(?:[^a-z0-9]|$)")


@dataclasses.dataclass
class TokenFile:
  """A file of token ids: where they start, how many."""

  path: Path
  format: str  # uint16 | llmc
  offset: int  # bytes before the first id
  n_ids: int


def select(data: ml_collections.ConfigDict, files: list[Path]) -> tuple[list[Path], list[Path]] | None:
  """(token files, files left out) where `data.format` makes `files` token files; None for text."""
  form = data.format
  if form == "text":
    return None
  if form != "auto":
    return files, []
  bins = [f for f in files if f.suffix.lower() == ".bin"]
  nanogpt = {f.name for f in bins} == {"train.bin", "val.bin"}
  if not bins or (len(bins) < len(files) and not nanogpt):
    return None  # text, maybe with a binary file that happens to end in .bin
  return bins, [f for f in files if f.suffix.lower() != ".bin"]


def prepare(data: ml_collections.ConfigDict, files: list[Path], left_out: list[Path],
            vocab_size: int, show_progress: bool = True, log=print) -> dict:
  """The token files as corpus.Corpus's fields: their headers read, every id checked once (cached),
  the training files' ids then validation's. `vocab_size`: model.vocab_size (0: from the
  tokenizer), the vocabulary of flat files."""
  _refuse_records(data, files[0])
  found = _inspect_all(files, data.format)
  notes = []
  tok = _tokenizer(data, found, vocab_size, notes)
  scans = scan(found, Path(data.cache_dir or paths.cache_dir()) / "tokenfiles", show_progress,
                log)
  for f, (largest, _) in zip(found, scans):
    if largest >= tok.vocab_size:
      raise _id_error(f, largest, tok, data)
  train, val, rule = _split(found, data.val_fraction)
  n_train = sum(p.stop - p.start for p in train)
  sha = {id(f): h for f, (_, h) in zip(found, scans)}
  # What the ids are and which of them train: not where the files are, nor their names.
  key = [[split, p.file.format, p.start, p.stop, sha[id(p.file)]]
         for split, parts in (("train", train), ("val", val)) for p in parts]
  if left_out:
    notes.append(f"read the {len(files)} .bin file(s) as token ids and left out {len(left_out)} "
                 f"other file(s), e.g. {left_out[0].name} (--config.data.format=text reads text)")
  if isinstance(tok, tokenizer_lib.IdsTokenizer):
    gpt2 = "gpt2 (GPT-2's ids) or " if tok.vocab_size == GPT2_VOCAB else ""
    notes.append("no tokenizer: samples show token ids and there is no val_bpb "
                 f"(--config.data.tokenizer={gpt2}<the tokenizer.json of the ids> decodes them)")
  tokens = Shards([np.memmap(p.file.path, dtype="<u2", mode="r", offset=p.file.offset,
                             shape=(p.file.n_ids,))[p.start:p.stop] for p in [*train, *val]])
  kind = "llm.c shards" if found[0].format == "llmc" else "flat uint16 ids"
  vocab = "" if isinstance(tok, tokenizer_lib.IdsTokenizer) else f" ({tok.name})"
  about = (f"{len(found)} token file(s) ({kind}), {fmt.count(len(tokens))} ids, vocabulary "
           f"{tok.vocab_size}{vocab} -> train {fmt.count(n_train)}, val "
           f"{fmt.count(len(tokens) - n_train)} ({rule})")
  return dict(tokens=tokens, n_train=n_train, tokenizer=tok, n_files=len(found), about=about,
              fingerprint=hashlib.sha256(json.dumps(key).encode()).hexdigest(), notes=notes)


def _refuse_records(data: ml_collections.ConfigDict, example: Path) -> None:
  for field in ("prompt_field", "messages_field"):
    if data[field]:
      raise ConfigError(f"data.{field}", f"is set, but data.path holds token ids ({example.name}), "
                        "not records", f"pass --config.data.{field}= (empty) for token files, or "
                        "point data.path at .jsonl or .parquet records")
  # char over nanoGPT's character ids: meta.pkl beside them gives the characters.
  if data.tokenizer == "bpe" or (data.tokenizer == "char" and not (example.parent /
                                                                    meta_pkl.NAME).is_file()):
    raise ConfigError("data.tokenizer", f"{data.tokenizer} is learned from text, but data.path "
                      f"holds token ids ({example.name})", "pass the tokenizer.json the ids come "
                      "from, or leave data.tokenizer=byte (the default: ids without a tokenizer)")


def _inspect_all(files: list[Path], form: str) -> list[TokenFile]:
  found = [_inspect(f, form) for f in files]
  kinds = {f.format: f for f in found}
  if len(kinds) > 1:  # auto: some have llm.c's header and some do not
    flat, shard = kinds["uint16"], kinds["llmc"]
    raise UserError(f"{flat.path} has no llm.c header (it does not start with the magic number "
                    f"{LLMC_MAGIC}) but {shard.path} has one: the token files of data.path must "
                    "be of one format; leave the other kind out of --config.data.path")
  return found


def _inspect(path: Path, form: str) -> TokenFile:
  """The file's format and where its ids are; one line for a file that cannot be token ids."""
  try:
    size = path.stat().st_size
    with open(path, "rb") as f:
      head = f.read(HEADER_BYTES)
  except OSError as e:
    raise UserError(f"cannot read {path} ({e.strerror}); fix its permissions or leave it out of "
                    "--config.data.path") from None
  if size == 0:
    raise UserError(f"{path} is empty: a token file needs at least one id; remove it or leave it "
                    "out of --config.data.path")
  magic = int.from_bytes(head[:4], "little", signed=True) if len(head) >= 4 else None
  if form == "llmc" or (form == "auto" and (magic == LLMC_MAGIC or magic in _OTHER_LLMC)):
    return _llmc(path, head, size, magic)
  if size % 2:
    raise UserError(f"{path} holds {size} bytes, an odd number, so it is not uint16 token ids "
                    "(a flat .bin as nanoGPT writes); leave it out of --config.data.path, or pass "
                    "--config.data.format=text if it is text")
  return TokenFile(path, "uint16", 0, size // 2)


def _llmc(path: Path, head: bytes, size: int, magic: int | None) -> TokenFile:
  if magic in _OTHER_LLMC:
    raise UserError(f"{path} is {_OTHER_LLMC[magic]}")
  if magic != LLMC_MAGIC:
    raise UserError(f"{path} is not an llm.c shard: its first int32 is {magic}, not the magic "
                    f"number {LLMC_MAGIC}; leave it out of --config.data.path, or pass "
                    "--config.data.format=uint16 if it is a flat file of uint16 ids")
  if len(head) < HEADER_BYTES:
    raise UserError(f"{path} holds {size} bytes, less than llm.c's {HEADER_BYTES}-byte header: "
                    "a cut-off shard; write it again or leave it out of --config.data.path")
  version, n = (int(x) for x in np.frombuffer(head, "<i4")[1:3])
  if version != LLMC_VERSION:
    raise UserError(f"{path}: llm.c header version {version}; only version {LLMC_VERSION} "
                    "(GPT-2's uint16 ids) is read; leave it out of --config.data.path")
  if n == 0:
    raise UserError(f"{path} holds an llm.c header and no token ids; remove it or leave it out "
                    "of --config.data.path")
  if size != HEADER_BYTES + 2 * n:
    raise UserError(f"{path}: its llm.c header says {n} ids ({HEADER_BYTES + 2 * n} bytes with "
                    f"the header) but the file holds {size} bytes (cut off, or still being "
                    "written?); write it again or leave it out of --config.data.path")
  return TokenFile(path, "llmc", HEADER_BYTES, n)


def _tokenizer(data: ml_collections.ConfigDict, found: list[TokenFile], vocab_size: int,
               notes: list[str]):
  """What decodes the ids and how many there are: a tokenizer.json (or gpt2), else llm.c's GPT-2,
  else nanoGPT's meta.pkl beside flat files, else `model.vocab_size` (ids with no text)."""
  if data.tokenizer not in tokenizer_lib.BUILTIN:
    return tokenizer_lib.read_file(os.path.expanduser(data.tokenizer))
  if found[0].format == "llmc":
    return tokenizer_lib.IdsTokenizer(GPT2_VOCAB, GPT2_EOT)
  meta = found[0].path.parent / meta_pkl.NAME
  if meta.is_file():
    tok, note = meta_pkl.tokenizer(meta)
    notes.append(note)
    return tok
  if vocab_size:
    return tokenizer_lib.IdsTokenizer(vocab_size)
  raise ConfigError("model.vocab_size", f"is 0 (from the tokenizer), and flat token files "
                    f"({found[0].path.name}) do not say how many ids there are (nanoGPT's "
                    f"{meta_pkl.NAME} is not beside them)", "pass --config.data.tokenizer=gpt2 "
                    "for GPT-2's ids (nanoGPT's openwebtext), or --config.model.vocab_size=<above "
                    "every id>, or --config.data.tokenizer=<the ids' tokenizer.json>")


def _id_error(f: TokenFile, largest: int, tok, data: ml_collections.ConfigDict) -> UserError:
  problem = f"{f.path} holds token id {largest}, and the vocabulary has {tok.vocab_size} ids"
  tokenizer = "--config.data.tokenizer=<the tokenizer.json the ids come from>"
  if data.tokenizer not in tokenizer_lib.BUILTIN:
    return UserError(f"{problem} (data.tokenizer={data.tokenizer}): the ids are not its; pass "
                     f"{tokenizer}")
  if f.format == "llmc":
    return UserError(f"{problem} (GPT-2's, which llm.c's version 1 means): the ids are not "
                     f"GPT-2's; pass {tokenizer}")
  return UserError(f"{problem} (model.vocab_size): every id must be below it; pass "
                   f"--config.model.vocab_size={largest + 1} (or more), or {tokenizer}")


@dataclasses.dataclass
class _Part:
  file: TokenFile
  start: int  # ids of the file, [start, stop)
  stop: int


def _split(found: list[TokenFile], val_fraction: float) -> tuple[list[_Part], list[_Part], str]:
  """(training parts, validation parts, the rule that chose them, for the log)."""
  is_val = [bool(_VAL_NAME.search(f.path.stem.lower())) for f in found]
  if any(is_val):
    if all(is_val):
      raise UserError(f"every token file of data.path is named as validation (e.g. "
                      f"{found[0].path.name}), so none is left to train on; point "
                      "--config.data.path at the training files too")
    val = [_Part(f, 0, f.n_ids) for f, v in zip(found, is_val) if v]
    names = ", ".join(p.file.path.name for p in val[:2]) + (", ..." if len(val) > 2 else "")
    return [_Part(f, 0, f.n_ids) for f, v in zip(found, is_val) if not v], val, \
        f"validation: the files named so, {names}"
  total = sum(f.n_ids for f in found)
  n_train = min(total - 1, max(1, int(total - val_fraction * total)))
  train, val, at = [], [], 0
  for f in found:
    cut = min(max(n_train - at, 0), f.n_ids)
    if cut:
      train.append(_Part(f, 0, cut))
    if cut < f.n_ids:
      val.append(_Part(f, cut, f.n_ids))
    at += f.n_ids
  return train, val, f"validation: the last {val_fraction:g} of the ids"


def check_run(cfg: ml_collections.ConfigDict, tok) -> None:
  """What a run would ask of token ids without a tokenizer (text, bytes, document ends) is refused
  in one line before any work, not met at the end of the run."""
  fix = "pass --config.data.tokenizer=<the tokenizer.json the ids come from>"
  if cfg.model.doc_mask and tok.eot_id < 0:
    raise ConfigError("model.doc_mask", "needs the end-of-text id that ends each document, and "
                      "flat token files do not say which it is", f"{fix}, or "
                      "--config.model.doc_mask=False")
  if not isinstance(tok, tokenizer_lib.IdsTokenizer):
    return
  if cfg.train.eval_tasks:
    raise ConfigError("train.eval_tasks", "scores text, and this run's token ids have no "
                      "tokenizer", f"{fix}, or --config.train.eval_tasks= (empty)")
  if cfg.train.early_stop_patience and cfg.train.early_stop_metric == "val_bpb":
    raise ConfigError("train.early_stop_metric", "is val_bpb, and token ids without a tokenizer "
                      "stand for no known bytes", f"{fix}, or --config.train.early_stop_metric="
                      "val_loss")
  try:
    tok.encode(cfg.sample.prompt)
  except UserError:
    raise ConfigError("sample.prompt", f"{cfg.sample.prompt[:30]!r} is not token ids, and this "
                      "run has no tokenizer to encode text", "pass ids separated by spaces, e.g. "
                      f"--config.sample.prompt='464 2068', or {fix[5:]}") from None


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
