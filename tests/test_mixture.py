"""Weighted mixtures (data.mixture): each source tokenized once, rows in the asked proportions, each
source's own val loss in metrics.jsonl and TensorBoard, and a resume that ends bit for bit where an
uninterrupted run ends."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from jaxtrain import train
from jaxtrain.checkpoints import load
from jaxtrain.config import validate
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import documents, mixture
from jaxtrain.system.errors import ConfigError
from jaxtrain.testing import assert_trees_equal


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
  """Two sources that no window can confuse: lowercase words, and numbers."""
  rng = np.random.default_rng(7)
  root = tmp_path_factory.mktemp("mixture")
  words = " ".join("".join(rng.choice(list("abcdefghijklm"), rng.integers(2, 8)))
                   for _ in range(3000))
  numbers = " ".join("".join(rng.choice(list("0123456789"), rng.integers(2, 8)))
                     for _ in range(1500))
  (root / "words").mkdir()
  (root / "words" / "a.txt").write_text(words[:len(words) // 2])
  (root / "words" / "b.txt").write_text(words[len(words) // 2:])
  (root / "numbers.txt").write_text(numbers)
  return root


def _mixed(tiny, root, weights="3,1"):
  w, n = weights.split(",")
  tiny.data.mixture = f"{root}/words/*.txt:{w},{root}/numbers.txt:{n}"
  tiny.data.path = ""
  return tiny


def _source_of(row: np.ndarray) -> str:
  text = bytes(int(t) for t in row if t < 256).decode()
  letters, digits = any(c.isalpha() for c in text), any(c.isdigit() for c in text)
  assert letters != digits, text  # every window lies inside one source
  return "words" if letters else "numbers"


def test_rows_come_in_the_asked_proportions_on_every_process(tiny, two_sources):
  cfg = _mixed(tiny, two_sources)
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
  assert [s.name for s in corpus.sources] == ["words", "numbers"]
  B, T = cfg.train.batch_size, cfg.model.seq_len
  whole = corpus_lib.train_iterator(corpus, B, T, cfg.seed)
  halves = [corpus_lib.train_iterator(corpus, B, T, cfg.seed, i, 2) for i in range(2)]
  counts = {"words": 0, "numbers": 0}
  for _ in range(25):
    batch = next(whole)["tokens"]
    parts = np.concatenate([next(h)["tokens"] for h in halves])
    np.testing.assert_array_equal(batch, parts)  # two processes read the same global batch
    sources = [_source_of(row) for row in batch]
    assert sources.count("words") == 6 and sources.count("numbers") == 2, sources  # every batch
    for s in sources:
      counts[s] += 1
  assert counts == {"words": 150, "numbers": 50}


@pytest.mark.parametrize("tokenizer", ["byte", "char", "bpe"])
def test_each_source_is_tokenized_once_and_then_read_from_the_cache(tiny, two_sources, tmp_path,
                                                                    monkeypatch, tokenizer):
  cfg = _mixed(tiny, two_sources)
  cfg.data.cache_dir, cfg.data.tokenizer, cfg.data.vocab_size = str(tmp_path), tokenizer, 300
  passes = []  # (what the pass is for, the files it reads)
  read = documents.Documents.__call__

  def counted(self, desc):
    passes.append((desc, sorted(f.name for f in self.files)))
    return read(self, desc)

  monkeypatch.setattr(documents.Documents, "__call__", counted)
  first = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
  encoded = [f for desc, files in passes if desc == "tokenizing" for f in files]
  assert sorted(encoded) == ["a.txt", "b.txt", "numbers.txt"], passes
  # One tokenizer for all the sources: bpe learns it from all of them, in one pass.
  learned = [files for desc, files in passes if desc == "BPE"]
  assert learned == ([["a.txt", "b.txt", "numbers.txt"]] if tokenizer == "bpe" else []), passes
  assert all(s.corpus.tokenizer.to_json() == first.tokenizer.to_json() for s in first.sources)
  passes.clear()
  again = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
  assert passes == [] and again.fingerprint == first.fingerprint
  assert len(again.train) == sum(len(s.corpus.train) for s in again.sources)


def test_the_schedule_holds_shares_exactly_and_evenly():
  for weights in ([3, 1], [1, 1, 2], [0.7, 0.3], [1e-3, 1.0]):
    cycle = mixture.schedule(weights)
    share = np.array(weights) / sum(weights)
    counts = np.bincount(cycle, minlength=len(weights))
    assert np.all(np.abs(counts - share * len(cycle)) < 1), (weights, counts)
    for start in range(0, len(cycle), 37):  # any 64 consecutive rows: within a row or two
      window = np.bincount(np.resize(np.roll(cycle, -start), 64), minlength=len(weights))
      assert np.all(np.abs(window - share * 64) <= 2), (weights, window)
  assert list(mixture.schedule([3, 1])) == [0, 0, 1, 0]


def test_source_names_are_short_and_distinct():
  assert mixture.source_names(["books/*.txt", "notes.jsonl", "/data/web/", "a/notes.txt",
                               "**/*.parquet"]) == ["books", "notes", "web", "notes_2", "source"]


@pytest.mark.parametrize("value, message", [
    ("books.txt", r"'books.txt' is not SOURCE:WEIGHT"),
    ("{root}/numbers.txt:0", r"the weight '0' is not a positive number"),
    ("{root}/numbers.txt:x", r"the weight 'x' is not a positive number"),
    ("{root}/numbers.txt:nan", r"the weight 'nan' is not a positive number"),
    ("{root}/numbers.txt:1,{root}/missing/*.txt:2", r"missing/\*.txt' matches no file"),
    ("{root}/numbers.txt:1,{root}/numbers.txt:2", r"names '.*numbers.txt' twice"),
])
def test_a_bad_mixture_is_one_line_naming_it(tiny, two_sources, value, message):
  tiny.data.path = ""
  tiny.data.mixture = value.format(root=two_sources)
  with pytest.raises(ConfigError, match=message) as e:
    validate.validate(tiny)
  assert str(e.value).startswith("config.data.mixture: ") and "\n" not in str(e.value)


def test_mixture_and_path_together_are_refused(tiny, two_sources):
  tiny.data.mixture = f"{two_sources}/numbers.txt:1"
  with pytest.raises(ConfigError, match=r"data.mixture.*and so is data.path"):
    validate.validate(tiny)


def _evals(workdir) -> list[dict]:
  return [r for r in map(json.loads, open(workdir / "metrics.jsonl")) if "val_loss" in r]


@pytest.mark.slow
def test_each_source_is_evaluated_and_a_resume_is_bit_for_bit(tiny, two_sources, tmp_path):
  cfg = _mixed(tiny, two_sources)
  cfg.train.grad_accum, cfg.model.dropout, cfg.optim.decay_steps = 2, 0.1, 8
  cfg.train.eval_every, cfg.train.checkpoint_every, cfg.sample.num_samples = 4, 4, 0
  whole = cfg.copy_and_resolve_references()
  whole.workdir, whole.train.max_steps = str(tmp_path / "whole"), 8
  train.run(whole, show_progress=False)
  legs = cfg.copy_and_resolve_references()
  legs.workdir, legs.train.max_steps = str(tmp_path / "legs"), 4
  train.run(legs, show_progress=False)
  legs.train.max_steps = 8
  train.run(legs, show_progress=False)

  assert_trees_equal(load.load_state(whole.workdir).arrays(), load.load_state(legs.workdir).arrays())
  a, b = _evals(tmp_path / "whole"), _evals(tmp_path / "legs")
  assert [r["step"] for r in a] == [4, 8]
  for key in ("val_loss", "val/words/loss", "val/numbers/loss", "val/words/bpb",
              "val/numbers/bpb"):
    assert [r[key] for r in a] == [r[key] for r in b], key
  last = a[-1]
  assert last["val/words/loss"] != last["val/numbers/loss"]
  assert min(last["val/words/loss"], last["val/numbers/loss"]) < last["val_loss"] < \
      max(last["val/words/loss"], last["val/numbers/loss"])  # the mix lies between its sources
  acc = event_accumulator.EventAccumulator(str(tmp_path / "whole"),
                                           size_guidance={"scalars": 0}).Reload()
  for tag in ("val/loss", "val/words/loss", "val/numbers/bpb"):
    assert [e.step for e in acc.Scalars(tag)] == [4, 8], tag
