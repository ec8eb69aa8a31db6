"""Documents from `data.path`: text files, .jsonl and .parquet files, directories and globs.

A text file is one document; a .jsonl line or a .parquet row is one, its text in the field or
column `data.text_field`, or, for prompt/completion records, the prompt then the completion
(`data.prompt_field`, `data.completion_field`), or, for chat records, the messages in the chat
format (`data.messages_field`, data/chat_format.py). `Documents` streams them as pieces (text or a chat
special token, whether a document ends there, whether its tokens count in the loss: a prompt's do
not) without ever holding a whole file, with a progress bar in MB/s of the files read. pyarrow
parses .jsonl and .parquet in blocks on all cores. Bad input is one line naming the file (and
the line) and what to do. Where the stream splits into training and validation: heldout.py.
"""

import codecs
import glob
import os
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import ml_collections

from jaxtrain.data import chat_format
from jaxtrain.data.records import json_lines
from jaxtrain.system.console import Ticker
from jaxtrain.system.errors import UserError

CHUNK_BYTES = 8 << 20  # read from text files at a time
# A text file (of NOT_UTF8_MIN_BYTES or more) with this share of its bytes not UTF-8 (Latin-1
# text, say) gets a warning with the fix; fewer (a stray byte, or the few encoding tests among the
# standard library's files) only a note. Training goes on either way, on U+FFFD where they were.
NOT_UTF8_WARN, NOT_UTF8_MIN_BYTES = 0.01, 4096
# A dropped BOM and CR line ends are said where their files hold this share of the bytes or more
# (not for the standard library's few test files that have them).
NOTED_SHARE = 0.01
PIECE_CHARS = 1 << 18  # text files are cut into pieces about this long, at line ends
_BLOCK_BYTES = 16 << 20  # .jsonl bytes parsed at a time
_PARQUET_ROWS = 8192


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


class _Counter:
  """A codec error handler that replaces undecodable bytes with U+FFFD and counts them."""

  def __init__(self):
    self.count = 0
    self.name = f"jaxtrain_count_{id(self)}"
    codecs.register_error(self.name, self._handle)

  def _handle(self, err: UnicodeDecodeError):
    self.count += err.end - err.start
    return "\ufffd", err.end


class _Binary(Exception):
  pass


class Documents:
  """Each usable file's documents as pieces, once per call; binary text files are skipped (or
  fatal when they are all there is)."""

  def __init__(self, files: list[Path], data: ml_collections.ConfigDict, show_progress: bool,
               log: Callable[[str], None] | None = None):
    # Without a bar, `log` gets progress lines (system/console.py's Ticker).
    self.files, self.show_progress, self.log = files, show_progress, log
    # Prompt/completion records: the prompt's pieces are out of the loss, the completion's in.
    self.fields = (data.prompt_field, data.completion_field) if data.prompt_field else \
        (data.messages_field,) if data.messages_field else (data.text_field,)
    self.chat = bool(data.messages_field)
    self.flag = "--config.data.messages_field" if self.chat else "--config.data.text_field" \
        if len(self.fields) == 1 else "--config.data.prompt_field/completion_field"
    self.total = sum(f.stat().st_size for f in files)
    self.counter = _Counter()
    self.not_utf8: dict[Path, int] = {}  # bytes replaced with U+FFFD, by file (text files)
    self.binary: list[Path] = []
    self.bom, self.cr = [], []  # text files that began with a UTF-8 BOM; that hold CR (\r) bytes
    self.misread = False  # this pass yielded part of a file that then turned out binary

  def __call__(self, desc: str) -> Iterator[tuple[str, bool, bool]]:
    """(text, ends_document, in_loss) pieces in order; the bar shows the bytes of the files read."""
    from tqdm import tqdm  # the terminal bar: tqdm.auto would want ipywidgets in notebooks

    self.counter.count, self.misread, self.not_utf8, self.bom, self.cr = 0, False, {}, [], []
    with tqdm(total=self.total, unit="B", unit_scale=True, desc=desc,
              disable=not self.show_progress, leave=False) as tqdm_bar:
      bar = tqdm_bar if self.show_progress or self.log is None else \
          Ticker(self.log, f"data: {desc}", self.total)
      for f in self.files:
        if f in self.binary:
          continue
        suffix = f.suffix.lower()
        try:
          if suffix in (".jsonl", ".ndjson"):
            yield from self._pieces(self._jsonl(f, bar))
          elif suffix == ".parquet":
            yield from self._pieces(self._parquet(f, bar))
          elif len(self.fields) == 2 or self.chat:
            what = "chat records (data.messages_field)" if self.chat else \
                "prompt/completion records (data.prompt_field, data.completion_field)"
            raise UserError(f"{f} is a text file; {what} come from .jsonl or .parquet files only")
          else:
            before = self.counter.count
            yield from ((text, end, True) for text, end in self._text(f, bar))
            if self.counter.count > before:
              self.not_utf8[f] = self.counter.count - before
        except _Binary as e:
          self.misread |= e.args[1]
          if len(self.files) == 1:
            raise UserError(f"{f} looks binary (it has NUL bytes), not text; point "
                            "--config.data.path at UTF-8 text, .jsonl or .parquet") from None
          self.binary.append(f)
        except OSError as e:
          raise UserError(f"cannot read {f} ({e.strerror}); fix its permissions or leave it "
                          "out of --config.data.path") from None

  def _pieces(self, records: Iterator[tuple]) -> Iterator[tuple[str, bool, bool]]:
    for record in records:
      if self.chat:
        yield from chat_format.pieces(record[0])
        continue
      if len(record) == 2:
        yield record[0], False, False
      yield record[-1], True, True

  def _text(self, path: Path, bar) -> Iterator[tuple[str, bool]]:
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors=self.counter.name)  # no BOM
    carry, yielded = "", False
    with open(path, "rb") as f:
      while chunk := f.read(CHUNK_BYTES):
        if b"\0" in chunk:
          raise _Binary(path, yielded)
        if not yielded and not carry and chunk.startswith(codecs.BOM_UTF8):
          self.bom.append(path)
        if b"\r" in chunk and path not in self.cr:
          self.cr.append(path)
        bar.update(len(chunk))
        text = carry + decoder.decode(chunk)
        start = 0
        while len(text) - start > PIECE_CHARS:  # pieces end after a newline where there is one
          cut = text.rfind("\n", start, start + PIECE_CHARS) + 1 or start + PIECE_CHARS
          yield text[start:cut], False
          start, yielded = cut, True
        carry = text[start:]
    yield carry + decoder.decode(b"", final=True), True

  def _jsonl(self, path: Path, bar) -> Iterator[tuple]:
    import pyarrow as pa

    done, block = 0, _BLOCK_BYTES
    while True:  # again with larger blocks when a record is longer than a block
      try:
        for i, record in enumerate(self._jsonl_records(path, bar, block)):
          if i >= done:
            done += 1
            yield record
        return
      except pa.ArrowInvalid as e:
        if "straddl" in str(e) and block < 2**30:
          block *= 8
          continue
        self._check_jsonl(path, str(e))
        return  # the file holds no records

  def _jsonl_records(self, path: Path, bar, block: int) -> Iterator[tuple]:
    import pyarrow as pa
    import pyarrow.json as pj
    from tqdm.utils import CallbackIOWrapper

    kind = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])) if self.chat \
        else pa.string()
    schema = pa.schema([(field, kind) for field in self.fields])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    with open(path, "rb") as raw:
      counted = CallbackIOWrapper(bar.update, raw)  # the bar's progress: the bytes pyarrow reads
      reader = pj.open_json(counted, read_options=pj.ReadOptions(block_size=block),
                            parse_options=options)
      for batch in reader:
        if any(batch.column(i).null_count for i in range(len(self.fields))):
          raise pa.ArrowInvalid("a null")
        records = list(zip(*(batch.column(i).to_pylist() for i in range(len(self.fields)))))
        if self.chat and any(chat_format.problem(r[0]) for r in records):
          raise pa.ArrowInvalid("a bad chat")  # the line is found by reading the file again
        yield from records

  def _parquet(self, path: Path, bar) -> Iterator[tuple]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
      f = pq.ParquetFile(path)
    except pa.ArrowException as e:
      raise UserError(f"{path} is not a parquet file that reads ({_short(e)}); fix or remove it "
                      "from --config.data.path") from None
    names, flag = f.schema_arrow.names, self.flag
    for field in self.fields:
      if field not in names:
        raise UserError(f"{path} has no column {field!r} (its columns: {', '.join(names)}); "
                        f"pass {flag}=<the column with the {'messages' if self.chat else 'text'}>")
      t = f.schema_arrow.field(field).type
      fits = (pa.types.is_list(t) or pa.types.is_large_list(t)) if self.chat else \
          (pa.types.is_string(t) or pa.types.is_large_string(t))
      if not fits:
        raise UserError(f"{path}: column {field!r} holds {t}, not "
                        f"{'lists of messages' if self.chat else 'text'}; pass {flag}=<a column "
                        f"of {'{role, content} lists' if self.chat else 'strings'}>")
    rows, size, done, row = max(f.metadata.num_rows, 1), path.stat().st_size, 0, 0
    for batch in f.iter_batches(batch_size=_PARQUET_ROWS, columns=list(self.fields)):
      for record in zip(*(batch.column(i).to_pylist() for i in range(len(self.fields)))):
        row += 1
        if self.chat and record[0] is not None and (why := chat_format.problem(record[0])):
          raise UserError(f"{path} row {row}: {self.fields[0]!r} {why}; fix that row or leave "
                          "the file out of --config.data.path")
        if None not in record:  # a null cell is no document
          yield record
      step = size * batch.num_rows // rows
      bar.update(step)
      done += step
    bar.update(size - done)

  def _check_jsonl(self, path: Path, arrow_message: str) -> None:
    """Raises a UserError naming the first line of `path` that is wrong, found by reading it again
    line by line (only when pyarrow has refused it); returns for a file of blank lines."""
    fix = "fix that line or leave the file out of --config.data.path"
    records = 0
    with open(path, encoding="utf-8", errors="replace") as f:
      for number, record in json_lines(f, path, fix):
        records += 1
        for field in self.fields:
          if field not in record:
            raise UserError(f"{path} line {number} has no field {field!r} (it has: "
                            f"{', '.join(record) or 'no fields'}); pass {self.flag}"
                            f"=<the field with the {'messages' if self.chat else 'text'}>")
          if self.chat and (why := chat_format.problem(record[field])):
            raise UserError(f"{path} line {number}: {field!r} {why}; {fix}")
          if not self.chat and not isinstance(record[field], str):
            raise UserError(f"{path} line {number}: field {field!r} is "
                            f"{type(record[field]).__name__}, not text; pass "
                            f"{self.flag}=<a field of strings>")
    if records:
      raise UserError(f"{path} does not read as JSON lines ({_short(arrow_message)}); {fix}")

  def notes(self) -> list[str]:
    notes = []
    if self.binary:
      ids = next((f for f in self.binary if f.suffix.lower() == ".bin"), None)
      notes.append(f"skipped {len(self.binary)} binary file(s), e.g. {ids or self.binary[0]}"
                   + (" (token ids? point --config.data.path at the .bin files alone, or pass "
                      "--config.data.format=uint16 or llmc)" if ids else ""))
    if self.counter.count:
      notes.append(f"replaced {self.counter.count} byte(s) that are not UTF-8 with U+FFFD")
    share = lambda files: sum(f.stat().st_size for f in files) / max(self.total, 1)  # noqa: E731
    noted = lambda files: files and share(files) >= NOTED_SHARE  # noqa: E731
    if noted(self.bom):
      notes.append(f"dropped the UTF-8 byte-order mark (BOM) that began {len(self.bom)} file(s), "
                   f"e.g. {self.bom[0]}")
    if noted(self.cr):
      notes.append(f"{len(self.cr)} file(s) have CR line ends (\\r\\n or \\r), e.g. {self.cr[0]}: "
                   "the model learns each \\r as a character of the text; to leave them out, "
                   f"convert the files first: sed -i 's/\\r$//' {self.cr[0]}")
    sizes = {f: f.stat().st_size for f in self.not_utf8}
    wrong = [f for f, n in self.not_utf8.items() if sizes[f] >= NOT_UTF8_MIN_BYTES
             and n >= NOT_UTF8_WARN * sizes[f]]
    for f in wrong[:3]:
      n, size = self.not_utf8[f], sizes[f]
      notes.append(f"warning: {n / size:.1%} of the bytes of {f} ({n:,} of {size:,}) are not "
                   "UTF-8 and became U+FFFD, so the model learns that instead of its letters; "
                   f"if it is Latin-1, convert it first: iconv -f latin1 -t utf-8 {f} > "
                   f"{f.with_name(f.stem + '.utf8' + f.suffix)}")
    if len(wrong) > 3:
      notes.append(f"warning: {len(wrong) - 3} more file(s) are not UTF-8 either, e.g. {wrong[3]}")
    return notes


def _short(e: Exception) -> str:
  return " ".join(str(e).split())[:160]
