"""What a new user met in their first week, replayed: nanoGPT's own data directory (train.bin,
val.bin, meta.pkl) trains with text samples and no hand-typed vocabulary, a meta.pkl that would run
code is refused unrun, GPT-2's tokenizer by name (and one line where it cannot be had), a Latin-1
file, a char vocabulary of thousands of symbols."""

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import killharness as kh
import numpy as np
import pytest
from conftest import ROOT, run_cli

import jaxtrain as jt
from jaxtrain.data import bpe_tiktoken, meta_pkl
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import fmt, invocation
from jaxtrain.system.errors import UserError
from jaxtrain.testing import tiny_config


def _one_line_error(result, code: int = 2) -> str:
  assert result.returncode == code, (result.returncode, result.stdout[-1500:], result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  return lines[0]


def nanogpt_char_dir(text: str, directory: Path) -> Path:
  """What nanoGPT's data/shakespeare_char/prepare.py leaves: train.bin, val.bin (90/10 of the
  characters as uint16 ids) and meta.pkl (vocab_size, itos, stoi), beside the script."""
  directory.mkdir(parents=True)
  chars = sorted(set(text))
  stoi, itos = {ch: i for i, ch in enumerate(chars)}, dict(enumerate(chars))
  n = len(text)
  for name, part in (("train.bin", text[:int(n * 0.9)]), ("val.bin", text[int(n * 0.9):])):
    np.array([stoi[c] for c in part], dtype=np.uint16).tofile(directory / name)
  with open(directory / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
  (directory / "prepare.py").write_text("# nanoGPT's script\n")
  (directory / "input.txt").write_text(text)
  return directory


@pytest.mark.slow
def test_nanogpts_character_data_trains_with_its_vocabulary_and_samples_text(corpus_file, tmp_path):
  text = corpus_file.read_text()
  data = nanogpt_char_dir(text, tmp_path / "shakespeare_char")
  n_chars = len(set(text))
  workdir = tmp_path / "run"
  # The Shakespeare recipe's own tokenizer (char) with nanoGPT's files: nothing typed by hand.
  run = kh.complete([*kh.cli_args(workdir, data, 4), "--config.data.tokenizer=char",
                     "--config.sample.num_samples=1", "--config.sample.prompt=The",
                     "--config.sample.max_new_tokens=12"])
  out = run.text()
  assert f"vocabulary {n_chars} (char) -> train" in out
  assert (f"data: {data / 'meta.pkl'}: vocabulary {n_chars}, whose characters (itos) decode the "
          "ids, so samples and prompts are text") in out
  assert "bits/byte" in out  # the characters' bytes are known: val_bpb is there
  samples = (workdir / "samples.txt").read_text()
  assert samples.count("The") >= 1 and set(samples) - set("0123456789 \n-<|>") - set("sample")
  assert json.loads((workdir / "config.json").read_text())["model"]["vocab_size"] == 0
  # The trained run's tools see the same characters: sample with a text prompt.
  sample = subprocess.run([sys.executable, "-m", "jaxtrain.sample", f"--workdir={workdir}",
                           "--prompt=The", "--max_new_tokens=8", "--jax_platforms=cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert sample.returncode == 0, sample.stderr
  assert sample.stdout.startswith("The") and not sample.stdout.strip().split()[0].isdigit()


def test_meta_pkl_gives_characters_ids_or_one_line_never_running_code(tmp_path):
  chars = "\n !abc"
  path = tmp_path / "meta.pkl"
  path.write_bytes(pickle.dumps({"vocab_size": 6, "itos": dict(enumerate(chars)),
                                 "stoi": {c: i for i, c in enumerate(chars)}}))
  tok, note = meta_pkl.tokenizer(path)
  assert tok.vocab_size == 6 and tok.eot_id == -1 and tok.decode([3, 4, 5]) == "abc"
  assert tok.encode("cab").tolist() == [5, 3, 4] and "whose characters" in note
  # Written and read back as a workdir's tokenizer.json: the same (no end-of-text is added).
  back = tokenizer_lib.from_text(tok.hf_json())
  assert back.vocab_size == 6 and back.eot_id == -1 and back.decode([5, 0]) == "c\n"
  # Given as data.tokenizer for text, the same file gets the end-of-text a document needs.
  (tmp_path / "chars.json").write_text(tok.hf_json())
  assert tokenizer_lib.read_file(str(tmp_path / "chars.json")).eot_id == 6
  # Characters not in code point order keep their ids.
  path.write_bytes(pickle.dumps({"vocab_size": 3, "itos": ["z", "a", "m"]}))
  assert meta_pkl.tokenizer(path)[0].encode("amz").tolist() == [1, 2, 0]
  path.write_bytes(pickle.dumps({"vocab_size": 50257}))  # a size and no characters
  tok, note = meta_pkl.tokenizer(path)
  assert isinstance(tok, tokenizer_lib.IdsTokenizer) and tok.vocab_size == 50257

  class Payload:
    def __reduce__(self):
      return os.system, (f"touch {tmp_path / 'ran'}",)

  path.write_bytes(pickle.dumps({"vocab_size": 65, "itos": Payload()}))
  with pytest.raises(UserError) as e:
    meta_pkl.tokenizer(path)
  assert not (tmp_path / "ran").exists()
  assert str(e.value).startswith(f"{path} is not plain data (it names posix.system); jaxtrain "
                                 "reads meta.pkl without running it")
  path.write_bytes(pickle.dumps(["not", "a", "dict"]))
  with pytest.raises(UserError, match="has no vocab_size"):
    meta_pkl.read(path)


@pytest.mark.slow
def test_flat_token_files_without_meta_pkl_suggest_gpt2_by_name(tmp_path):
  data = tmp_path / "owt"
  data.mkdir()
  for name in ("train.bin", "val.bin"):
    np.arange(2000, dtype=np.uint16).tofile(data / name)
  line = _one_line_error(run_cli(*kh.cli_args(tmp_path / "run", data, 2)))
  assert "pass --config.data.tokenizer=gpt2 for GPT-2's ids (nanoGPT's openwebtext)" in line
  assert "meta.pkl is not beside them" in line and "50257" not in line


@pytest.mark.slow
def test_gpt2_by_name_without_network_or_cached_files_is_one_line(tmp_path, corpus_file):
  env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken"), "JAXTRAIN_CACHE": str(tmp_path / "c"),
         "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
  line = _one_line_error(run_cli(*kh.cli_args(tmp_path / "run", corpus_file, 2),
                                 "--config.data.tokenizer=gpt2", env=env))
  assert line.startswith(f"error: config.data.tokenizer: gpt2: GPT-2's tokenizer is not in "
                         f"tiktoken's cache ({tmp_path / 'tiktoken'}) and could not be fetched (")
  assert line.endswith("where there is network, run python -c \"import tiktoken; "
                       "tiktoken.get_encoding('gpt2')\" once (set TIKTOKEN_CACHE_DIR to keep it "
                       "somewhere lasting), or pass the path of GPT-2's tokenizer.json")


def test_a_tiktoken_vocabulary_becomes_a_tokenizer_json_with_the_same_ids(corpus_file):
  import tiktoken

  trained = tokenizer_lib.train_bpe([corpus_file.read_text()], 400)
  fast = bpe_tiktoken.encoder(trained.hf_json(), trained._slow_ids)
  ranks = {b: fast.encode_single_token(b) for b in fast.token_byte_values()}
  enc = tiktoken.Encoding("gpt2-like", pat_str=bpe_tiktoken.GPT2_SPLIT, mergeable_ranks=ranks,
                          special_tokens={tokenizer_lib.EOT: trained.eot_id})
  tok = tokenizer_lib.HFTokenizer(bpe_tiktoken.to_hf_json(enc), name="gpt2")
  text = corpus_file.read_text()[:3000] + " héllo wörld 🙂 'll\n\n  x"
  assert tok.encode(text).tolist() == enc.encode_ordinary(text) == trained.encode(text).tolist()
  assert tok.decode(tok.encode(text)) == text
  assert tok.eot_id == trained.eot_id and tok.vocab_size == trained.vocab_size


@pytest.mark.slow
def test_a_latin1_file_gets_a_warning_with_its_share_and_the_fix(tmp_path):
  latin1 = tmp_path / "roman.txt"
  latin1.write_bytes("Un café très noir, s'il vous plaît. ".encode("latin-1") * 200)
  result = run_cli(*kh.cli_args(tmp_path / "run", latin1, 2))
  assert result.returncode == 0, result.stderr
  size = latin1.stat().st_size
  assert (f"warning: data: 8.3% of the bytes of {latin1} ({600:,} of {size:,}) are not UTF-8 and "
          "became U+FFFD, so the model learns that instead of its letters; if it is Latin-1, "
          f"convert it first: iconv -f latin1 -t utf-8 {latin1} > {tmp_path / 'roman.utf8.txt'}"
          ) in result.stdout.splitlines()


@pytest.mark.slow
def test_a_char_vocabulary_of_thousands_of_symbols_gets_a_note(tmp_path):
  text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 2000)) * 4
  (tmp_path / "han.txt").write_text(text, encoding="utf-8")
  result = run_cli(*kh.cli_args(tmp_path / "run", tmp_path / "han.txt", 1),
                   "--config.data.tokenizer=char", "--config.train.eval_steps=1")
  assert result.returncode == 0, result.stderr
  assert ("data: the char tokenizer found 2,000 different characters: the "
          "embedding and the head (vocabulary x model.d_model each) then hold most of a small "
          "model's params; --config.data.tokenizer=byte (256 ids) or bpe keeps them small"
          ) in result.stdout.splitlines()


@pytest.mark.slow
def test_the_dry_run_gives_the_time_here_and_warns_of_many_epochs(corpus_file, tmp_path):
  result = run_cli(*kh.cli_args(tmp_path / "run", corpus_file, 20000), "--dry_run")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  plan = next(x for x in lines if x.startswith("plan: 20000 steps"))
  epochs = float(plan.split(" epochs of the train split")[0].rsplit("(", 1)[1])
  assert epochs > 30
  assert (f"warning: plan: {epochs:.0f} epochs: the model sees each training token that many "
          "times and learns the text by heart (val loss rises again); give it more data "
          "(--config.data.path) or fewer steps (--config.train.max_steps)") in lines
  flops = float(plan.split(" FLOPs (")[0].rsplit(", ", 1)[1])
  time_line = next(x for x in lines if x.startswith("time: about "))
  assert " of training steps here, at 40% MFU (what the recipes reach) of " in time_line
  assert "float32 matmul measured on this cpu" in time_line
  peak = time_line.split(" of ")[2].split("FLOP/s")[0]  # e.g. 198.29G
  seconds = flops / (0.4 * float(peak[:-1]) * {"G": 1e9, "T": 1e12, "M": 1e6}[peak[-1]])
  said = time_line.split("about ")[1].split(" of training")[0]  # 41.2s, 1m14s or 2h05m
  # as fmt.duration rounds it (to a tenth of a second, a second or a minute) at whatever speed
  # this machine was measured; the peak is printed to 2 decimals (at most 0.5% off)
  unit = 60 if "h" in said else 1 if "m" in said else 0.05
  assert abs(fmt.parse_duration(said) - seconds) <= unit + 0.005 * seconds, (said, seconds)
  assert not (tmp_path / "run").exists()
  short = run_cli(*kh.cli_args(tmp_path / "run", corpus_file, 4), "--dry_run")
  assert not any(x.startswith("warning: plan:") for x in short.stdout.splitlines())


class _StopAtOnce(jt.Hook):
  def stop_reason(self) -> str:
    return "seen enough"


@pytest.mark.slow
def test_a_real_run_warns_of_many_epochs_in_its_first_lines(tmp_path, capsys):
  text = tmp_path / "small.txt"  # 3 kB: a few hundred steps are tens of epochs
  text.write_text("A line of a small text, said again and again.\n" * 64, encoding="utf-8")
  cfg = tiny_config(**{"workdir": str(tmp_path / "run"), "data.path": str(text), "headless": True,
                       "train.max_steps": 500, "sample.num_samples": 0})
  jt.run(cfg, hooks=[_StopAtOnce()])
  lines = capsys.readouterr().out.splitlines()
  warning = next(i for i, x in enumerate(lines) if x.startswith("warning: plan: "))
  assert lines[warning].endswith(" epochs: the model sees each training token that many times "
                                 "and learns the text by heart (val loss rises again); give it "
                                 "more data (--config.data.path) or fewer steps "
                                 "(--config.train.max_steps)")
  assert warning < lines.index("starting a new run at step 0")  # in the first lines, once
  assert sum(x.startswith("warning: plan: ") for x in lines) == 1


def test_a_command_is_named_as_the_user_started_it():
  assert invocation.command("jaxtrain", ["/usr/bin/python3", "/venv/bin/jaxtrain", "--help"]) \
      == "jaxtrain"
  assert invocation.command("jaxtrain.sample", ["python", "/venv/bin/jaxtrain-export"]) \
      == "jaxtrain-sample"  # the console scripts come together
  assert invocation.command("jaxtrain", ["python", "-m", "jaxtrain", "--help"]) \
      == "python -m jaxtrain"
  assert invocation.command("jaxtrain.export", ["python", "-X", "dev", "-mjaxtrain.export"]) \
      == "python -m jaxtrain.export"
  assert invocation.command("jaxtrain", ["python", "my_script.py"]) == "python -m jaxtrain"
  assert invocation.command("jaxtrain", ["python", "-c", "..."]) == "python -m jaxtrain"


@pytest.mark.slow
def test_the_installed_command_names_itself_in_help_hints_and_the_resume_line(corpus_file,
                                                                               tmp_path):
  script = Path(sys.executable).parent / "jaxtrain"
  if not script.is_file():
    pytest.skip("jaxtrain is not installed in this environment (pip install -e .)")
  shown = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=600)
  assert shown.stdout.startswith("usage: jaxtrain --config=FILE ")
  defaults = shown.stdout.split("Every field with its default: ")[1].split()[0]
  assert Path(defaults).is_file()
  wrong = subprocess.run([str(script), "--config=nano", "--max_steps=5"], capture_output=True,
                         text=True, timeout=600)
  assert wrong.returncode == 2 and wrong.stderr.startswith(
      "error: --max_steps is not a flag of jaxtrain; config fields are set as")
  args = kh.cli_args(tmp_path / "run", corpus_file, 500)
  proc = subprocess.Popen([str(script), *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
  for line in proc.stdout:
    if line.startswith("compiled and ran the first step"):
      proc.send_signal(signal.SIGINT)
      break
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 130
  assert out.splitlines()[-1] == f"to resume: jaxtrain {' '.join(args)}"
