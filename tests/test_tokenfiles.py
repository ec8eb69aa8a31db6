"""Token files as data: nanoGPT's flat uint16 .bin and llm.c's shards train, resume bit for bit,
feed windows that are exactly the files' ids, and refuse bad files in one line."""

import json
import math
import os
import re

import numpy as np
import pytest
import tokenizers
from conftest import run_cli
from test_cli import TINY
from test_resume import _check_resume
from test_sample_cli import module, one_line_error

from jaxtrain import train
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenfiles
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config

GPT2 = 50257


def text_ids(corpus_file) -> np.ndarray:
  """The test corpus's bytes as uint16 ids: ids with something to learn."""
  return np.frombuffer(corpus_file.read_bytes(), np.uint8).astype(np.uint16)


def write_llmc(path, ids, magic=20240520, version=1, n=None) -> None:
  header = np.zeros(256, np.int32)
  header[:3] = magic, version, len(ids) if n is None else n
  with open(path, "wb") as f:
    f.write(header.tobytes())
    f.write(np.asarray(ids, np.uint16).tobytes())


def nanogpt_dir(root, ids):
  """As nanoGPT's prepare.py leaves data/<name>/: train.bin, val.bin, and files that are not ids."""
  root.mkdir()
  cut = len(ids) * 9 // 10
  ids[:cut].tofile(root / "train.bin")
  ids[cut:].tofile(root / "val.bin")
  (root / "prepare.py").write_text("# writes train.bin and val.bin\n")
  return root


def llmc_dir(root, ids):
  """As llm.c's fineweb.py writes them: the first shard validation, the rest training; ids
  spread over GPT-2's vocabulary (a permutation of the bytes, as learnable)."""
  root.mkdir()
  ids = (ids.astype(np.int64) * 397 % GPT2).astype(np.uint16)
  bounds = [0, len(ids) // 10, len(ids) // 2, len(ids)]
  for i in range(3):
    write_llmc(root / f"fineweb_{'val' if i == 0 else 'train'}_{i:06d}.bin", ids[bounds[i]:bounds[i + 1]])
  return root


def _metrics(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nanogpt", "llmc"])
def test_token_files_train_and_the_loss_falls(kind, tiny, corpus_file, tmp_path):
  ids = text_ids(corpus_file)
  if kind == "nanogpt":  # with the tokenizer.json of the ids (bytes): text samples, val_bpb
    tiny.data.path = str(nanogpt_dir(tmp_path / "shakespeare", ids))
    tiny.data.tokenizer = str(tmp_path / "bytes.json")
    tokenizer_lib.save(tokenizer_lib.ByteTokenizer(), tiny.data.tokenizer)
  else:  # without one: GPT-2's vocabulary, samples as ids, no val_bpb
    tiny.data.path = str(llmc_dir(tmp_path / "fineweb10B", ids))
  result = train.run(tiny, show_progress=False)
  losses = [r["loss"] for r in _metrics(tiny.workdir) if "loss" in r]
  evals = [r for r in _metrics(tiny.workdir) if "val_loss" in r]
  assert losses[-1] < losses[0] - 0.5, losses
  assert evals[-1]["val_loss"] < evals[0]["val_loss"], evals
  saved = tokenizer_lib.load(os.path.join(tiny.workdir, "tokenizer.json"))
  if kind == "nanogpt":
    # Every target is one byte of text: bits per byte are the loss in bits.
    assert all(abs(r["val_bpb"] - r["val_loss"] / math.log(2)) < 1e-4 for r in evals)
    assert re.search(r"[a-z]{2}", result.samples[0]), result.samples
    assert saved.vocab_size == 256
  else:
    assert not any("val_bpb" in r for r in evals)
    assert re.fullmatch(r"( (\d+|<\|endoftext\|>))+│( (\d+|<\|endoftext\|>))+", result.samples[0])
    assert isinstance(saved, tokenizer_lib.IdsTokenizer) and saved.vocab_size == GPT2
    assert saved.eot_id == 50256


@pytest.mark.slow
def test_resume_on_llmc_shards_is_bit_for_bit(tiny, corpus_file, tmp_path):
  tiny.data.path = str(llmc_dir(tmp_path / "shards", text_ids(corpus_file)))
  _check_resume(tiny, tmp_path, n=3)


def _unique_files(root, sizes, start=1):
  """Flat files whose ids are all different and count up within a file: a window shows where
  it was read."""
  root.mkdir()
  arrays, at = [], start
  for i, n in enumerate(sizes):
    arrays.append(np.arange(at, at + n, dtype=np.uint16))
    arrays[-1].tofile(root / f"part_{i}.bin")
    at += n
  return arrays


def test_the_windows_are_the_ids_in_the_files(tmp_path):
  files = _unique_files(tmp_path / "ids", [700, 20, 900, 1200])
  cfg = tiny_config(**{"data.path": str(tmp_path / "ids"), "data.val_fraction": 0.25})
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, vocab_size=4000)
  stream = np.concatenate(files)
  n_train = int(len(stream) * 0.75)
  assert corpus.n_train == n_train and len(corpus.tokens) == len(stream)
  assert np.array_equal(np.asarray(corpus.train), stream[:n_train])  # the tail is validation
  assert np.array_equal(np.asarray(corpus.val), stream[n_train:])
  assert all(isinstance(p, np.memmap) for p in corpus.tokens.parts)  # read in place
  window, seen = 33, set()
  it = corpus_lib.train_iterator(corpus, 8, window - 1, seed=3)
  for _ in range(40):
    for row in next(it)["tokens"]:
      assert np.all(np.diff(row) == 1), row  # one file's ids, in order: never two files
      k = next(i for i, f in enumerate(files) if f[0] <= row[0] <= f[-1])
      at = int(row[0] - files[k][0])
      assert np.array_equal(row, files[k][at:at + window]) and row[-1] < stream[n_train]
      seen.add(k)
  assert seen == {0, 2, 3}  # the 20-id file holds no window of 33
  for batch in corpus_lib.eval_batches(corpus, 8, window - 1, seed=3, n_batches=3):
    assert np.all(np.diff(batch["tokens"], axis=1) == 1) and batch["tokens"].min() >= stream[n_train]
  with pytest.raises(UserError, match=r"^the validation split of the token files holds no window "
                     r"of seq_len\+1=1001 ids \(its longest stretch in one file has 705\)"):
    corpus_lib.check_lengths(corpus, 1000, 0.25)


@pytest.mark.parametrize("name,is_val", [
    ("val.bin", True), ("fineweb_val_000000.bin", True), ("tiny_shakespeare_val.bin", True),
    ("data-valid.bin", True), ("interval.bin", False), ("valley_1.bin", False),
])
def test_files_named_as_validation_are_validation(name, is_val, tmp_path):
  (tmp_path / "d").mkdir()
  np.arange(0, 400, dtype=np.uint16).tofile(tmp_path / "d" / "a_train.bin")
  np.arange(400, 500, dtype=np.uint16).tofile(tmp_path / "d" / name)
  cfg = tiny_config(**{"data.path": str(tmp_path / "d"), "data.val_fraction": 0.5})
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, vocab_size=500)
  assert len(corpus.val) == (100 if is_val else 250)


def test_auto_reads_token_files_where_the_files_say_so(tmp_path):
  text = tmp_path / "texts"  # text with a stray binary .bin: text, as ever, and a hint
  text.mkdir()
  (text / "a.txt").write_text("alpha " * 100)
  np.arange(300, dtype=np.uint16).tofile(text / "c.bin")
  cfg = tiny_config(**{"data.path": str(text), "data.cache_dir": str(tmp_path / "cache")})
  corpus = corpus_lib.prepare(cfg.data, show_progress=False)
  assert not corpus.about and corpus.n_files == 1
  assert any("c.bin (token ids? point --config.data.path at the .bin files alone" in n
             for n in corpus.notes), corpus.notes
  cfg.data.format = "uint16"  # any suffix, when said
  (tmp_path / "ids.tok").write_bytes(np.arange(300, dtype=np.uint16).tobytes())
  cfg.data.path = str(tmp_path / "ids.tok")
  assert len(corpus_lib.prepare(cfg.data, show_progress=False, vocab_size=300).tokens) == 300
  cfg.data.format, cfg.data.path = "text", str(text / "c.bin")
  with pytest.raises(UserError, match="looks binary"):
    corpus_lib.prepare(cfg.data, show_progress=False)


def test_the_check_is_cached_and_the_fingerprint_follows_the_ids(tmp_path, monkeypatch):
  monkeypatch.setattr(tokenfiles, "_BLOCK_BYTES", 64)  # many blocks per file
  root = tmp_path / "d"
  files = _unique_files(root, [300, 200])
  cfg = tiny_config(**{"data.path": str(root), "data.cache_dir": str(tmp_path / "cache")})
  said = []
  first = corpus_lib.prepare(cfg.data, show_progress=False, log=said.append, vocab_size=600)
  again = corpus_lib.prepare(cfg.data, show_progress=False, log=said.append, vocab_size=600)
  assert first.fingerprint == again.fingerprint
  assert len([s for s in said if "checking the ids" in s]) == 1  # the second start read none
  assert len(list((tmp_path / "cache" / "tokenfiles").glob("*.json"))) == 2
  changed = files[1].copy()
  changed[150] = 7  # same size, other ids
  changed.tofile(root / "part_1.bin")
  os.utime(root / "part_1.bin", ns=(1, 1))
  assert corpus_lib.prepare(cfg.data, show_progress=False, vocab_size=600).fingerprint != first.fingerprint
  changed[170] = 600  # past the vocabulary, in a later block
  changed.tofile(root / "part_1.bin")
  with pytest.raises(UserError, match=r"part_1.bin holds token id 600, and the vocabulary has 600 "
                     r"ids \(model.vocab_size\).*--config.model.vocab_size=601"):
    corpus_lib.prepare(cfg.data, show_progress=False, vocab_size=600)


def test_ids_tokenizer_text_is_ids_and_its_file_reads_back(tmp_path):
  tok = tokenizer_lib.IdsTokenizer(GPT2, eot_id=50256)
  assert tok.encode("464 2068 <|endoftext|> 7").tolist() == [464, 2068, 50256, 7]
  assert tok.decode([464, 50256, 7]) == " 464 <|endoftext|> 7"
  with pytest.raises(UserError, match=r"'hello' is not a token id of this run \(0 .. 50256\)"):
    tok.encode("hello")
  tokenizer_lib.save(tok, str(tmp_path / "tokenizer.json"))
  hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert hf.encode("464 2068").ids == [464, 2068]
  assert hf.decode([464, 50256], skip_special_tokens=False) == "464 <|endoftext|>"
  back = tokenizer_lib.load(str(tmp_path / "tokenizer.json"))
  assert isinstance(back, tokenizer_lib.IdsTokenizer) and back.to_json() == tok.to_json()


def _bad(tmp_path, case: str):
  """A directory holding one bad token file (and a good one), and the flags that go with it."""
  root = tmp_path / "data"
  root.mkdir()
  good = np.arange(100, 400, dtype=np.uint16)
  flags = ["--config.model.vocab_size=512"]
  if case == "id past the vocabulary":
    good[5] = 512
  elif case == "empty":
    (root / "b.bin").write_bytes(b"")
  elif case == "odd size":
    (root / "b.bin").write_bytes(good.tobytes()[:-1])
  elif case in ("bad magic", "header only"):
    write_llmc(root / "b.bin", good, magic=20240521) if case == "bad magic" else \
        write_llmc(root / "b_val.bin", [])
    write_llmc(root / "a.bin", good)
    return root, ["--config.data.format=llmc"] if case == "bad magic" else []
  good.tofile(root / "a.bin")
  return root, flags


@pytest.mark.slow
@pytest.mark.parametrize("case,message", [
    ("id past the vocabulary", "a.bin holds token id 512, and the vocabulary has 512 ids "
                               "(model.vocab_size): every id must be below it; pass "
                               "--config.model.vocab_size=513"),
    ("empty", "b.bin is empty: a token file needs at least one id"),
    ("odd size", "b.bin holds 599 bytes, an odd number, so it is not uint16 token ids"),
    ("bad magic", "b.bin is not an llm.c shard: its first int32 is 20240521, not the magic "
                  "number 20240520"),
    ("header only", "b_val.bin holds an llm.c header and no token ids"),
])
def test_a_bad_token_file_is_one_line_and_exit_2(case, message, tmp_path):
  root, flags = _bad(tmp_path, case)
  result = run_cli("--config=configs/nano.py", "--jax_platforms=cpu",
                   f"--config.workdir={tmp_path / 'run'}", f"--config.data.path={root}",
                   f"--config.data.cache_dir={tmp_path / 'cache'}", *flags, timeout=600)
  one_line_error(result, message)
  assert len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "run").exists()


def _prepare(tmp_path, write, **overrides):
  root = tmp_path / "data"
  root.mkdir(exist_ok=True)
  write(root)
  vocab = overrides.pop("vocab", 512)
  cfg = tiny_config(**{"data.path": str(root), "data.cache_dir": str(tmp_path / "cache"),
                       **overrides})
  return corpus_lib.prepare(cfg.data, show_progress=False, vocab_size=vocab)


ids = np.arange(0, 300, dtype=np.uint16)


@pytest.mark.parametrize("write,overrides,error", [
    (lambda d: write_llmc(d / "a.bin", ids, version=7), {},
     r"a.bin: llm.c header version 7; only version 1 \(GPT-2's uint16 ids\) is read"),
    (lambda d: write_llmc(d / "a.bin", ids, magic=20240801, version=7), {},
     r"a.bin is an llm.c Llama 3 shard \(uint32 ids\)"),
    (lambda d: write_llmc(d / "a.bin", ids, magic=20240522), {}, r"an llm.c evaluation file"),
    (lambda d: write_llmc(d / "a.bin", ids, n=400), {},
     r"its llm.c header says 400 ids \(1824 bytes with the header\) but the file holds 1624 bytes"),
    (lambda d: (write_llmc(d / "a.bin", ids), ids.tofile(d / "b.bin")), {},
     r"b.bin has no llm.c header .* but .*a.bin has one"),
    (lambda d: ids.tofile(d / "val.bin"), {}, r"every token file of data.path is named as validation"),
    (lambda d: write_llmc(d / "a.bin", [*ids, GPT2]), {},
     r"a.bin holds token id 50257, and the vocabulary has 50257 ids \(GPT-2's, which llm.c's "
     r"version 1 means\): the ids are not GPT-2's; pass --config.data.tokenizer="),
    (lambda d: (ids.tofile(d / "a.bin"), tokenizer_lib.save(tokenizer_lib.ByteTokenizer(),
                                                             str(d.parent / "bytes.json"))),
     {"data.tokenizer": "{d}/../bytes.json"},
     r"a.bin holds token id 299, and the vocabulary has 256 ids \(data.tokenizer=.*bytes.json\): "
     r"the ids are not its"),
    (lambda d: ids.tofile(d / "a.bin"), {"vocab": 0},
     r"^config.model.vocab_size: is 0 \(from the tokenizer\), and flat token files \(a.bin\)"),
    (lambda d: ids.tofile(d / "a.bin"), {"data.tokenizer": "bpe"},
     r"^config.data.tokenizer: bpe is learned from text, but data.path holds token ids"),
    (lambda d: ids.tofile(d / "a.bin"), {"data.prompt_field": "p", "data.completion_field": "c"},
     r"^config.data.prompt_field: is set, but data.path holds token ids \(a.bin\), not records"),
    (lambda d: ids.tofile(d / "a.bin"), {"data.path": "", "data.mixture": "{d}/a.bin:1,{d}/a.bin:2"},
     r"^config.data.mixture: the source .* holds token files"),
    (lambda d: (d / "a.bin").write_bytes(b"\x01" * 1023 + b"\x00"), {"data.format": "llmc"},
     r"a.bin is not an llm.c shard: its first int32 is 16843009"),
])
def test_what_token_files_refuse(write, overrides, error, tmp_path):
  root = tmp_path / "data"
  overrides = {k: v.format(d=root) if isinstance(v, str) else v for k, v in overrides.items()}
  with pytest.raises(UserError, match=error):
    _prepare(tmp_path, write, **overrides)


@pytest.mark.slow
def test_what_a_run_without_a_tokenizer_refuses_up_front():
  tok = tokenizer_lib.IdsTokenizer(512)
  for overrides, error in [
      ({"model.doc_mask": True}, r"^config.model.doc_mask: needs the end-of-text id"),
      ({"train.eval_tasks": "held.jsonl"}, r"^config.train.eval_tasks: scores text"),
      ({"sample.prompt": "Once upon"}, r"^config.sample.prompt: 'Once upon' is not token ids"),
      ({"train.early_stop_patience": 2, "train.early_stop_metric": "val_bpb"},
       r"^config.train.early_stop_metric: is val_bpb"),
  ]:
    with pytest.raises(ConfigError, match=error):
      tokenfiles.check_run(tiny_config(**overrides), tok)
  tokenfiles.check_run(tiny_config(**{"sample.prompt": "5 6 7"}), tok)


@pytest.mark.slow
def test_the_documented_cli_trains_on_a_directory_and_samples_ids(corpus_file, tmp_path):
  root = nanogpt_dir(tmp_path / "shakespeare_char", text_ids(corpus_file))
  workdir = tmp_path / "run"
  result = run_cli("--config=configs/nano.py", "--jax_platforms=cpu", f"--config.workdir={workdir}",
                   f"--config.data.path={root}", "--config.model.vocab_size=128", *TINY,
                   "--config.train.max_steps=6", "--config.train.eval_every=3")
  assert result.returncode == 0, result.stderr[-2000:]
  out = result.stdout
  assert f"data: {root}: 2 token file(s) (flat uint16 ids), " in out, out
  assert "(validation: the files named so, val.bin)" in out
  assert "left out 1 other file(s), e.g. prepare.py" in out and "samples at step 6" in out
  assert "bits/byte" not in out
  sampled = module("jaxtrain.sample", f"--workdir={workdir}", "--prompt=72 101", "--max_new_tokens=4")
  assert sampled.returncode == 0, sampled.stderr
  assert re.fullmatch(r"72 101( \d+){4}\n", sampled.stdout), sampled.stdout
  one_line_error(module("jaxtrain.sample", f"--workdir={workdir}", "--prompt=Hello"),
                 "'Hello' is not a token id of this run (0 .. 127)")
