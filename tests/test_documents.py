"""Documents: text, .jsonl and .parquet sources; byte, char, BPE and tokenizer.json tokenizers;
end-of-text tokens, the split by whole documents, document masks, val_bpb, and bad input."""

import dataclasses
import json
import math
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
from conftest import run_cli
from flax import nnx

from jaxtrain.config import validate
from jaxtrain.core import model as model_lib
from jaxtrain.core import ops
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenizer
from jaxtrain.data.tokenizer import EOT
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config

WORDS = "the route climbs a crux past jugs and crimps, then a slab; é→ ü done <|endoftext|>".split()


def make_docs(n: int = 400, seed: int = 0) -> list[str]:
  """Short records of 3-20 words, some over several lines; one spells the end-of-text marker."""
  rng = np.random.default_rng(seed)
  docs = []
  for i in range(n):
    words = [WORDS[j] for j in rng.integers(0, len(WORDS) - 1, rng.integers(3, 20))]
    docs.append((" ".join(words) + ("\nline two" if i % 7 == 0 else "")).capitalize())
  docs[3] += " " + EOT  # text that spells the marker stays text
  return docs


def write(path: Path, docs: list[str], field: str = "text") -> Path:
  if path.suffix == ".jsonl":
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
  elif path.suffix == ".parquet":
    pq.write_table(pa.table({"id": list(range(len(docs))), field: docs}), path)
  else:
    path.write_text(docs[0] if len(docs) == 1 else "".join(docs))
  return path


def cfg_for(path, tmp_path, **kw):
  return tiny_config(**{"data.path": str(path), "data.cache_dir": str(tmp_path / "cache"), **kw})


def documents(corpus: corpus_lib.Corpus) -> list[str]:
  text = corpus.tokenizer.decode(corpus.tokens)
  assert text.endswith(EOT)
  # Decoding renders the end-of-text token as the marker; a document's own "<|endoftext|>"
  # text decodes the same way, so split only at the real tokens.
  ends = np.flatnonzero(np.asarray(corpus.tokens) == corpus.tokenizer.eot_id)
  starts = np.concatenate([[0], ends[:-1] + 1])
  return [corpus.tokenizer.decode(corpus.tokens[s:e]) for s, e in zip(starts, ends)]


@pytest.mark.parametrize("source", ["jsonl", "parquet", "mixed directory", "glob"])
def test_each_format_round_trips_its_documents(source, tmp_path):
  docs = make_docs()
  root = tmp_path / "in"
  root.mkdir()
  if source in ("jsonl", "parquet"):
    path = write(root / f"docs.{source}", docs, field="body")
  else:  # a third of the documents in each format, and one as a text file
    write(root / "a.jsonl", docs[:150], field="body")
    write(root / "b.parquet", docs[150:399], field="body")
    write(root / "c.txt", docs[399:])
    path = root if source == "mixed directory" else root / "*.*"
  corpus = corpus_lib.prepare(cfg_for(path, tmp_path, **{"data.text_field": "body"}).data,
                        show_progress=False)
  got = documents(corpus)
  assert sorted(got) == sorted(docs) and corpus.n_docs == len(docs)
  if source in ("jsonl", "parquet"):
    assert got == docs  # one file: its order


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "tokenizer.json"])
def test_each_tokenizer_round_trips_and_writes_a_tokenizer_json_that_loads(kind, tmp_path):
  docs = make_docs()
  path = write(tmp_path / "docs.jsonl", docs)
  name = kind
  if kind == "tokenizer.json":  # a BPE vocabulary trained elsewhere, with no end-of-text token
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    hf.train_from_iterator(docs, tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    name = str(tmp_path / "given.json")
    hf.save(name)
  corpus = corpus_lib.prepare(cfg_for(path, tmp_path, **{"data.tokenizer": name,
                                                   "data.vocab_size": 300}).data,
                        show_progress=False)
  tok = corpus.tokenizer
  assert documents(corpus) == docs
  assert tok.decode(tok.encode(docs[3])) == docs[3] and tok.eot_id not in tok.encode(docs[3])
  if kind in ("bpe", "tokenizer.json"):
    assert tok.vocab_size <= 301 and len(corpus.tokens) < 0.6 * corpus.n_bytes  # it merges
  saved = tmp_path / "tokenizer.json"
  tokenizer.save(tok, str(saved))
  hf = tokenizers.Tokenizer.from_file(str(saved))
  ids = np.asarray(corpus.tokens[:400]).tolist()
  assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids)
  assert hf.token_to_id(EOT) == tok.eot_id and hf.get_vocab_size() == tok.vocab_size
  loaded = tokenizer.load(str(saved))
  assert loaded.decode(ids) == tok.decode(ids)
  assert loaded.encode(docs[5]).tolist() == tok.encode(docs[5]).tolist()


def test_bpe_is_trained_once_per_corpus_and_vocab_size(tmp_path):
  path = write(tmp_path / "docs.jsonl", make_docs())
  lines = []
  cfg = cfg_for(path, tmp_path, **{"data.tokenizer": "bpe", "data.vocab_size": 300})
  a = corpus_lib.prepare(cfg.data, show_progress=False, log=lines.append)
  b = corpus_lib.prepare(cfg.data, show_progress=False, log=lines.append)
  assert sum("training a 300-token BPE" in line for line in lines) == 1
  assert a.fingerprint == b.fingerprint and a.tokenizer.to_json() == b.tokenizer.to_json()
  cfg.data.vocab_size = 280
  c = corpus_lib.prepare(cfg.data, show_progress=False, log=lines.append)
  assert c.tokenizer.vocab_size == 280 and a.tokenizer.vocab_size == 300


def test_validation_is_whole_documents_and_the_same_text_for_every_tokenizer(tmp_path):
  docs = make_docs()
  path = write(tmp_path / "docs.parquet", docs)
  vals = []
  for kind in ("byte", "char", "bpe"):
    corpus = corpus_lib.prepare(cfg_for(path, tmp_path, **{"data.tokenizer": kind,
                                                     "data.vocab_size": 300}).data,
                          show_progress=False)
    assert corpus.tokens[corpus.n_train - 1] == corpus.tokenizer.eot_id  # ends a document
    vals.append(corpus.tokenizer.decode(corpus.val))
    nbytes = len(vals[-1].replace(EOT, "").encode())
    assert 0.1 <= nbytes / corpus.n_bytes < 0.2  # val_fraction of the bytes, in whole documents
  assert vals[0] == vals[1] == vals[2]
  assert vals[0] == "".join(d + EOT for d in docs[-vals[0].count(EOT):])


def test_windows_are_packed_across_documents(tmp_path):
  path = write(tmp_path / "docs.jsonl", make_docs())
  corpus = corpus_lib.prepare(cfg_for(path, tmp_path).data, show_progress=False)
  batch = next(corpus_lib.train_iterator(corpus, 16, 64, seed=0))["tokens"]
  per_row = (batch == corpus.tokenizer.eot_id).sum(axis=1)
  assert per_row.max() >= 2  # windows of 65 bytes hold several of these short documents


@pytest.mark.slow
def test_with_doc_mask_no_token_attends_across_a_document_boundary():
  eot = 0
  c = model_lib.ModelConfig(vocab_size=32, n_layers=2, n_heads=2, d_model=16, seq_len=16,
                            doc_mask=True, eot_id=eot)
  masked = nnx.jit(lambda m, x: m(x))
  models = {on: model_lib.GPT(dataclasses.replace(c, doc_mask=on), nnx.Rngs(0)) for on in (True, False)}
  tokens = jax.random.randint(jax.random.PRNGKey(1), (16,), 1, 32)
  tokens = tokens.at[5].set(eot).at[11].set(eot)  # documents [0..5], [6..11], [12..15]
  # Row 1 + t: token t changed (the end-of-text tokens stay): one forward pass for all of them.
  rows = jax.numpy.stack([tokens] + [tokens.at[t].set(tokens[t] % 31 + 1) for t in range(16)])
  for on, model in models.items():
    logits = np.asarray(masked(model, rows))
    for t in (0, 3, 6, 10, 12, 15):
      a, b = logits[0], logits[1 + t]
      end = 6 if t <= 5 else 12 if t <= 11 else 16
      np.testing.assert_array_equal(a[:t], b[:t])  # causal either way
      assert not np.allclose(a[t:end], b[t:end])
      if on:  # later documents never see it
        np.testing.assert_array_equal(a[end:], b[end:])
      elif end < 16:  # packed (the default): attention crosses documents
        assert not np.allclose(a[end:], b[end:])


def test_document_attention_gradients_match_autodiff_of_the_masked_softmax():
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 2, 8, 4)) for i in range(3))
  tokens = jax.numpy.array([[1, 2, 0, 3, 4, 5, 0, 6], [0, 1, 1, 1, 0, 2, 2, 2]])
  same = model_lib.same_document(tokens, 0)

  def reference(q, k, v):
    allowed = jax.numpy.tril(jax.numpy.ones((8, 8), bool)) & same[:, None]
    scores = jax.numpy.where(allowed, q @ k.swapaxes(-1, -2) / 2.0, -jax.numpy.inf)
    return jax.nn.softmax(scores, axis=-1) @ v

  grads = lambda f: jax.jit(jax.grad(lambda *qkv: (f(*qkv) ** 2).sum(), argnums=(0, 1, 2)))
  ours = grads(lambda *qkv: ops.document_attention(*qkv, same))(q, k, v)
  for x, y in zip(ours, grads(reference)(q, k, v)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_val_bpb_by_hand(tmp_path):
  docs = ["héllo", "ab", "→x"]  # 6, 2 and 4 UTF-8 bytes
  path = write(tmp_path / "d.jsonl", docs * 4)
  corpus = corpus_lib.prepare(cfg_for(path, tmp_path, **{"data.tokenizer": "char"}).data,
                        show_progress=False)
  factor = corpus_lib.eval_sets(corpus, batch_size=2, seq_len=3, seed=0, n_batches=2)[0].bpb
  targets = np.concatenate([b["tokens"][:, 1:].ravel() for b in corpus_lib.eval_batches(
      corpus, 2, 3, 0, 2)])
  by_hand = sum(len(corpus.tokenizer.decode([t]).replace(EOT, "").encode()) for t in targets)
  assert factor == pytest.approx(len(targets) / (math.log(2) * by_hand))
  # A model that gives every target probability 1/2 spends 1 bit a token: bits/byte = tokens/bytes.
  assert math.log(2) * factor == pytest.approx(len(targets) / by_hand)


def bad(tmp_path, name: str, content) -> Path:
  path = tmp_path / name
  if isinstance(content, bytes):
    path.write_bytes(content)
  elif name.endswith(".parquet"):
    pq.write_table(content, path)
  else:
    path.write_text(content)
  return path


@pytest.mark.parametrize("name,content,overrides,message", [
    ("a.jsonl", '{"text": "ok"}\n{"text": "ok"}\n{"text": nope}\n', {},
     r"a.jsonl line 3 is not JSON \(Expecting value at column 10\); fix that line"),
    ("b.jsonl", '{"body": "x", "id": 3}\n', {},
     r"b.jsonl line 1 has no field 'text' \(it has: body, id\); pass --config.data.text_field="),
    ("c.parquet", pa.table({"body": ["x"], "n": [1]}), {},
     r"c.parquet has no column 'text' \(its columns: body, n\); pass --config.data.text_field="),
    ("d.jsonl", "", {}, r"holds no text \(no documents, or only empty ones\)"),
    ("e.jsonl", '{"text": ""}\n', {}, r"holds no text"),
    ("f.jsonl", '{"text": "x"}\n', {"data.tokenizer": "{tok}"},
     r"config.data.tokenizer: .*tok.json is not a tokenizer.json that loads \(.*\); pass byte"),
])
def test_bad_input_is_one_line_and_writes_nothing_to_the_cache(name, content, overrides, message,
                                                              tmp_path):
  path = bad(tmp_path, name, content)
  (tmp_path / "tok.json").write_text('{"model": {"type": "BPE", "vocab": 3}}')
  overrides = {k: v.format(tok=tmp_path / "tok.json") for k, v in overrides.items()}
  cfg = cfg_for(path, tmp_path, **overrides)
  validate.validate(cfg)
  with pytest.raises(UserError, match=message) as e:
    corpus_lib.prepare(cfg.data, show_progress=False)
  assert "\n" not in str(e.value)
  assert not list((tmp_path / "cache").rglob("*.*"))  # no .bin, .json or temporary file


def test_a_vocab_size_below_the_byte_alphabet_is_refused_up_front(tmp_path):
  cfg = tiny_config(**{"data.tokenizer": "bpe", "data.vocab_size": 200})
  with pytest.raises(ConfigError, match=r"^config.data.vocab_size: 200 is too small for "
                     r"byte-level BPE \(256 byte tokens \+ end-of-text\); pass"):
    validate.validate(cfg)
  cfg.data.vocab_size, cfg.data.tokenizer = 4096, "bpee"
  with pytest.raises(ConfigError, match="^config.data.tokenizer: 'bpee' is not byte, char, bpe, gpt2 or a "
                     "tokenizer.json file"):
    validate.validate(cfg)


def test_a_missing_tokenizer_file_is_said_not_to_exist(tmp_path):
  missing = tmp_path / "missing" / "tokenizer.json"
  with pytest.raises(ConfigError) as e:
    validate.validate(tiny_config(**{"data.tokenizer": str(missing)}))
  assert str(e.value) == (f"config.data.tokenizer: the file {missing} does not exist; pass the path "
                          "of an existing tokenizer.json (or --config.data.tokenizer=bpe, byte, char)")
  with pytest.raises(ConfigError, match="is a directory, not a file"):
    validate.validate(tiny_config(**{"data.tokenizer": str(tmp_path) + "/"}))


def test_a_directory_of_binary_files_says_they_were_skipped_as_binary(tmp_path):
  folder = tmp_path / "docs"
  folder.mkdir()
  for name in ("a.bin.txt", "b.txt"):
    (folder / name).write_bytes(b"\x00\x01\x02" * 100)
  cfg = cfg_for(folder, tmp_path)
  with pytest.raises(UserError) as e:
    corpus_lib.prepare(cfg.data, show_progress=False)
  assert str(e.value) == (
      f"{folder} holds no text: all 2 files were skipped as binary (they have NUL bytes, e.g. "
      f"{folder / 'a.bin.txt'}); point --config.data.path at non-empty text, .jsonl or .parquet "
      "files")
  (folder / "c.txt").write_text("")
  with pytest.raises(UserError, match=r"holds no text: 2 of the 3 files were skipped as binary "
                     r"\(they have NUL bytes, e\.g\. .*a\.bin\.txt\) and the rest are empty; point"):
    corpus_lib.prepare(cfg.data, show_progress=False)


def test_a_bom_is_dropped_and_cr_line_ends_are_said(tmp_path):
  path = tmp_path / "notes.txt"  # as a Windows editor saves it
  path.write_bytes(b"\xef\xbb\xbf" + b"Line one.\r\nLine two.\r\n" * 200)
  cfg = cfg_for(path, tmp_path, **{"data.tokenizer": "char"})
  for _ in range(2):  # tokenized, then from the cache: the same notes
    corpus = corpus_lib.prepare(cfg.data, show_progress=False)
    assert "\ufeff" not in corpus.tokenizer.chars and "\r" in corpus.tokenizer.chars
    assert corpus.tokenizer.decode(corpus.tokens[:11]) == "Line one.\r\n"
    assert corpus.notes == [
        f"dropped the UTF-8 byte-order mark (BOM) that began 1 file(s), e.g. {path}",
        f"1 file(s) have CR line ends (\\r\\n or \\r), e.g. {path}: the model learns each \\r as "
        f"a character of the text; to leave them out, convert the files first: sed -i "
        f"'s/\\r$//' {path}"]


def test_json_errors_ending_in_at_read_once(tmp_path):
  path = bad(tmp_path, "u.jsonl", '{"text": "ok"}\n{"text": "cut')
  with pytest.raises(UserError) as e:
    corpus_lib.prepare(cfg_for(path, tmp_path).data, show_progress=False)
  assert str(e.value) == (f"{path} line 2 is not JSON (Unterminated string starting at column 10); "
                          "fix that line or leave the file out of --config.data.path")


@pytest.mark.slow
def test_the_command_line_names_the_bad_jsonl_line_and_exits_2(tmp_path):
  path = bad(tmp_path, "docs.jsonl", '{"body": "fine"}\n{"body": "fine"}\n{body: 1}\n')
  result = run_cli("--config=configs/nano.py", "--jax_platforms=cpu",
                   f"--config.workdir={tmp_path / 'run'}", f"--config.data.path={path}",
                   "--config.data.text_field=body", "--config.data.tokenizer=bpe",
                   f"--config.data.cache_dir={tmp_path / 'cache'}", timeout=600)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      f"error: {path} line 3 is not JSON (Expecting property name enclosed in double quotes at "
      "column 2); fix that line or leave the file out of --config.data.path"]
  assert not (tmp_path / "run").exists() and not list((tmp_path / "cache").rglob("*.*"))


def test_bpe_encodes_through_tiktoken_with_the_ids_tokenizers_gives(tmp_path):
  path = write(tmp_path / "docs.jsonl", make_docs())
  tok = corpus_lib.prepare(cfg_for(path, tmp_path, **{"data.tokenizer": "bpe",
                                                "data.vocab_size": 400}).data,
                     show_progress=False).tokenizer
  rng = np.random.default_rng(0)
  alphabet = list("ab Zé→ü1 2\t\n\r.,'s;:_-(){}ll ve  ") + ["  ", "\n\n", "'re", "42", "日本"]
  texts = make_docs(50, seed=1) + ["".join(rng.choice(alphabet, rng.integers(1, 60)))
                                   for _ in range(300)]
  got = tok.encode_batch(texts)
  assert tok._fast  # the fast path is on for a byte-level BPE this trains
  for text, ids in zip(texts, got):
    assert ids.tolist() == tok.tok.encode(text, add_special_tokens=False).ids, repr(text)


def test_a_jsonl_record_longer_than_a_parse_block_still_reads(tmp_path, monkeypatch):
  from jaxtrain.data import documents as documents_lib

  monkeypatch.setattr(documents_lib, "_BLOCK_BYTES", 1 << 10)
  docs = ["short", "x" * 5000 + " long", "after"] * 3
  path = write(tmp_path / "big.jsonl", docs)
  assert documents(corpus_lib.prepare(cfg_for(path, tmp_path).data, show_progress=False)) == docs
