"""Batches of windows from a tokenized corpus (`corpus.Corpus`): the training iterator, the fixed
evaluation batches, and what turns their loss into bits per byte.

Micro-batch i holds `batch_size` windows of `seq_len + 1` tokens at offsets drawn from a
generator seeded by (seed, i): any batch can be rebuilt from the seed and its index. A corpus with
a loss mask (prompt/completion records) adds `"weights"`, float32[B, T], one per target.
"""

import math
from typing import Protocol

import grain
import numpy as np

from jaxtrain.system.errors import UserError


class Corpus(Protocol):
  """What batches need of a `corpus.Corpus` (which imports this module)."""

  tokens: np.ndarray
  tokenizer: object
  mask: np.ndarray | None
  train: np.ndarray
  val: np.ndarray

  def split_mask(self, train: bool) -> np.ndarray | None: ...

_TRAIN_STREAM, _EVAL_STREAM = 0, 1


class WindowBatches:
  """Random-access micro-batches of random windows: item i is a pure function of (seed, i).

  `rows` picks this process's share of every global batch, so processes never read each
  other's rows.
  """

  def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, stream: int,
               rows: slice = slice(None), mask: np.ndarray | None = None):
    self.tokens, self.mask, self.batch_size, self.window = tokens, mask, batch_size, seq_len + 1
    self.seed, self.stream, self.rows = seed, stream, rows
    self.n_starts = len(tokens) - self.window + 1

  def __len__(self) -> int:
    return 2**62  # endless: the loop decides when to stop

  def __getitem__(self, index: int) -> dict:
    rng = np.random.default_rng([self.seed, self.stream, index])
    starts_B = rng.integers(0, self.n_starts, size=self.batch_size)[self.rows]
    at_BW = starts_B[:, None] + np.arange(self.window)
    batch = {"tokens": self.tokens[at_BW].astype(np.int32)}
    if self.mask is not None:  # one weight per target: tokens 1..T of the window
      batch["weights"] = self.mask[at_BW[:, 1:]].astype(np.float32)
    return batch


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
  per = batch_size // process_count
  return slice(process_index * per, (process_index + 1) * per)


def train_iterator(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                   process_index: int = 0, process_count: int = 1) -> grain.DatasetIterator:
  """Grain iterator over training micro-batches; its state is the next micro-batch index."""
  source = WindowBatches(corpus.train, batch_size, seq_len, seed, _TRAIN_STREAM,
                         process_rows(batch_size, process_index, process_count),
                         corpus.split_mask(train=True))
  # One reader thread a few batches ahead keeps batch assembly off the step's critical path.
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
  return iter(grain.MapDataset.source(source).to_iter_dataset(options))


def eval_batches(corpus: Corpus, batch_size: int, seq_len: int, seed: int, n_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[dict]:
  """The same `n_batches` validation batches at every evaluation, so val losses compare."""
  source = WindowBatches(corpus.val, batch_size, seq_len, seed, _EVAL_STREAM,
                         process_rows(batch_size, process_index, process_count),
                         corpus.split_mask(train=False))
  return [source[i] for i in range(n_batches)]


def check_lengths(corpus: Corpus, seq_len: int, val_fraction: float) -> None:
  window = seq_len + 1
  if len(corpus.val) < window:
    need = int(window / val_fraction) + window
    raise UserError(f"the corpus has {len(corpus.tokens)} tokens: its validation split "
                    f"({len(corpus.val)}) is shorter than one window of seq_len+1={window}; use "
                    f"at least ~{need} tokens of text or a smaller --config.model.seq_len")
  if len(corpus.train) < window:
    raise UserError(f"the corpus has {len(corpus.tokens)} tokens: its training split "
                    f"({len(corpus.train)}) is shorter than one window of seq_len+1={window}; "
                    "pass a smaller --config.data.val_fraction or --config.model.seq_len, or "
                    "use more text")


def bits_per_byte(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                  n_batches: int) -> float:
  """What turns the mean validation loss (nats per target token) into val_bpb, bits per UTF-8
  byte: targets / (ln 2 x the bytes they stand for), over every row of the evaluation batches.
  End-of-text targets count in the loss and as no bytes. With weights (prompt/completion
  records), only the targets in the loss count: val_bpb is on completions."""
  return batches_bpb(corpus.tokenizer, eval_batches(corpus, batch_size, seq_len, seed, n_batches))


def batches_bpb(tokenizer, batches: list[dict]) -> float:
  """bits_per_byte over these batches (every row of them; weighted targets only, if weighted)."""
  nbytes = tokenizer.token_bytes()
  weights = [b.get("weights", np.ones(b["tokens"][:, 1:].shape, np.float32)) for b in batches]
  text = sum(float((nbytes[b["tokens"][:, 1:]] * w).sum()) for b, w in zip(batches, weights))
  return sum(float(w.sum()) for w in weights) / (math.log(2) * text) if text else math.nan


def eval_weights(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                 n_batches: int) -> np.ndarray | None:
  """The targets in the loss in each whole evaluation batch (every process's rows), by which
  the batches' mean losses are averaged; None without weights (each batch counts the same)."""
  if corpus.mask is None:
    return None
  batches = eval_batches(corpus, batch_size, seq_len, seed, n_batches)
  return np.array([float(b["weights"].sum()) for b in batches])
