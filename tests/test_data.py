"""Data: tokenizers, the token cache, the split, and batches that depend only on seed and index."""

import os

import numpy as np
import pytest

from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import documents, tokenizer
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config


def test_tokenizers_round_trip():
  text = "héllo wörld\n→ ok"
  b = tokenizer.ByteTokenizer()
  assert b.decode(b.encode(text)) == text and b.vocab_size == 256
  c = tokenizer.CharTokenizer(text)
  ids = c.encode(text)
  assert c.decode(ids) == text and ids.max() < c.vocab_size == len(set(text)) + 1  # + end-of-text
  assert tokenizer.from_json(c.to_json()).chars == c.chars
  with pytest.raises(UserError, match="not in this run's char vocabulary"):
    c.encode("Z")


def test_prepare_caches_and_splits_off_the_tail(tiny, tmp_path):
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  text = open(tiny.data.path, encoding="utf-8").read()
  assert len(corpus.tokens) == len(text.encode()) + 1  # one document: its end-of-text token
  assert corpus.tokenizer.decode(corpus.val) == text.encode()[corpus.n_train:].decode() + "<|endoftext|>"
  # One document: the split cuts it where the last val_fraction of its bytes begins.
  assert corpus.n_train == int(len(text.encode()) * (1 - tiny.data.val_fraction))
  cached = list((tmp_path / "cache" / "tokens").iterdir())
  again = corpus_lib.prepare(tiny.data, show_progress=False)
  assert sorted((tmp_path / "cache" / "tokens").iterdir()) == sorted(cached)
  assert again.fingerprint == corpus.fingerprint


def test_char_corpus_vocab_is_the_text_characters(tiny, tmp_path):
  tiny.data.tokenizer = "char"
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  text = open(tiny.data.path, encoding="utf-8").read()
  assert corpus.tokenizer.vocab_size == len(set(text)) + 1
  assert corpus.tokenizer.decode(corpus.tokens[:200]) == text[:200]


def test_directory_corpus_skips_binaries_and_replaces_bad_utf8(tmp_path):
  root = tmp_path / "texts"
  root.mkdir()
  (root / "a.txt").write_text("alpha " * 100)
  (root / "b.txt").write_bytes(b"caf\xe9 " * 50)  # latin-1, not UTF-8
  (root / "c.bin").write_bytes(b"\x00\x01\x02" * 100)
  (root / ".hidden").write_text("never read")
  cfg = tiny_config(**{"data.path": str(root), "data.cache_dir": str(tmp_path / "cache")})
  corpus = corpus_lib.prepare(cfg.data, show_progress=False)
  assert corpus.n_files == 2
  assert any("binary" in n for n in corpus.notes) and any("UTF-8" in n for n in corpus.notes)
  text = corpus.tokenizer.decode(corpus.tokens)
  assert "alpha" in text and "caf\ufffd" in text and "never read" not in text


def test_batches_depend_only_on_seed_and_index(tiny, tmp_path):
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  args = (tiny.train.batch_size, tiny.model.seq_len)
  a = corpus_lib.train_iterator(corpus, *args, tiny.seed)
  first = [next(a)["tokens"] for _ in range(5)]
  b = corpus_lib.train_iterator(corpus, *args, tiny.seed)
  b.set_state({"next_index": 3})
  np.testing.assert_array_equal(next(b)["tokens"], first[3])
  assert a.get_state() == {"next_index": 5}
  c = corpus_lib.train_iterator(corpus, *args, seed=1)
  assert not np.array_equal(next(c)["tokens"], first[0])
  # Every row is a real window of the training split: targets are inputs shifted by one.
  train = np.asarray(corpus.train)
  for row in first[0]:
    start = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(train, len(row)) == row,
                                  axis=1))
    assert len(start) >= 1


def test_process_rows_split_the_global_batch(tiny, tmp_path):
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  args = (tiny.train.batch_size, tiny.model.seq_len, tiny.seed)
  whole = next(corpus_lib.train_iterator(corpus, *args))["tokens"]
  parts = [next(corpus_lib.train_iterator(corpus, *args, p, 2))["tokens"] for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_eval_batches_are_fixed_and_from_validation(tiny, tmp_path):
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  args = (tiny.train.batch_size, tiny.model.seq_len, tiny.seed, tiny.train.eval_steps)
  a, b = corpus_lib.eval_batches(corpus, *args), corpus_lib.eval_batches(corpus, *args)
  assert len(a) == tiny.train.eval_steps
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x["tokens"], y["tokens"])
  val = corpus.tokenizer.decode(corpus.val)
  assert corpus.tokenizer.decode(a[0]["tokens"][0]) in val


def test_default_corpus_is_the_standard_library():
  files = documents.resolve_files("")
  assert len(files) > 100 and all(f.suffix == ".py" for f in files)
  assert any(f.name == "os.py" for f in files)


def test_a_path_that_matches_nothing_names_the_field(tmp_path):
  cfg = tiny_config(**{"data.path": str(tmp_path / "no" / "such.txt"),
                       "data.cache_dir": str(tmp_path / "cache")})
  with pytest.raises(ConfigError, match="^config.data.path: .* matches no file") as e:
    corpus_lib.prepare(cfg.data, show_progress=False)
  assert "\n" not in str(e.value) and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("damage", ["truncated bin", "no bin", "bin without json", "bad json"])
def test_an_incomplete_token_cache_is_not_trusted(damage, tiny, tmp_path):
  # What a crash or a deletion can leave: each is tokenized again, never read as it is.
  tiny.data.cache_dir = str(tmp_path / "cache")
  corpus = corpus_lib.prepare(tiny.data, show_progress=False)
  n, fingerprint = len(corpus.tokens), corpus.fingerprint
  del corpus
  (bin_path,) = (tmp_path / "cache" / "tokens").glob("*.bin")
  meta_path = bin_path.with_suffix(".json")
  if damage == "truncated bin":
    bin_path.write_bytes(bin_path.read_bytes()[:n // 2])
  elif damage == "no bin":
    bin_path.unlink()
  elif damage == "bin without json":
    meta_path.unlink()
  else:
    meta_path.write_text('{"n_tokens": ')
  lines = []
  again = corpus_lib.prepare(tiny.data, show_progress=False, log=lines.append)
  assert len(again.tokens) == n and again.fingerprint == fingerprint
  assert any(line.startswith("data: tokenizing") for line in lines)
  if damage != "bin without json":
    assert any(line.startswith(f"data: ignoring the token cache {bin_path}") for line in lines)
  assert sorted(p.suffix for p in (tmp_path / "cache" / "tokens").iterdir()) == [".bin", ".json"]


def test_a_cache_that_cannot_be_written_is_one_line_naming_the_fix(tiny, tmp_path):
  cache = tmp_path / "cache"
  (cache / "tokens").mkdir(parents=True)
  (cache / "tokens").chmod(0o500)
  tiny.data.cache_dir = str(cache)
  try:
    if os.access(cache / "tokens", os.W_OK):
      pytest.skip("running as root: permissions are not enforced")
    with pytest.raises(UserError, match=r"writing the token cache in .* failed \(Permission "
                       r"denied\); pass --config.data.cache_dir=<a writable directory>"):
      corpus_lib.prepare(tiny.data, show_progress=False)
  finally:
    (cache / "tokens").chmod(0o700)
  assert list((cache / "tokens").iterdir()) == []


def test_tokenizing_removes_what_dead_writers_left_and_keeps_live_ones(tiny, tmp_path):
  from jaxtrain.system import lock

  tokens = tmp_path / "cache" / "tokens"
  tokens.mkdir(parents=True)
  dead = tokens / "0123abcd.bin.tmp999"  # a writer killed mid-way: nothing holds its entry
  live = tokens / "4567cdef.bin.tmp998"  # a writer at work on another corpus
  dead.write_bytes(b"x" * 100)
  live.write_bytes(b"x" * 100)
  writer = lock.FileLock(tokens / "4567cdef.lock")
  assert writer.acquire()
  try:
    tiny.data.cache_dir = str(tmp_path / "cache")
    corpus_lib.prepare(tiny.data, show_progress=False)
    assert live.exists() and not dead.exists()
  finally:
    writer.release()
