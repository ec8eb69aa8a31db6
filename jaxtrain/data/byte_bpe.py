"""Byte-level BPE, GPT-2's scheme: the printable character each byte is written as
(`byte_chars`), and `tiktoken`'s encoder of such a vocabulary (`encoder`): for a tokenizer.json of
byte-level BPE with GPT-2's pre-tokenizer (what `bpe` trains, and GPT-2's own file), tiktoken gives
the same ids as `tokenizers` about 5x faster (checked on a probe text when built; any difference
falls back to `tokenizers`), in one thread per core (`on_all_cores`)."""

import concurrent.futures
import functools
import json
import os
from collections.abc import Callable

import numpy as np

# GPT-2's pre-tokenizer, the one `tokenizers`' ByteLevel(use_regex=True) applies.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PROBE = "Hello, wörld! It's 2026: x_1 += 3.14159;\n\tdef f(a,  b):  return a**b  # ok?\n\n→ ü\r\n"


@functools.cache
def byte_chars() -> list[str]:
  """The printable character byte-level BPE (GPT-2's scheme) writes for each byte value."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
  extra = iter(range(256, 512))
  return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def encoder(hf_json: str, slow: Callable[[str], list[int]]):
  """tiktoken's encoder of a tokenizer.json's vocabulary, if it is byte-level BPE with GPT-2's
  pre-tokenizer and ids in merge order (tiktoken merges by id), and it encodes a probe text as
  `slow` (`tokenizers`' encoder of it) does; else None."""
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


def on_all_cores(encode, texts: list[str]) -> list[list[int]]:
  """`encode` over `texts` in one thread per core, each over a contiguous share (tiktoken
  releases the GIL; its own batch call pays a future per text, most of the time for short ones)."""
  n = min(os.cpu_count() or 1, max(1, len(texts) // 16))
  if n == 1:
    return [encode(t) for t in texts]
  bounds = np.linspace(0, len(texts), n + 1).astype(int)
  with concurrent.futures.ThreadPoolExecutor(n) as pool:
    shares = pool.map(lambda i: [encode(t) for t in texts[bounds[i]:bounds[i + 1]]], range(n))
    return [ids for share in shares for ids in share]
