"""Batches of windows from a tokenized corpus (`corpus.Corpus`'s tokens), and what turns their loss
into bits per byte; `Shards`, several memmaps (token files, a mixture's sources) read as one
stream without joining them.

Micro-batch i holds `batch_size` windows of `seq_len + 1` tokens at offsets drawn from a
generator seeded by (seed, i): any batch can be rebuilt from the seed and its index. A corpus with
a loss mask (prompt/completion records) adds `"weights"`, float32[B, T], one per target.
"""

import math

import numpy as np

from jaxtrain.system.errors import UserError


class Shards:
  """Token arrays (one memmap per file) read as one sequence without joining them: a window
  comes from one array, so no array is copied whole. `np.asarray` joins them: short slices only."""

  def __init__(self, parts: list[np.ndarray]):
    self.parts = [p for p in parts if len(p)]
    self.ends = np.cumsum([len(p) for p in self.parts], dtype=np.int64)
    self.dtype = self.parts[0].dtype if self.parts else np.dtype(np.uint16)

  def __len__(self) -> int:
    return int(self.ends[-1]) if len(self.ends) else 0

  def __getitem__(self, key: slice) -> "Shards":
    start, stop, step = key.indices(len(self))
    if step != 1:
      raise TypeError("Shards take contiguous slices only")
    parts, begin = [], 0
    for p, end in zip(self.parts, self.ends.tolist()):
      lo, hi = max(start - begin, 0), min(stop - begin, len(p))
      if lo < hi:
        parts.append(p[lo:hi])
      begin = end
    return Shards(parts)

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    joined = np.concatenate(self.parts) if self.parts else np.zeros(0, self.dtype)
    return joined if dtype is None else joined.astype(dtype)

  def starts(self, window: int) -> np.ndarray:
    """Where a window of `window` ids can start in each part: int64[P]."""
    return np.maximum(np.array([len(p) for p in self.parts], np.int64) - window + 1, 0)

  def windows(self, starts_B: np.ndarray, window: int) -> np.ndarray:
    """The windows at `starts_B`, indices into all the parts' starts in order: ids_BW."""
    counts_P = self.starts(window)
    before_P = np.cumsum(counts_P) - counts_P
    part_B = np.searchsorted(before_P + counts_P, starts_B, side="right")
    rows = [self.parts[k][s - before_P[k]:s - before_P[k] + window]
            for k, s in zip(part_B.tolist(), np.asarray(starts_B).tolist())]
    return np.stack(rows) if rows else np.zeros((0, window), self.dtype)


TRAIN_STREAM, EVAL_STREAM = 0, 1  # part of each generator's seed: training draws apart from evaluation


class WindowBatches:
  """Random-access micro-batches of random windows: item i is a pure function of (seed, i).
  `rows` picks this process's share of every global batch."""

  def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, stream: int,
               rows: slice = slice(None), mask: np.ndarray | None = None):
    self.tokens, self.mask, self.batch_size, self.window = tokens, mask, batch_size, seq_len + 1
    self.seed, self.stream, self.rows = seed, stream, rows
    self.n_starts = n_windows(tokens, self.window)

  def __len__(self) -> int:
    return 2**62  # endless: the loop decides when to stop

  def __getitem__(self, index: int) -> dict:
    rng = np.random.default_rng([self.seed, self.stream, index])
    starts_B = rng.integers(0, self.n_starts, size=self.batch_size)[self.rows]
    if isinstance(self.tokens, Shards):  # token files: each window from one file
      return {"tokens": self.tokens.windows(starts_B, self.window).astype(np.int32)}
    at_BW = starts_B[:, None] + np.arange(self.window)
    batch = {"tokens": self.tokens[at_BW].astype(np.int32)}
    if self.mask is not None:  # one weight per target: tokens 1..T of the window
      batch["weights"] = self.mask[at_BW[:, 1:]].astype(np.float32)
    return batch


def n_windows(tokens: np.ndarray | Shards, window: int) -> int:
  """Where a window of `window` tokens can start (token files: within one file)."""
  if isinstance(tokens, Shards):
    return int(tokens.starts(window).sum())
  return max(len(tokens) - window + 1, 0)


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
  per = batch_size // process_count
  return slice(process_index * per, (process_index + 1) * per)


def batches_bpb(tokenizer, batches: list[dict]) -> float:
  """What turns the mean loss (nats per target token) over `batches` into bits per UTF-8 byte:
  targets / (ln 2 x the bytes they stand for), over every row. End-of-text targets count in the
  loss and as no bytes. With weights (records), only the targets in the loss count."""
  nbytes = tokenizer.token_bytes()
  weights = [b.get("weights", np.ones(b["tokens"][:, 1:].shape, np.float32)) for b in batches]
  text = sum(float((nbytes[b["tokens"][:, 1:]] * w).sum()) for b, w in zip(batches, weights))
  return sum(float(w.sum()) for w in weights) / (math.log(2) * text) if text else math.nan


def text_batches(text: str | list[str], tokenizer, seq_len: int, batch_size: int = 8) -> list[dict]:
  """`eval_step` batches of `text` encoded by `tokenizer` (a run's: `load_tokenizer(workdir)`): a
  str, or a list of str (documents, each followed by end-of-text, as in training). Windows of
  seq_len + 1 tokens, one every seq_len tokens, so that each token after the first is a target
  once; `batch_size` windows a batch, each batch of one shape (one compile):
  {"tokens": int32[B, seq_len + 1], "weights": float32[B, seq_len]}, the targets past the text's
  end weighing 0. The text's mean loss: the batches' losses weighted by their `weights.sum()`."""
  docs = [text] if isinstance(text, str) else text
  if not isinstance(docs, list | tuple) or not all(isinstance(d, str) for d in docs):
    raise UserError(f"text_batches takes text, a str or a list of str, not {type(text).__name__}")
  if not all(callable(getattr(tokenizer, f, None)) for f in ("encode", "decode")):
    raise UserError(f"text_batches encodes with a tokenizer, not {type(tokenizer).__name__}: "
                    "pass jt.load_tokenizer(workdir)")
  for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
      raise UserError(f"text_batches: {name}={value!r}; pass an int >= 1 (seq_len: the model's, "
                      "state.model_cfg.seq_len)")
  docs_end = isinstance(text, list | tuple) and tokenizer.eot_id >= 0  # -1: the tokenizer has none
  eot = np.array([tokenizer.eot_id] if docs_end else [], np.int64)
  ids = np.concatenate([np.zeros(0, np.int64)]
                       + [np.append(np.asarray(tokenizer.encode(d), np.int64), eot) for d in docs])
  if len(ids) < 2:
    raise UserError(f"text_batches: the text is {len(ids)} token(s); a window needs 2 (one read, "
                    "one predicted): pass more text")
  n = -(-(len(ids) - 1) // seq_len)  # windows
  at_WT = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)
  tokens_WT = np.pad(ids, (0, n * seq_len + 1 - len(ids)))[at_WT].astype(np.int32)
  weights_WT = (at_WT[:, 1:] < len(ids)).astype(np.float32)
  rows = -(-n // batch_size) * batch_size  # whole batches: rows of padding weigh 0 too
  tokens_WT, weights_WT = (np.pad(x, ((0, rows - n), (0, 0))) for x in (tokens_WT, weights_WT))
  return [{"tokens": tokens_WT[i:i + batch_size], "weights": weights_WT[i:i + batch_size]}
          for i in range(0, rows, batch_size)]
