"""Byte-level BPE between `tokenizers` and `tiktoken`, both ways.

`encoder`: tiktoken's encoder of a `tokenizers` byte-level BPE with GPT-2's pre-tokenizer (what
`bpe` trains, and GPT-2's own file): the same ids, faster. `gpt2_json`: GPT-2's tokenizer (50257
ids, as nanoGPT's openwebtext and llm.c's shards hold them) as a tokenizer.json, made from the copy
tiktoken fetches once and keeps in its cache; without it and without network, one line says how.
"""

import concurrent.futures
import contextlib
import functools
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxtrain.system import machine, paths
from jaxtrain.system.errors import ConfigError

# GPT-2's pre-tokenizer, the one `tokenizers`' ByteLevel(use_regex=True) applies.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PROBE = "Hello, wörld! It's 2026: x_1 += 3.14159;\n\tdef f(a,  b):  return a**b  # ok?\n\n→ ü\r\n"
GPT2_FILE = "gpt2-tokenizer.json"  # in jaxtrain's cache: made from tiktoken's files once
FETCH_TIMEOUT_S = 30.0  # for tiktoken's first download of GPT-2's files (it sets no timeout)


@functools.cache
def byte_chars() -> list[str]:
  """The printable character byte-level BPE (GPT-2's scheme) writes for each byte value."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
  extra = iter(range(256, 512))
  return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def on_all_cores(encode, texts: list[str]) -> list[list[int]]:
  """`encode` over `texts` in one thread per core, each over a contiguous share (tiktoken
  releases the GIL; its own batch call pays a future per text, most of the time for short ones)."""
  n = min(machine.cores(), max(1, len(texts) // 16))
  if n == 1:
    return [encode(t) for t in texts]
  bounds = np.linspace(0, len(texts), n + 1).astype(int)
  with concurrent.futures.ThreadPoolExecutor(n) as pool:
    shares = pool.map(lambda i: [encode(t) for t in texts[bounds[i]:bounds[i + 1]]], range(n))
    return [ids for share in shares for ids in share]


def encoder(hf_json: str, slow: Callable[[str], list[int]]):
  """tiktoken's encoder of the vocabulary of `hf_json`, if it is byte-level BPE with GPT-2's
  pre-tokenizer and ids in merge order (tiktoken merges by id), and it encodes a probe text as
  `slow` (the `tokenizers` encoder) does; else None."""
  d = json.loads(hf_json)
  model, pre = d.get("model") or {}, d.get("pre_tokenizer") or {}
  if model.get("type") != "BPE" or model.get("dropout") or d.get("normalizer") is not None or \
      pre != {**pre, "type": "ByteLevel", "add_prefix_space": False, "use_regex": True}:
    return None
  index = {c: b for b, c in enumerate(byte_chars())}
  added = {a["content"] for a in d.get("added_tokens") or []}
  vocab = {piece: i for piece, i in (model.get("vocab") or {}).items() if piece not in added}
  if not all(c in index for piece in vocab for c in piece):
    return None
  merged = [vocab.get("".join(m if isinstance(m, list) else m.split(" ", 1)))
            for m in model.get("merges") or []]
  if None in merged or merged != sorted(merged):
    return None
  import tiktoken

  ranks = {bytes(index[c] for c in piece): i for piece, i in vocab.items()}
  if len(ranks) != len(vocab) or sum(len(r) == 1 for r in ranks) != 256:
    return None
  fast = tiktoken.Encoding("jaxtrain", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={})
  return fast if fast.encode_ordinary(_PROBE) == slow(_PROBE) else None


def _parts(ranks: dict[bytes, int], token: bytes) -> list[bytes]:
  """`token`'s bytes merged by BPE with the ranks below its own: the two tokens it was merged
  from (how a tiktoken vocabulary, which keeps ranks only, gives back its merges)."""
  parts = [bytes([b]) for b in token]
  limit = ranks[token]
  while len(parts) > 1:
    pairs = [(ranks.get(parts[i] + parts[i + 1], limit), i) for i in range(len(parts) - 1)]
    rank, i = min(pairs)
    if rank >= limit:
      break
    parts[i:i + 2] = [parts[i] + parts[i + 1]]
  return parts


def to_hf_json(enc) -> str:
  """A `tokenizers` tokenizer.json with the ids of the tiktoken Encoding `enc` (byte-level BPE
  with GPT-2's pre-tokenizer): its vocabulary, its merges recovered from the ranks, its special
  tokens."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

  chars = byte_chars()
  ranks = {b: enc.encode_single_token(b) for b in enc.token_byte_values()}
  text = lambda b: "".join(chars[x] for x in b)  # noqa: E731
  merges = []
  for token in sorted((b for b in ranks if len(b) > 1), key=ranks.get):
    parts = _parts(ranks, token)
    if len(parts) != 2:
      raise ValueError(f"token {ranks[token]} is not one merge of two earlier tokens")
    merges.append((text(parts[0]), text(parts[1])))
  specials = {s: enc.encode_single_token(s) for s in enc.special_tokens_set}
  vocab = {**{text(b): i for b, i in ranks.items()}, **specials}  # each special at its own id
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(s, special=True) for s in sorted(specials, key=specials.get)])
  return tok.to_str()


def gpt2_json() -> str:
  """GPT-2's tokenizer as a tokenizer.json, made once from tiktoken's copy and kept in jaxtrain's
  cache; a one-line ConfigError where tiktoken has none and cannot fetch it."""
  kept = Path(paths.cache_dir()) / GPT2_FILE
  with contextlib.suppress(OSError):
    return kept.read_text(encoding="utf-8")
  made = to_hf_json(_tiktoken_gpt2())
  with contextlib.suppress(OSError):  # made again next time
    kept.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text(kept, made)
  return made


def _tiktoken_gpt2():
  import tiktoken

  got = {}

  def fetch() -> None:
    try:
      got["enc"] = tiktoken.get_encoding("gpt2")
    except Exception as e:  # no network, a proxy's refusal, a damaged cache: said in one line
      got["error"] = " ".join(str(e).split())[:160] or type(e).__name__

  fetcher = threading.Thread(target=fetch, daemon=True)  # a network that never answers: let go
  fetcher.start()
  fetcher.join(FETCH_TIMEOUT_S)
  if "enc" not in got:
    why = got.get("error", f"no answer in {FETCH_TIMEOUT_S:.0f}s")
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), "data-gym-cache")  # where tiktoken keeps its files
    raise ConfigError("data.tokenizer", f"gpt2: GPT-2's tokenizer is not in tiktoken's cache "
                      f"({cache}) and could not be fetched ({why})", "where there is "
                      "network, run python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\" "
                      "once (set TIKTOKEN_CACHE_DIR to keep it somewhere lasting), or pass the "
                      "path of GPT-2's tokenizer.json")
  return got["enc"]
