"""TensorBoard event files, written and read with the standard library alone: no TensorFlow, and
no tensorboardX (it imports torch where torch is installed, which slows every run's start).

An event file is a TFRecord file of `Event` protocol buffers (TensorBoard's `event.proto`,
`summary.proto`, and its hparams and text plugins' protos). Only the fields jaxtrain writes are
encoded; reading decodes an event's step, whether it is the file-version event, and its tags.
"""

import os
import socket
import struct
import time
from pathlib import Path

FILE_PREFIX = "events.out.tfevents."
HPARAMS_TAGS = ("_hparams_/experiment", "_hparams_/session_start_info",
                "_hparams_/session_end_info")
# hparams' api.proto DataType values, and SessionEndInfo's Status.STATUS_SUCCESS
DATA_STRING, DATA_BOOL, DATA_FLOAT64 = 1, 2, 3
STATUS_SUCCESS = 1
DT_STRING = 7  # TensorProto.dtype of a text summary


# ---- protocol buffers' wire format, only what events need -----------------------------------

def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _bytes(field: int, data: bytes) -> bytes:  # wire type 2: length-delimited
  return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
  return _bytes(field, text.encode("utf-8"))


def _int(field: int, n: int) -> bytes:  # wire type 0 (also enums and bools)
  return _varint(field << 3) + _varint(n)


def _double(field: int, x: float) -> bytes:  # wire type 1
  return _varint(field << 3 | 1) + struct.pack("<d", x)


def _float(field: int, x: float) -> bytes:  # wire type 5
  return _varint(field << 3 | 5) + struct.pack("<f", x)


def _fields(data: bytes):
  """(field number, wire type, value) of each field of a message: an int for varints, bytes
  for the rest."""
  i = 0
  while i < len(data):
    key, i = _read_varint(data, i)
    field, kind = key >> 3, key & 7
    if kind == 0:
      value, i = _read_varint(data, i)
    elif kind == 2:
      n, i = _read_varint(data, i)
      value, i = data[i:i + n], i + n
    elif kind in (1, 5):
      n = 8 if kind == 1 else 4
      value, i = data[i:i + n], i + n
    else:
      raise ValueError(f"unsupported protocol buffer wire type {kind}")
    yield field, kind, value


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
  n = shift = 0
  while True:
    byte = data[i]
    n |= (byte & 0x7F) << shift
    i, shift = i + 1, shift + 7
    if not byte & 0x80:
      return n, i


# ---- summaries and events ------------------------------------------------------------------

def _plugin(name: str, content: bytes = b"") -> bytes:
  """A SummaryMetadata naming its plugin (field 9 of Summary.Value)."""
  return _bytes(9, _bytes(1, _str(1, name) + (_bytes(2, content) if content else b"")))


def scalar(tag: str, value: float) -> bytes:
  """A Summary holding one scalar."""
  return _bytes(1, _str(1, tag) + _float(2, value))


def text(tag: str, value: str) -> bytes:
  """A Summary holding one text (TensorBoard's text plugin: a string tensor of shape [1])."""
  tensor = _int(1, DT_STRING) + _bytes(2, _bytes(2, _int(1, 1))) + _bytes(8, value.encode("utf-8"))
  return _bytes(1, _str(1, f"{tag}/text_summary") + _plugin("text") + _bytes(8, tensor))


def _hparam_value(value) -> tuple[bytes, int]:
  """A google.protobuf.Value of an hparam, and its hparams DataType."""
  if isinstance(value, bool):
    return _int(4, int(value)), DATA_BOOL
  if isinstance(value, int | float):
    return _double(2, float(value)), DATA_FLOAT64
  return _str(3, str(value)), DATA_STRING


def hparams(values: dict, metrics: list[str]) -> list[bytes]:
  """The hparams plugin's three Summaries (the experiment: each hparam's name and type and the
  metrics' tags; the session's start: the values; its end), as TensorBoard's HParams tab reads
  them."""
  infos, start = b"", b""
  for name, value in values.items():
    encoded, kind = _hparam_value(value)
    infos += _bytes(4, _str(1, name) + _int(4, kind))
    start += _bytes(1, _str(1, name) + _bytes(2, encoded))
  infos += b"".join(_bytes(5, _bytes(1, _str(2, tag))) for tag in metrics)
  contents = (_bytes(2, infos), _bytes(3, start), _bytes(4, _int(1, STATUS_SUCCESS)))
  return [_bytes(1, _str(1, tag) + _plugin("hparams", content))
          for tag, content in zip(HPARAMS_TAGS, contents, strict=True)]


def event(step: int, summary: bytes = b"", wall_time: float | None = None,
          file_version: str = "") -> bytes:
  """An Event: at `step`, holding `summary` (a Summary's fields) or a file version."""
  body = _double(1, time.time() if wall_time is None else wall_time) + \
      (_int(2, step) if step else b"")  # proto3 leaves a 0 out
  return body + (_str(3, file_version) if file_version else b"") + \
      (_bytes(5, summary) if summary else b"")


def parse(record: bytes) -> tuple[int, bool, list[str]]:
  """(step, whether it is the file-version event, its summaries' tags) of an Event."""
  step, version, tags = 0, False, []
  for field, _, value in _fields(record):
    if field == 2:
      step = value
    elif field == 3:
      version = True
    elif field == 5:
      tags += [v.decode("utf-8", "replace") for f, _, val in _fields(value) if f == 1
               for g, _, v in _fields(val) if g == 1]
  return step, version, tags


# ---- TFRecord files ------------------------------------------------------------------------

def _crc32c_table() -> list[int]:
  table = []
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
  return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC-32C (Castagnoli), rotated and offset."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path) -> list[bytes]:
  """The records of a TFRecord file; a last record that a kill cut short is left out."""
  data, records, i = path.read_bytes(), [], 0
  while i + 12 <= len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    if i + 12 + n + 4 > len(data):
      break
    records.append(data[i + 12:i + 12 + n])
    i += 12 + n + 4
  return records


class EventWriter:
  """A new event file in `logdir`, named as TensorBoard expects (`suffix` keeps two files
  started in the same second apart); written through a buffer, flushed at `flush()` and at
  most `flush_secs` after an event."""

  def __init__(self, logdir: Path, suffix: str = "", flush_secs: float = 10.0):
    self.path = Path(logdir) / f"{FILE_PREFIX}{int(time.time())}.{socket.gethostname()}{suffix}"
    self.flush_secs = flush_secs
    self._file = open(self.path, "wb")  # noqa: SIM115  (open until close())
    self._flushed = time.monotonic()
    self.write(event(0, file_version="brain.Event:2"))
    self.flush()

  def write(self, record: bytes) -> None:
    """An Event's bytes, as one TFRecord: 8-byte length, its checksum, the bytes, their checksum."""
    length = struct.pack("<Q", len(record))
    self._file.write(length + struct.pack("<I", masked_crc32c(length)) + record +
                     struct.pack("<I", masked_crc32c(record)))
    if time.monotonic() - self._flushed > self.flush_secs:
      self.flush()

  def flush(self) -> None:
    self._file.flush()
    os.fsync(self._file.fileno())
    self._flushed = time.monotonic()

  def close(self) -> None:
    self.flush()
    self._file.close()
