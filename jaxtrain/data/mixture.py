"""Weighted mixtures (`data.mixture`): several sources, each tokenized and split on its own with
one tokenizer (`corpus.prepare` does that), and windows drawn from them in fixed proportions:
the sources' short names, the schedule of their rows and the batches drawn by it.

Row g of the stream of global batch rows (micro-batch i holds rows i*B .. i*B+B-1) comes from
source `schedule[g % L]`: a cycle of L rows holding each source's share, interleaved smoothly,
so every batch holds each source's share to within a row and every L rows hold it exactly. With
integer weights L is their sum (3:1 gives 3 rows of the first source in every 4); otherwise L is
4096 and the shares are rounded to whole rows. Like `windows.WindowBatches`, micro-batch i is a
pure function of the seed and i, so the grain iterator's position is all a resume needs.
"""

import re
from pathlib import Path

import numpy as np

CYCLE = 4096  # rows in the schedule's cycle when the weights are not all integers


def source_names(specs: list[str]) -> list[str]:
  """A short name for each source: the last path part before any glob, without its suffix."""
  names = []
  for spec in specs:
    parts = Path(spec).parts
    plain = parts[:next((i for i, p in enumerate(parts) if re.search(r"[*?\[]", p)), len(parts))]
    base = Path(plain[-1]).stem if plain and plain[-1] not in ("/", ".", "..", "~") else "source"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_.") or "source"
    unique, n = name, 2
    while unique in names:
      unique, n = f"{name}_{n}", n + 1
    names.append(unique)
  return names


def schedule(weights: list[float]) -> np.ndarray:
  """The source of each row of one cycle (int32[L]), by smooth weighted round robin."""
  if all(float(w).is_integer() for w in weights) and sum(weights) <= CYCLE:
    counts = np.array(weights, np.int64)
  else:  # largest remainder: whole rows summing to CYCLE
    share = np.array(weights, np.float64) / sum(weights) * CYCLE
    counts = np.floor(share).astype(np.int64)
    counts[np.argsort(-(share - counts), kind="stable")[:CYCLE - counts.sum()]] += 1
  total, current, out = int(counts.sum()), np.zeros(len(counts), np.int64), []
  for _ in range(total):
    current += counts
    k = int(np.argmax(current))
    current[k] -= total
    out.append(k)
  return np.array(out, np.int32)


class MixedBatches:
  """Random-access micro-batches whose rows come from the sources by `schedule`; item i is a
  pure function of (seed, i). `rows` picks this process's share of every global batch."""

  def __init__(self, tokens: list[np.ndarray], cycle: np.ndarray, batch_size: int, seq_len: int,
               seed: int, stream: int, rows: slice = slice(None)):
    self.tokens, self.cycle, self.batch_size, self.window = tokens, cycle, batch_size, seq_len + 1
    self.seed, self.stream, self.rows = seed, stream, rows
    self.n_starts = np.array([len(t) - self.window + 1 for t in tokens], np.int64)

  def __len__(self) -> int:
    return 2**62  # endless: the loop decides when to stop

  def sources(self, index: int) -> np.ndarray:
    """The source of each row of global micro-batch `index` (all rows, not only this process's)."""
    g = index * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
    return self.cycle[g % len(self.cycle)]

  def __getitem__(self, index: int) -> dict:
    rng = np.random.default_rng([self.seed, self.stream, index])
    src_B = self.sources(index)
    starts_B = rng.integers(0, self.n_starts[src_B])
    rows = [self.tokens[k][s:s + self.window] for k, s in zip(src_B[self.rows], starts_B[self.rows])]
    return {"tokens": np.stack(rows).astype(np.int32)}
