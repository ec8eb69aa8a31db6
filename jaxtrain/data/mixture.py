"""Weighted mixtures (`data.mixture`): several sources, each tokenized and split on its own with
one tokenizer, and windows drawn from them in fixed proportions.

Row g of the stream of global batch rows (micro-batch i holds rows i*B .. i*B+B-1) comes from
source `schedule[g % L]`: a cycle of L rows holding each source's share, interleaved smoothly,
so every batch holds each source's share to within a row and every L rows hold it exactly. With
integer weights L is their sum (3:1 gives 3 rows of the first source in every 4); otherwise L is
4096 and the shares are rounded to whole rows. Where each row's window starts in its source is
drawn from a generator seeded by (seed, stream, i): like `corpus.WindowBatches`, micro-batch i is
a pure function of the seed and i, so the grain iterator's position is all a resume needs.
"""

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import grain
import ml_collections
import numpy as np

from jaxtrain.config.lists import mixture_sources
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenfiles
from jaxtrain.data.documents import resolve_files
from jaxtrain.system import fmt
from jaxtrain.system.errors import ConfigError, UserError

CYCLE = 4096  # rows in the schedule's cycle when the weights are not all integers


@dataclasses.dataclass
class Source:
  name: str  # in metric names: val/<name>/loss
  spec: str  # as written in data.mixture
  weight: float
  corpus: corpus_lib.Corpus


@dataclasses.dataclass
class EvalSet:
  name: str  # "" for the run's own validation set (the mixed one)
  batches: list[dict]  # this process's rows
  bpb: float  # val_bpb / val_loss over every row of the set


def source_names(specs: list[str]) -> list[str]:
  """A short name for each source: the last path part before any glob, without its suffix."""
  names = []
  for spec in specs:
    parts = Path(spec).parts
    plain = [p for p in parts[:next((i for i, p in enumerate(parts) if re.search(r"[*?\[]", p)),
                                    len(parts))]]
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


def prepare(data: ml_collections.ConfigDict, show_progress: bool = True, log=print,
            vocab_size: int = 0) -> corpus_lib.Corpus:
  """`corpus.prepare(data)`; with `data.mixture`, the union of the sources (whose tokenizer every
  source is tokenized with: bpe and char learn theirs from all of them) with `sources` filled.
  `vocab_size`: model.vocab_size, for token files."""
  if not data.mixture:
    return corpus_lib.prepare(data, show_progress, log, vocab_size=vocab_size)
  specs = mixture_sources(data.mixture)
  files = []
  for spec, _ in specs:
    found = resolve_files(spec)
    if not found:
      raise ConfigError("data.mixture", f"the source {spec!r} matches no file (not a file, a "
                        "directory with files, or a glob)", "point each source of "
                        "--config.data.mixture at your text")
    if tokenfiles.select(data, found) is not None:
      raise ConfigError("data.mixture", f"the source {spec!r} holds token files (.bin: token "
                        "ids), and a mixture mixes text sources", "train on token files with "
                        "--config.data.path, or pass --config.data.format=text if they are text")
    files.append(found)
  union = corpus_lib.prepare(data, show_progress, log, files=list(dict.fromkeys(
      f.absolute() for found in files for f in found)))
  sources = []
  total = sum(w for _, w in specs)
  for name, (spec, weight), found in zip(source_names([s for s, _ in specs]), specs, files):
    c = corpus_lib.prepare(data, show_progress, log, files=found, tokenizer=union.tokenizer)
    sources.append(Source(name, spec, weight, c))
    log(f"data: source {name} ({spec}): weight {weight:g} = {weight / total:.1%} of the rows, "
        f"{c.n_files} file(s), {fmt.count(len(c.train))} train / {fmt.count(len(c.val))} val "
        f"tokens")
  key = json.dumps([union.fingerprint, [(s.name, s.corpus.fingerprint, s.weight) for s in sources]])
  return dataclasses.replace(union, fingerprint=hashlib.sha256(key.encode()).hexdigest(),
                             sources=sources)


def check_lengths(corpus: corpus_lib.Corpus, seq_len: int, val_fraction: float) -> None:
  """`corpus.check_lengths`, for each source too (the error names it)."""
  corpus_lib.check_lengths(corpus, seq_len, val_fraction)
  for s in corpus.sources:
    try:
      corpus_lib.check_lengths(s.corpus, seq_len, val_fraction)
    except UserError as e:
      raise UserError(f"data.mixture source {s.name} ({s.spec}): {e}") from None


def _batches(corpus, split: str, batch_size, seq_len, seed, stream, rows) -> MixedBatches:
  return MixedBatches([getattr(s.corpus, split) for s in corpus.sources],
                      schedule([s.weight for s in corpus.sources]), batch_size, seq_len, seed,
                      stream, rows)


def train_iterator(corpus: corpus_lib.Corpus, batch_size: int, seq_len: int, seed: int,
                   process_index: int = 0, process_count: int = 1) -> grain.DatasetIterator:
  """`corpus.train_iterator`, drawing from the sources by weight when there are sources."""
  if not corpus.sources:
    return corpus_lib.train_iterator(corpus, batch_size, seq_len, seed, process_index,
                                     process_count)
  source = _batches(corpus, "train", batch_size, seq_len, seed, corpus_lib._TRAIN_STREAM,
                    corpus_lib.process_rows(batch_size, process_index, process_count))
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
  return iter(grain.MapDataset.source(source).to_iter_dataset(options))


def eval_sets(corpus: corpus_lib.Corpus, batch_size: int, seq_len: int, seed: int, n_batches: int,
              process_index: int = 0, process_count: int = 1) -> list[EvalSet]:
  """The run's validation set (mixed by weight when there are sources), then each source's own."""
  rows = corpus_lib.process_rows(batch_size, process_index, process_count)
  if not corpus.sources:
    return [EvalSet("", corpus_lib.eval_batches(corpus, batch_size, seq_len, seed, n_batches,
                                                process_index, process_count),
                    corpus_lib.bits_per_byte(corpus, batch_size, seq_len, seed, n_batches))]
  mixed = _batches(corpus, "val", batch_size, seq_len, seed, corpus_lib._EVAL_STREAM, slice(None))
  everything = [mixed[i] for i in range(n_batches)]
  sets = [EvalSet("", [{"tokens": b["tokens"][rows]} for b in everything],
                  corpus_lib.batches_bpb(corpus.tokenizer, everything))]
  for s in corpus.sources:
    sets.append(EvalSet(s.name, corpus_lib.eval_batches(s.corpus, batch_size, seq_len, seed,
                                                        n_batches, process_index, process_count),
                        corpus_lib.bits_per_byte(s.corpus, batch_size, seq_len, seed, n_batches)))
  return sets

