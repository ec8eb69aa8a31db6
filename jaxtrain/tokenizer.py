"""Byte and character tokenizers. Both are lossless on the text they were built from."""

import json

import numpy as np

from jaxtrain.errors import UserError


class ByteTokenizer:
  """UTF-8 bytes as tokens: vocab 256, works on any text, no fitting."""

  name = "byte"
  vocab_size = 256
  dtype = np.uint8

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

  def decode(self, ids) -> str:
    return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")

  def to_json(self) -> dict:
    return {"name": self.name}


class CharTokenizer:
  """One token per Unicode character of the corpus, ids in code point order."""

  name = "char"

  def __init__(self, chars: str):
    self.chars = "".join(sorted(set(chars)))
    self.vocab_size = len(self.chars)
    self._codepoints = np.array([ord(ch) for ch in self.chars], dtype=np.uint32)
    self.dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32

  @staticmethod
  def codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)

  def encode(self, text: str) -> np.ndarray:
    cps = self.codepoints(text)
    ids = np.searchsorted(self._codepoints, cps)
    ids = np.minimum(ids, self.vocab_size - 1)
    unknown = self._codepoints[ids] != cps
    if unknown.any():
      ch = chr(int(cps[np.argmax(unknown)]))
      raise UserError(f"character {ch!r} is not in this run's char vocabulary "
                      f"({self.vocab_size} characters); use only characters from the training text")
    return ids.astype(self.dtype)

  def decode(self, ids) -> str:
    return "".join(self.chars[i] for i in np.asarray(ids).tolist())

  def to_json(self) -> dict:
    return {"name": self.name, "chars": self.chars}


def newline_id(tokenizer) -> int | None:
  """The id of "\n", if the vocabulary has one (a char vocabulary may not)."""
  if isinstance(tokenizer, CharTokenizer):
    return tokenizer.chars.index("\n") if "\n" in tokenizer.chars else None
  return int(tokenizer.encode("\n")[0])


def from_json(d: dict):
  if d["name"] == "byte":
    return ByteTokenizer()
  return CharTokenizer(d["chars"])


def save(tokenizer, path: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(tokenizer.to_json(), f, ensure_ascii=False)


def load(path: str):
  with open(path, encoding="utf-8") as f:
    return from_json(json.load(f))
