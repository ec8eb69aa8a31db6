"""nanoGPT's meta.pkl, beside its train.bin and val.bin: read as data, never run.

nanoGPT's prepare.py for character data pickles {"vocab_size": 65, "itos": {0: "\\n", ...},
"stoi": {...}}. Unpickling runs whatever a pickle names, so this reader admits plain data only:
dicts, lists, tuples, strings, bytes, numbers, booleans and None. A pickle that names any class or
function is refused before anything in it runs. From it a run takes its vocabulary size and, where
`itos` gives ids 0..n-1 each one character, those characters, so samples, prompts and val_bpb are
the text's, as nanoGPT's sample.py shows them.
"""

import io
import pickle
from pathlib import Path

from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system.errors import UserError

NAME = "meta.pkl"
MAX_BYTES = 64 << 20  # a vocabulary's worth; a larger file is not nanoGPT's meta.pkl


class _PlainData(pickle.Unpickler):
  """Builds dicts, lists, tuples, strings, bytes and numbers; refuses every class and function."""

  def find_class(self, module: str, name: str):
    raise pickle.UnpicklingError(f"it names {module}.{name}")

  def persistent_load(self, pid):
    raise pickle.UnpicklingError("it refers to objects outside the file")


def read(path: Path) -> dict:
  """The dict in `path`, read without running anything; one line where it is not plain data."""
  fix = ("pass --config.model.vocab_size=<above every id> (and --config.data.tokenizer=<the ids' "
         f"tokenizer.json> for text), or move {path.name} out of the directory")
  try:
    if path.stat().st_size > MAX_BYTES:
      raise UserError(f"{path} is larger than nanoGPT's meta.pkl ever is; {fix}")
    meta = _PlainData(io.BytesIO(path.read_bytes())).load()
  except OSError as e:
    raise UserError(f"cannot read {path} ({e.strerror}); {fix}") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
          AttributeError, MemoryError) as e:
    why = " ".join(str(e).split())[:120] or type(e).__name__
    raise UserError(f"{path} is not plain data ({why}); jaxtrain reads meta.pkl without running "
                    f"it, so it reads only dicts, lists, strings and numbers; {fix}") from None
  if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int) \
      or isinstance(meta.get("vocab_size"), bool) or meta["vocab_size"] < 1:
    raise UserError(f"{path} has no vocab_size (a positive int), as nanoGPT's prepare.py writes "
                    f"it; {fix}")
  return meta


def _chars(meta: dict) -> str | None:
  """`itos`'s characters in id order, where it maps each of 0..vocab_size-1 to one."""
  itos = meta.get("itos")
  if isinstance(itos, list | tuple):
    itos = dict(enumerate(itos))
  if not isinstance(itos, dict) or len(itos) != meta["vocab_size"] \
      or sorted(k for k in itos if isinstance(k, int)) != list(range(len(itos))):
    return None
  chars = [itos[i] for i in range(len(itos))]
  if not all(isinstance(c, str) and len(c) == 1 for c in chars) or len(set(chars)) != len(chars):
    return None
  return "".join(chars)


def tokenizer(path: Path) -> tuple[object, str]:
  """(the tokenizer meta.pkl gives the ids, a note for the log)."""
  meta = read(path)
  n = meta["vocab_size"]
  chars = _chars(meta)
  if chars is None:
    return tokenizer_lib.IdsTokenizer(n), (f"{path}: vocabulary {n}, with no characters (itos) to "
                                           "decode the ids: samples show ids")
  tok = tokenizer_lib.CharTokenizer(chars, end_of_text=False, ordered=True)
  return tok, (f"{path}: vocabulary {n}, whose characters (itos) decode the ids, so samples and "
               "prompts are text")
