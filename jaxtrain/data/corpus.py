"""What a run needs of its data, in one place (docs/layout.md names the modules behind it):
`prepare` (`data.path`'s text or token files, or `data.mixture`'s sources, as one `Corpus`),
`check_lengths`, `train_iterator`, `eval_sets` and `loss_scope`.

Validation is a tail of whole documents (heldout.py), so every tokenizer sees the same validation
text. A mixture tokenizes each source once, on its own, with one tokenizer for all.
"""

import dataclasses
import hashlib
import json
from pathlib import Path

import grain
import ml_collections
import numpy as np

from jaxtrain.config.lists import mixture_sources
from jaxtrain.data import mixture, tokencache, tokenfiles, windows
from jaxtrain.data.chat_format import is_chat
from jaxtrain.data.documents import describe, resolve_files
from jaxtrain.data.records import is_records
from jaxtrain.system import fmt
from jaxtrain.system.errors import ConfigError, UserError


@dataclasses.dataclass
class Corpus:
  tokens: np.ndarray | windows.Shards  # the whole token stream: a read-only memmap (or several)
  tokenizer: object
  n_train: int
  fingerprint: str  # sha256 of the token stream: same text and tokenizer, same fingerprint
  n_files: int
  n_bytes: int
  notes: list[str]  # what was skipped or replaced, for the log
  n_docs: int = 0
  mask: np.ndarray | None = None  # uint8 per token, 1: a target in the loss; None: all are
  sources: list["Source"] = dataclasses.field(default_factory=list)  # data.mixture's
  about: str = ""  # token files: what they are, for the summary ("": text)

  @property
  def train(self) -> np.ndarray | windows.Shards:
    return self.tokens[:self.n_train]

  @property
  def val(self) -> np.ndarray | windows.Shards:
    return self.tokens[self.n_train:]

  def split_mask(self, train: bool) -> np.ndarray | None:
    if self.mask is None:
      return None
    return self.mask[:self.n_train] if train else self.mask[self.n_train:]


@dataclasses.dataclass
class Source:
  name: str  # in metric names: val/<name>/loss
  spec: str  # as written in data.mixture
  weight: float
  corpus: Corpus


@dataclasses.dataclass
class EvalSet:
  name: str  # "" for the run's own validation set (the mixed one)
  batches: list[dict]  # this process's rows
  bpb: float  # val_bpb / val_loss over every row of the set
  # The targets in the loss of each whole batch (every process's rows), by which the batches' mean
  # losses are averaged; None without a loss mask (each batch counts the same).
  weights: np.ndarray | None = None


def loss_scope(data: ml_collections.ConfigDict) -> str:
  """What the loss counts, as the eval line says it ("": every token)."""
  return "completions" if is_records(data) else "assistant turns" if is_chat(data) else ""


def prepare(data: ml_collections.ConfigDict, show_progress: bool = True, log=print,
            vocab_size: int = 0) -> Corpus:
  """The run's data: `data.mixture`'s sources, else `data.path`'s token files (mapped as they
  are; `vocab_size`, model.vocab_size, counts flat files' ids) or its text (tokenized once, then
  read from the cache)."""
  if data.mixture:
    return _mixture(data, show_progress, log)
  files = resolve_files(data.path)
  if not files:
    raise ConfigError("data.path", f"{describe(data.path)!r} matches no file (not a file, a "
                      "directory with files, or a glob)", "point --config.data.path at your text "
                      "(file, directory or glob), or leave it empty for the Python standard library")
  if (chosen := tokenfiles.select(data, files)) is not None:
    return Corpus(**tokenfiles.prepare(data, *chosen, vocab_size, show_progress, log), n_bytes=0)
  return Corpus(**tokencache.load(files, data, show_progress, log))


def _mixture(data: ml_collections.ConfigDict, show_progress: bool, log) -> Corpus:
  """Each source tokenized once, on its own, with the tokenizer of all of them (bpe and char
  learn theirs from all the sources together)."""
  specs = mixture_sources(data.mixture)
  found = [_source_files(data, spec) for spec, _ in specs]
  every = list(dict.fromkeys(f.absolute() for files in found for f in files))
  tok = tokencache.shared_tokenizer(every, data, show_progress, log)
  sources = []
  total = sum(w for _, w in specs)
  for name, (spec, weight), files in zip(mixture.source_names([s for s, _ in specs]), specs, found):
    c = Corpus(**tokencache.load(files, data, show_progress, log, tok))
    sources.append(Source(name, spec, weight, c))
    log(f"data: source {name} ({spec}): weight {weight:g} = {weight / total:.1%} of the rows, "
        f"{c.n_files} file(s), {fmt.count(len(c.train))} train / {fmt.count(len(c.val))} val "
        f"tokens")
  # As one corpus (what the summary counts, and where the end's samples find their prompts): the
  # sources' training splits, then their validation splits. Batches come from the sources.
  key = json.dumps([tok.to_json(), [(s.name, s.corpus.fingerprint, s.weight) for s in sources]],
                   sort_keys=True)
  parts = [s.corpus for s in sources]
  return Corpus(tokens=windows.Shards([c.train for c in parts] + [c.val for c in parts]),
                tokenizer=tok, n_train=sum(len(c.train) for c in parts),
                fingerprint=hashlib.sha256(key.encode()).hexdigest(),
                n_files=sum(c.n_files for c in parts), n_bytes=sum(c.n_bytes for c in parts),
                notes=list(dict.fromkeys(n for c in parts for n in c.notes)),
                n_docs=sum(c.n_docs for c in parts), sources=sources)


def _source_files(data: ml_collections.ConfigDict, spec: str) -> list[Path]:
  found = resolve_files(spec)
  if not found:
    raise ConfigError("data.mixture", f"the source {spec!r} matches no file (not a file, a "
                      "directory with files, or a glob)", "point each source of "
                      "--config.data.mixture at your text")
  if tokenfiles.select(data, found) is not None:
    raise ConfigError("data.mixture", f"the source {spec!r} holds token files (.bin: token "
                      "ids), and a mixture mixes text sources", "train on token files with "
                      "--config.data.path, or pass --config.data.format=text if they are text")
  return found


def check_lengths(corpus: Corpus, seq_len: int, val_fraction: float) -> None:
  """Raises a UserError unless both splits hold a window of seq_len + 1 tokens: of each source,
  for a mixture (the error names it)."""
  if not corpus.sources:
    return _check_windows(corpus, seq_len, val_fraction)
  for s in corpus.sources:
    try:
      _check_windows(s.corpus, seq_len, val_fraction)
    except UserError as e:
      raise UserError(f"data.mixture source {s.name} ({s.spec}): {e}") from None


def eval_batches(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                 n_batches: int) -> list[dict]:
  """The same `n_batches` validation batches (every process's rows) at every evaluation, so val
  losses compare."""
  source = windows.WindowBatches(corpus.val, batch_size, seq_len, seed, windows.EVAL_STREAM,
                                 mask=corpus.split_mask(train=False))
  return [source[i] for i in range(n_batches)]


def _check_windows(corpus: Corpus, seq_len: int, val_fraction: float) -> None:
  """Raises a UserError unless both splits of one corpus hold a window of seq_len + 1 tokens."""
  window = seq_len + 1
  if isinstance(corpus.tokens, windows.Shards):
    for name, split in (("validation", corpus.val), ("training", corpus.train)):
      if windows.n_windows(split, window) < 1:
        longest = max((len(p) for p in split.parts), default=0)
        raise UserError(f"the {name} split of the token files holds no window of seq_len+1="
                        f"{window} ids (its longest stretch in one file has {longest}); pass a "
                        "smaller --config.model.seq_len (or, where validation is the files' "
                        "tail, another --config.data.val_fraction)")
    return
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


def _mixed(corpus: Corpus, split: str, batch_size: int, seq_len: int, seed: int, stream: int,
           rows: slice) -> mixture.MixedBatches:
  return mixture.MixedBatches([getattr(s.corpus, split) for s in corpus.sources],
                              mixture.schedule([s.weight for s in corpus.sources]), batch_size,
                              seq_len, seed, stream, rows)


def train_iterator(corpus: Corpus, batch_size: int, seq_len: int, seed: int,
                   process_index: int = 0, process_count: int = 1) -> grain.DatasetIterator:
  """Grain iterator over this process's rows of the training micro-batches (drawn from the
  sources by weight, for a mixture); its state is the next micro-batch index."""
  rows = windows.process_rows(batch_size, process_index, process_count)
  if corpus.sources:
    source = _mixed(corpus, "train", batch_size, seq_len, seed, windows.TRAIN_STREAM, rows)
  else:
    source = windows.WindowBatches(corpus.train, batch_size, seq_len, seed, windows.TRAIN_STREAM,
                                   rows, corpus.split_mask(train=True))
  # One reader thread a few batches ahead keeps batch assembly off the step's critical path.
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
  return iter(grain.MapDataset.source(source).to_iter_dataset(options))


def eval_sets(corpus: Corpus, batch_size: int, seq_len: int, seed: int, n_batches: int,
              process_index: int = 0, process_count: int = 1) -> list[EvalSet]:
  """The run's validation set (mixed by weight when there are sources), then each source's own:
  the same batches at every evaluation, so val losses compare."""
  args = batch_size, seq_len, seed, n_batches
  rows = windows.process_rows(batch_size, process_index, process_count)

  def own(name: str, c: Corpus, everything: list[dict]) -> EvalSet:  # bpb: every process's rows
    weights = None if c.mask is None else np.array([float(b["weights"].sum()) for b in everything])
    return EvalSet(name, [{k: v[rows] for k, v in b.items()} for b in everything],
                   windows.batches_bpb(c.tokenizer, everything), weights)

  if not corpus.sources:
    return [own("", corpus, eval_batches(corpus, *args))]
  mixed = _mixed(corpus, "val", batch_size, seq_len, seed, windows.EVAL_STREAM, slice(None))
  return [own("", corpus, [mixed[i] for i in range(n_batches)])] + \
      [own(s.name, s.corpus, eval_batches(s.corpus, *args)) for s in corpus.sources]
