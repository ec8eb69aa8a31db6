"""Chat records: the chat format's tokens and loss mask (assistant turns only), bad records in one
line, a tiny model that learns a two-turn chat task, `python -m jaxtrain.chat` driven through a
pipe, and the exported chat template that transformers renders to the same tokens.

The task: the user sends three random letters and a key letter ("xsvc?"), the assistant answers
the key's code ("C33"); then the user says "again" and the assistant repeats it, which only a
model that keeps the conversation can do."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT, run_cli
from test_export import make_run
from test_sample_cli import module, one_line_error

import jaxtrain as jt
from jaxtrain.checkpoints import hf, init_from, load
from jaxtrain.config import validate
from jaxtrain.data import chat_format, windows
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config
from jaxtrain.tools import export

KEYS, NOISE = "abcdefgh", "stuvwxyz"
SYSTEM = "Be terse."
CHAT = {"data.messages_field": "messages"}


def code(k: int) -> str:
  return KEYS[k].upper() + str(k + 1) * 2


def msg(role: str, content: str) -> dict:
  return {"role": role, "content": content}


def chats(n: int, seed: int) -> list[dict]:
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    noise, k = "".join(NOISE[i] for i in rng.integers(0, len(NOISE), 3)), int(rng.integers(0, 8))
    m = [msg("system", SYSTEM)] if rng.random() < 0.5 else []
    m += [msg("user", noise + KEYS[k] + "?"), msg("assistant", code(k)), msg("user", "again"),
          msg("assistant", code(k))]
    rows.append({"messages": m})
  return rows


def write_jsonl(path: Path, rows: list) -> Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def prepare(path: Path, tmp_path: Path, **kw) -> corpus_lib.Corpus:
  cfg = tiny_config(**{"data.path": str(path), "workdir": str(tmp_path / "w"), **CHAT, **kw})
  return corpus_lib.prepare(cfg.data, show_progress=False)


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
  """A tiny model trained on the chat task with configs/finetune_chat.py, from the command line."""
  root = tmp_path_factory.mktemp("chat")
  train = write_jsonl(root / "train.jsonl", chats(2000, seed=0))
  workdir = root / "run"
  proc = run_cli("--config=configs/finetune_chat.py", "--jax_platforms=cpu",
                 f"--config.data.path={train}", f"--config.workdir={workdir}",
                 "--config.headless=True", "--config.model.n_layers=2",
                 "--config.model.d_model=32", "--config.model.seq_len=64",
                 "--config.train.batch_size=16", "--config.optim.lr=1e-2",
                 "--config.optim.warmup_steps=10", "--config.train.max_steps=60",
                 "--config.train.eval_every=30", "--config.train.eval_steps=2",
                 "--config.train.checkpoint_every=1000")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return {"workdir": workdir, "stdout": proc.stdout, "train": train}


def test_only_assistant_turns_and_their_end_tokens_are_in_the_loss(tmp_path):
  rows = chats(40, seed=0)
  corpus = prepare(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path)
  tok = corpus.tokenizer
  assert tok.vocab_size == 260 and tok.eot_id == 255
  ids = chat_format.special_ids(tok)
  assert list(ids.values()) == [256, 257, 258, 259]  # after the 256 byte tokens
  tokens, mask = [], []
  for r in rows:  # built by hand: role token, content bytes, <|end|>; the record's end-of-text
    for m in r["messages"]:
      learn = int(m["role"] == "assistant")
      tokens += [ids[f"<|{m['role']}|>"], *m["content"].encode(), ids["<|end|>"]]
      mask += [0] + [learn] * len(m["content"].encode()) + [learn]
    tokens.append(tok.eot_id)
    mask.append(0)
  assert np.array_equal(corpus.tokens, tokens) and np.array_equal(corpus.mask, mask)
  assert corpus.n_docs == 40
  # The chat format's own encoding is a record's tokens, less the end-of-text.
  first = len(chat_format.encode(tok, rows[0]["messages"]))
  assert np.array_equal(chat_format.encode(tok, rows[0]["messages"]), corpus.tokens[:first])
  assert corpus.tokens[first] == tok.eot_id
  # Batches weigh each target by its token's mask: 0 on system and user turns and role tokens.
  batch = windows.WindowBatches(corpus.train, 4, 16, 0, 0, mask=corpus.split_mask(True))[2]
  starts = np.random.default_rng([0, 0, 2]).integers(0, len(corpus.train) - 16, size=4)
  at = starts[:, None] + np.arange(1, 17)
  assert np.array_equal(batch["weights"], np.asarray(mask, np.float32)[at])
  assert 0 < batch["weights"].mean() < 0.5


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_every_tokenizer_gets_the_chat_tokens_after_its_own(kind, tmp_path):
  rows = chats(200, seed=0)
  corpus = prepare(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path,
                   **{"data.tokenizer": kind, "data.vocab_size": 300})
  tok = corpus.tokenizer
  ids = chat_format.special_ids(tok)
  assert sorted(ids.values()) == list(range(tok.vocab_size - 4, tok.vocab_size))
  assert tok.eot_id < tok.vocab_size - 4
  text = tok.decode(corpus.tokens[:len(chat_format.encode(tok, rows[0]["messages"])) + 1])
  turns = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in rows[0]["messages"])
  assert text == turns + tokenizer_lib.EOT
  # The mask holds the assistant turns' tokens and their <|end|>s, nothing else.
  learned = corpus.tokens[corpus.mask == 1]
  assert tok.decode(learned) == "".join(f"{m['content']}<|end|>" for r in rows
                                        for m in r["messages"] if m["role"] == "assistant")


GOOD = {"messages": [msg("user", "hi"), msg("assistant", "yo")]}


@pytest.mark.parametrize("bad, message", [
    ({"text": "hi"}, r"c.jsonl line 3 has no field 'messages' \(it has: text\); pass "
                     "--config.data.messages_field=<the field with the messages>"),
    ({"messages": "hi"}, r"c.jsonl line 3: 'messages' is str, not a list of \{role, content\} "
                         "messages"),
    ({"messages": ["hi", msg("assistant", "yo")]}, "line 3: 'messages' message 1 is str, not an "
                                                   "object with role and content"),
    ({"messages": [{"role": "user"}, msg("assistant", "yo")]}, "line 3: 'messages' message 1 has "
                                                               "no 'content' \\(it has: role\\)"),
    ({"messages": [msg("user", "hi"), {"role": "assistant", "content": 3}]},
     "line 3: 'messages' message 2: 'content' is int, not text"),
    ({"messages": [msg("bot", "hi"), msg("assistant", "yo")]},
     "line 3: 'messages' message 1 has role 'bot'; roles are system, user, assistant"),
    ({"messages": [msg("system", "s"), msg("user", "hi")]},
     "line 3: 'messages' has no assistant turn \\(nothing in it would be learned\\)"),
])
def test_a_bad_chat_record_is_one_line_naming_the_file_and_line(bad, message, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [GOOD] * 2 + [bad] + [GOOD] * 40)
  with pytest.raises(UserError, match=message) as e:
    prepare(path, tmp_path)
  assert "\n" not in str(e.value)


def test_parquet_chats_read_as_jsonl_do_and_a_bad_row_is_named(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  rows = chats(60, seed=0)
  pq.write_table(pa.table({"messages": [r["messages"] for r in rows]}), tmp_path / "c.parquet")
  from_parquet = prepare(tmp_path / "c.parquet", tmp_path)
  from_jsonl = prepare(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path)
  assert np.array_equal(from_parquet.tokens, from_jsonl.tokens)
  assert np.array_equal(from_parquet.mask, from_jsonl.mask)
  bad = [r["messages"] for r in rows[:4]] + [[msg("user", "no answer")]]
  pq.write_table(pa.table({"messages": bad}), tmp_path / "bad.parquet")
  with pytest.raises(UserError, match="bad.parquet row 5: 'messages' has no assistant turn"):
    prepare(tmp_path / "bad.parquet", tmp_path)
  pq.write_table(pa.table({"messages": ["a string"]}), tmp_path / "text.parquet")
  with pytest.raises(UserError, match="column 'messages' holds string, not lists of messages"):
    prepare(tmp_path / "text.parquet", tmp_path)


def test_chat_config_is_checked_up_front(tmp_path):
  both = {**CHAT, "data.prompt_field": "q", "data.completion_field": "a"}
  with pytest.raises(ConfigError, match="data.messages_field.*so are the prompt/completion "
                                        "fields") as e:
    validate.validate(tiny_config(**both))
  assert e.value.field == "data.messages_field"
  with pytest.raises(ConfigError, match="data.mixture.*chat records"):
    validate.validate(tiny_config(**CHAT, **{"data.mixture": f"{tmp_path}:1"}))
  text = tmp_path / "plain.txt"
  text.write_text("some text\n" * 100)
  with pytest.raises(UserError, match="plain.txt is a text file; chat records"):
    prepare(text, tmp_path)


@pytest.mark.slow
def test_a_chat_run_starts_from_a_text_run_with_the_chat_tokens_added(tmp_path, capsys):
  untied = {"model.tie_embeddings": False}
  source = tmp_path / "text"
  before = hf.flatten(jax.device_get(make_run(source, tiny_config(**untied)).params))  # byte
  tok = chat_format.with_chat(tokenizer_lib.ByteTokenizer())
  c = jt.ModelConfig.from_config(tiny_config(**untied).model, tok.vocab_size)
  flat, what = init_from.load_flat(str(source), c, tok)
  wte, head = before["wte/embedding"], before["lm_head/kernel"]
  assert flat["wte/embedding"].shape == (260, 32) and flat["lm_head/kernel"].shape == (32, 260)
  assert np.array_equal(flat["wte/embedding"][:256], wte)
  assert np.array_equal(flat["lm_head/kernel"][:, :256], head)
  np.testing.assert_allclose(flat["wte/embedding"][256:], np.tile(wte.mean(0), (4, 1)), rtol=1e-6)
  np.testing.assert_allclose(flat["lm_head/kernel"][:, 256:], np.tile(head.mean(1)[:, None], 4),
                             rtol=1e-6)
  assert "4 new token embeddings (the chat tokens)" in what
  with pytest.raises(UserError, match="another tokenizer"):  # any other tokenizer: as before
    init_from.load_flat(str(source), c, chat_format.with_chat(tokenizer_lib.CharTokenizer("abc")))
  # And a chat run starts from it.
  cfg = tiny_config(**untied, **CHAT, **{"workdir": str(tmp_path / "chat"), "init_from": str(source),
                                         "data.path": str(write_jsonl(tmp_path / "c.jsonl",
                                                                      chats(300, seed=0))),
                                         "train.max_steps": 2, "headless": True,
                                         "sample.num_samples": 0})
  assert jt.run(cfg).step == 2
  assert "with 4 new token embeddings (the chat tokens)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_tiny_model_learns_the_chat_task_and_keeps_the_conversation(chat_run):
  out = chat_run["stdout"]
  assert "data: chat records ('messages')" in out and "count in the loss" in out
  assert "eval step 60: val loss on assistant turns" in out
  state, tok = load.load(str(chat_run["workdir"]))
  assert state.model_cfg.doc_mask and tok.vocab_size == 260
  first = again = 0
  held = chats(24, seed=1)
  for r in held:
    m = r["messages"]
    i = m.index(next(x for x in m if x["role"] == "user"))
    reply = jt.chat_reply(state, tok, m[:i + 1], 16, temperature=0)
    repeat = jt.chat_reply(state, tok, [*m[:i + 1], msg("assistant", reply), m[i + 2]], 16,
                           temperature=0)
    first += reply == m[i + 1]["content"]
    again += repeat == reply == m[i + 1]["content"]
  assert first >= 0.8 * len(held) and again >= 0.8 * len(held), (first, again)
  metrics = [json.loads(line) for line in open(chat_run["workdir"] / "metrics.jsonl")]
  evals = [m["val_loss"] for m in metrics if "val_loss" in m]
  assert evals[-1] < 0.3 < evals[0]


@pytest.mark.slow
def test_the_chat_command_answers_through_a_pipe_and_stops_at_the_end_of_its_turn(chat_run,
                                                                                  tmp_path):
  workdir = f"--workdir={chat_run['workdir']}"
  proc = module("jaxtrain.chat", workdir, "--temperature=0", f"--system={SYSTEM}",
                stdin="xsvc?\n\nagain\n")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "C33\nC33\n", proc.stdout  # one line a message; the empty one skipped
  assert "Traceback" not in proc.stderr and "step 60 of" in proc.stderr
  # A run trained on plain text has no chat tokens: refused in one line.
  make_run(tmp_path / "text", tiny_config())
  one_line_error(module("jaxtrain.chat", f"--workdir={tmp_path / 'text'}", stdin="hi\n"),
                 "was not trained on chat records", "--config.data.messages_field")


@pytest.mark.slow
def test_ctrl_c_ends_the_chat_command_with_130_and_no_traceback(chat_run):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen([sys.executable, "-m", "jaxtrain.chat", "--jax_platforms=cpu",
                           f"--workdir={chat_run['workdir']}", "--temperature=0"], cwd=ROOT,
                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  proc.stdin.write("xsvc?\n")
  proc.stdin.flush()
  assert proc.stdout.readline() == "C33\n"  # answered; now it waits for the next message
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == 130 and "Traceback" not in err, err


TRICKY = [msg("user", "say <|end|> or <|endoftext|>"), msg("assistant", "<|user|>!")]


def test_transformers_chat_template_gives_jaxtrains_tokens(tmp_path):
  transformers = pytest.importorskip("transformers")
  messages = [msg("system", SYSTEM), msg("user", "xsvc? é\nok"), msg("assistant", "C33"),
              msg("user", "again")]
  for base in (tokenizer_lib.ByteTokenizer(),
               tokenizer_lib.CharTokenizer("".join(m["content"] for m in messages + TRICKY)),
               tokenizer_lib.train_bpe([json.dumps(m) for m in messages] * 20, 300)):
    tok = chat_format.with_chat(base)
    (tmp_path / base.name).mkdir()
    export.write_tokenizer(tok, tmp_path / base.name)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / base.name))
    for prompt in (False, True):
      ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt,
                                       return_dict=False)
      assert ids == chat_format.encode(tok, messages, prompt).tolist(), (base.name, prompt)
    with pytest.raises(Exception, match="roles are system, user and assistant, not bot"):
      hf_tok.apply_chat_template([msg("bot", "hi")], tokenize=False)
    # Message text that spells a special token is text to jaxtrain; to transformers too when
    # asked to sanitize (exactly the same tokens where no BPE merge spans its edges).
    if base.name != "bpe":
      ids = hf_tok.apply_chat_template(TRICKY, tokenize=True, return_dict=False,
                                       sanitize_control_tokens=True)
      assert ids == chat_format.encode(tok, TRICKY).tolist(), base.name
  # A tokenizer without the chat tokens exports no template.
  (tmp_path / "plain").mkdir()
  export.write_tokenizer(tokenizer_lib.ByteTokenizer(), tmp_path / "plain")
  assert "chat_template" not in json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())


@pytest.mark.slow
def test_an_exported_chat_model_replies_in_transformers_as_in_jaxtrain(chat_run, tmp_path):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  out = export.export(str(chat_run["workdir"]), str(tmp_path / "hf"))
  state, tok = load.load(str(chat_run["workdir"]))
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
  end = chat_format.special_ids(tok)[chat_format.END]
  for r in chats(4, seed=2):
    turn = r["messages"][:[m["role"] for m in r["messages"]].index("assistant")]
    ids = hf_tok.apply_chat_template(turn, tokenize=True, add_generation_prompt=True,
                                     return_dict=False)
    assert ids == chat_format.encode(tok, turn, add_generation_prompt=True).tolist()
    with torch.no_grad():
      made = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):]
    assert made.tolist()[-1] == end  # stopped at the end of the assistant's turn
    assert hf_tok.decode(made[:-1]) == jt.chat_reply(state, tok, turn, 12, temperature=0)


@pytest.mark.slow
def test_an_unreadable_system_file_names_the_system_flag(tmp_path):
  proc = module("jaxtrain.chat", f"--workdir={tmp_path}", f"--system=@{tmp_path / 'none.txt'}")
  one_line_error(proc, "cannot read the system file", "pass --system=@<a UTF-8 text file>")


@pytest.mark.slow
def test_a_conversation_longer_than_the_context_keeps_its_latest_exchanges(chat_run):
  """seq_len 64, replies of up to 256 tokens: the conversation keeps what fits in half the context
  (fit.room), the earliest exchanges left out (one note says so), and every "again" is answered
  right.
  A reply used to see a window that had slid past the turn it repeats (A11 for C33)."""
  proc = module("jaxtrain.chat", f"--workdir={chat_run['workdir']}", "--temperature=0",
                f"--system={SYSTEM}", stdin="xsvc?\n" + "again\n" * 7)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "C33\n" * 8, proc.stdout
  notes = [x for x in proc.stderr.splitlines() if x.startswith("note:")]
  assert notes == ["note: the conversation is 43 tokens; with --max_new_tokens=256, the model's "
                   "context (model.seq_len=64) holds 32, so from now on its earliest exchanges "
                   "are left out, as many as it takes"], proc.stderr  # said once
