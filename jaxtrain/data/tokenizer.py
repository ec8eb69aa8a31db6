"""Tokenizers: bytes, characters, byte-level BPE (trained on the corpus), a tokenizer.json (or
GPT-2's, by name), or token ids as they are (`IdsTokenizer`: token files without a tokenizer.json).

Every tokenizer but nanoGPT's characters (meta.pkl's) and bare ids has an end-of-text token
(`eot_id`) that the token stream puts after each document; each writes itself as a Hugging Face
tokenizer.json (`hf_json`), so any tool can decode a model's output. Encoding never turns text
that spells "<|endoftext|>" into the end-of-text token.
"""

import hashlib
import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from jaxtrain.data import bpe_tiktoken
from jaxtrain.data.bpe_tiktoken import byte_chars
from jaxtrain.system.errors import ConfigError, UserError

EOT = "<|endoftext|>"
BUILTIN = ("byte", "char", "bpe")


class _EachText:
  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [self.encode(t) for t in texts]


class ByteTokenizer(_EachText):
  """UTF-8 bytes as tokens: vocab 256, works on any text, no fitting. Byte 255 never occurs in
  UTF-8, so its id is the end-of-text token."""

  name = "byte"
  vocab_size = 256
  dtype = np.uint8
  eot_id = 255

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

  def decode(self, ids) -> str:
    parts = bytes(np.asarray(ids, dtype=np.uint8).tolist()).split(b"\xff")
    return EOT.join(p.decode("utf-8", errors="replace") for p in parts)

  def token_bytes(self) -> np.ndarray:
    n = np.ones(256, np.int64)
    n[self.eot_id] = 0
    return n

  def to_json(self) -> dict:
    return {"name": self.name}

  def hf_json(self) -> str:
    return _hf_json({c: i for i, c in enumerate(byte_chars()[:255])}, "byte")


class CharTokenizer(_EachText):
  """One token per Unicode character of the corpus, ids in code point order; end-of-text last.
  `ordered`: the ids are the order of `chars` as given (nanoGPT's meta.pkl); `end_of_text`
  False: there is none (eot_id -1), as in nanoGPT's character data."""

  name = "char"

  def __init__(self, chars: str, end_of_text: bool = True, ordered: bool = False):
    self.chars = chars if ordered else "".join(sorted(set(chars)))
    self.eot_id = len(self.chars) if end_of_text else -1
    self.vocab_size = len(self.chars) + end_of_text
    cps = np.array([ord(ch) for ch in self.chars], dtype=np.uint32)
    self._ids = np.argsort(cps, kind="stable")  # ids by code point
    self._codepoints = cps[self._ids]
    self.dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32

  def encode(self, text: str) -> np.ndarray:
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # its code points
    at = np.minimum(np.searchsorted(self._codepoints, cps), max(len(self.chars) - 1, 0))
    unknown = self._codepoints[at] != cps if len(self.chars) else np.ones(len(cps), bool)
    if unknown.any():
      ch = chr(int(cps[np.argmax(unknown)]))
      raise UserError(f"character {ch!r} is not in this run's char vocabulary "
                      f"({len(self.chars)} characters); use only characters from the training text")
    return self._ids[at].astype(self.dtype) if len(self.chars) else at.astype(self.dtype)

  def decode(self, ids) -> str:
    n = len(self.chars)
    return "".join(self.chars[i] if i < n else EOT for i in np.asarray(ids).tolist())

  def token_bytes(self) -> np.ndarray:
    return np.array([len(c.encode()) for c in self.chars] + [0] * (self.eot_id >= 0), np.int64)

  def to_json(self) -> dict:
    return {"name": self.name, "chars": self.chars, **({} if self.eot_id >= 0 else
                                                       {"end_of_text": False})}

  def hf_json(self) -> str:
    return _hf_json({c: i for i, c in enumerate(self.chars)}, "char", self.eot_id >= 0)


LARGE_CHAR_VOCAB = 1024  # more characters than this: a note says what they cost


def vocab_notes(tok) -> list[str]:
  """A note for the log where a char vocabulary is large enough to weigh on a small model."""
  if not isinstance(tok, CharTokenizer) or tok.vocab_size <= LARGE_CHAR_VOCAB:
    return []
  return [f"the char tokenizer found {len(tok.chars):,} different characters: the embedding "
          "and the head (vocabulary x model.d_model each) then hold most of a small model's "
          "params; --config.data.tokenizer=byte (256 ids) or bpe keeps them small"]


def _hf_json(vocab: dict[str, int], kind: str, end_of_text: bool = True) -> str:
  """A tokenizer.json equivalent to the byte, char or ids tokenizer."""
  import tokenizers as t  # imported when used: a byte run never needs it
  if kind == "byte":
    tok = t.Tokenizer(t.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = t.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = t.decoders.ByteLevel()
  elif kind == "ids":
    tok = t.Tokenizer(t.models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = t.pre_tokenizers.WhitespaceSplit()
  else:
    tok = t.Tokenizer(t.models.WordLevel(vocab=vocab or {"\0": 0}, unk_token=None))
    tok.pre_tokenizer = t.pre_tokenizers.Split(t.Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = t.decoders.Fuse()
  if end_of_text:
    tok.add_special_tokens([t.AddedToken(EOT, special=True)])
  return tok.to_str()


class IdsTokenizer(_EachText):
  """Token ids with no text behind them (token files read without a tokenizer.json). Their text
  is the ids in decimal, each after a space, the end-of-text id (if known) as "<|endoftext|>";
  no id stands for any bytes of text, so bits per byte are unknown."""

  name = "ids"

  def __init__(self, vocab_size: int, eot_id: int = -1):
    self.vocab_size, self.eot_id = vocab_size, eot_id  # eot_id -1: the ids have none
    self.dtype = np.uint16 if vocab_size <= 2**16 else np.uint32

  def encode(self, text: str) -> np.ndarray:
    ids = []
    for word in text.split():
      i = self.eot_id if word == EOT else int(word) if word.isascii() and word.isdigit() else -1
      if not 0 <= i < self.vocab_size:
        raise UserError(f"{word[:20]!r} is not a token id of this run (0 .. {self.vocab_size - 1}): "
                        "it has no tokenizer, so its text is token ids separated by spaces, e.g. "
                        "'464 2068'")
      ids.append(i)
    return np.array(ids, self.dtype)

  def decode(self, ids) -> str:
    # A space before every id: pieces decoded apart (a stream, a prompt and its sample) join up.
    return "".join(f" {EOT}" if i == self.eot_id else f" {i}" for i in np.asarray(ids).tolist())

  def token_bytes(self) -> np.ndarray:
    return np.zeros(self.vocab_size, np.int64)

  def to_json(self) -> dict:
    return {"name": self.name, "vocab_size": self.vocab_size, "eot_id": self.eot_id}

  def hf_json(self) -> str:
    """A word-level tokenizer.json with the same text: "464 2068" <-> [464, 2068]."""
    vocab = {EOT if i == self.eot_id else str(i): i for i in range(self.vocab_size)}
    return _hf_json(vocab, "ids", self.eot_id >= 0)


def _own(d: dict, chars_without_end: bool):
  """The IdsTokenizer, or (where `chars_without_end`) the CharTokenizer without end-of-text, whose
  `hf_json()` is `d` (HFTokenizer would add an end-of-text to that one); else None."""
  model, pre = d.get("model") or {}, d.get("pre_tokenizer") or {}
  vocab = model.get("vocab")
  if model.get("type") != "WordLevel" or not isinstance(vocab, dict):
    return None
  if pre == {"type": "WhitespaceSplit"}:
    eot = vocab.get(EOT, -1)
    if all(vocab.get(str(i)) == i for i in range(len(vocab)) if i != eot):
      return IdsTokenizer(len(vocab), eot)
  elif chars_without_end and pre.get("type") == "Split" and not d.get("added_tokens") \
      and sorted(vocab.values()) == list(range(len(vocab))) and all(len(c) == 1 for c in vocab):
    return CharTokenizer("".join(sorted(vocab, key=vocab.get)), end_of_text=False, ordered=True)
  return None


def from_text(text: str, chars_without_end: bool = True):
  """The tokenizer of a tokenizer.json's text: `_own`'s, else an HFTokenizer (which gives it an
  end-of-text token, which a document needs)."""
  try:
    own = _own(json.loads(text), chars_without_end)
  except (ValueError, AttributeError):
    own = None  # not JSON (HFTokenizer says so) or not a JSON object
  return own or HFTokenizer(text)


class HFTokenizer:
  """A `tokenizers.Tokenizer`: one trained here (`bpe`) or read from a tokenizer.json."""

  def __init__(self, hf_json: str, name: str = "tokenizer.json"):
    import tokenizers as t
    self.name, self._json = name, hf_json
    try:
      self.tok = t.Tokenizer.from_str(hf_json)
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
      raise ValueError(" ".join(str(e).split())[:200]) from None
    eot = self.tok.token_to_id(EOT)
    if eot is None:  # e.g. a vocabulary with another end marker: add GPT-2's
      self.tok.add_special_tokens([t.AddedToken(EOT, special=True)])
      self._json = self.tok.to_str()
      eot = self.tok.token_to_id(EOT)
    self.eot_id = eot
    self.specials = {a.content: i for i, a in self.tok.get_added_tokens_decoder().items() if a.special}
    self.tok.encode_special_tokens = True  # text that spells "<|endoftext|>" stays text
    self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
    self.dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32
    self._fast = None  # tiktoken's encoder of this vocabulary, built on first use, or False

  def encode(self, text: str) -> np.ndarray:
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    if self._fast is None:
      self._fast = bpe_tiktoken.encoder(self._json, self._slow_ids) or False
    if self._fast:
      ids = bpe_tiktoken.on_all_cores(self._fast.encode_ordinary, texts)
    else:  # on all cores too
      try:
        ids = [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]
      except Exception:  # a word-level (char) vocabulary meets a character it lacks
        ch = next((c for t in texts for c in t if self.tok.token_to_id(c) is None), "?")
        raise UserError(f"character {ch!r} is not in this run's vocabulary ({self.vocab_size} "
                        "tokens); use only characters from the training text") from None
    lengths = [len(i) for i in ids]
    flat = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, count=sum(lengths))
    return np.split(flat, np.cumsum(lengths)[:-1])

  def _slow_ids(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    return self.tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

  def token_bytes(self) -> np.ndarray:
    """UTF-8 bytes of text each token stands for (0 for special tokens such as end-of-text)."""
    n = np.zeros(self.vocab_size, np.int64)
    byte_level = "ByteLevel" in json.dumps(json.loads(self._json).get("decoder"))
    for piece, i in self.tok.get_vocab(with_added_tokens=True).items():
      if piece in self.specials or i >= self.vocab_size:
        continue
      n[i] = len(piece) if byte_level else len(self.tok.decode([i]).encode())
    return n

  def to_json(self) -> dict:
    """What identifies it (a resume compares these): its kind, size and content hash."""
    return {"name": self.name, "vocab_size": self.vocab_size,
            "sha256": hashlib.sha256(self._json.encode()).hexdigest()}

  def hf_json(self) -> str:
    return self._json


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
  """Byte-level BPE (GPT-2's pre-tokenizer) with `vocab_size` tokens, end-of-text first."""
  import tokenizers as t
  tok = t.Tokenizer(t.models.BPE())
  tok.pre_tokenizer = t.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = t.decoders.ByteLevel()
  trainer = t.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=t.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer)
  return HFTokenizer(tok.to_str(), name="bpe")


NAMED = ("gpt2",)  # data.tokenizer names a tokenizer to fetch rather than learn or read


def read_file(path: str) -> HFTokenizer:
  """The tokenizer.json at `path` (or GPT-2's, for "gpt2"); a one-line UserError if it does not
  load."""
  if path == "gpt2":
    return HFTokenizer(bpe_tiktoken.gpt2_json(), name="gpt2")
  try:
    return from_text(Path(path).read_text(encoding="utf-8"), chars_without_end=False)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    why = getattr(e, "strerror", None) or str(e)
    raise ConfigError("data.tokenizer", f"{path} is not a tokenizer.json that loads ({why})",
                      "pass byte, char, bpe or the path of a Hugging Face tokenizer.json") from None


def model_vocab_size(want: int, tok) -> int:
  """`model.vocab_size`, where 0 takes the tokenizer's."""
  if want == 0:
    return tok.vocab_size
  if want < tok.vocab_size:
    raise ConfigError("model.vocab_size", f"{want} is smaller than the {tok.name} tokenizer's "
                      f"{tok.vocab_size} tokens", "pass --config.model.vocab_size=0 (automatic)")
  return want


BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>", "[BOS]")


def bos_id(tokenizer) -> int | None:
  """The id of a beginning-of-sequence token where the tokenizer has one (a tokenizer.json that
  defines e.g. `<s>` as a special token); jaxtrain's own byte, char and BPE tokenizers have none."""
  special = tokenizer.specials if isinstance(tokenizer, HFTokenizer) else {}
  return next((special[name] for name in BOS_NAMES if name in special), None)


def newline_id(tokenizer) -> int | None:
  """The id of "\n", if the vocabulary has it as one token (a char vocabulary may not)."""
  try:
    ids = tokenizer.encode("\n")
  except UserError:
    return None
  return int(ids[0]) if len(ids) == 1 else None


def from_json(d: dict):
  """A byte or char tokenizer from its `to_json()`."""
  if d["name"] == "byte":
    return ByteTokenizer()
  return CharTokenizer(d["chars"], d.get("end_of_text", True), ordered=True)


def from_cache(meta: dict):
  """The tokenizer a token cache entry was written with (its .json)."""
  if meta["tokenizer"]["name"] in ("byte", "char"):
    return from_json(meta["tokenizer"])
  return HFTokenizer(meta["tokenizer_json"], name=meta["tokenizer"]["name"])


def save(tokenizer, path: str) -> None:
  Path(path).write_text(tokenizer.hf_json(), encoding="utf-8")


def load(path: str):
  """A workdir's tokenizer.json (that of a run from before tokenizer.json files: its own kind)."""
  text = Path(path).read_text(encoding="utf-8")
  d = json.loads(text)
  return from_text(text) if "model" in d else from_json(d)  # else the older {"name": ...} file
