"""A prompt longer than the model's context is never cut silently: sample and its --prompts keep
the prompt's last tokens and say so in one line, chat leaves out the earliest exchanges (and says
so) or refuses a message that cannot fit, eval and train.eval_tasks leave out and count a record
that does not fit, the samples at a run's end say it too. All through generation/fit.py.

A tiny byte-level model (seq_len 32) with noisy params: its greedy text is deterministic."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
from test_export import make_run
from test_sample_cli import module, one_line_error

from jaxtrain.checkpoints import load
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.evals import scoring, tasks
from jaxtrain.generation import decode, fit, reply, samples
from jaxtrain.system.errors import UserError
from jaxtrain.testing import tiny_config

SEQ = 32
LONG = "the quick brown fox jumps over a lazy dog, " * 2  # 86 bytes: more than the context


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
  workdir = tmp_path_factory.mktemp("fit") / "run"
  make_run(workdir, tiny_config(), chat_format.with_chat(tokenizer_lib.ByteTokenizer()))
  return workdir


def greedy(state, text: str, n: int) -> np.ndarray:
  ids = np.asarray(list(text.encode()), np.int32)[None, :]
  return decode.generate(state, ids, n, temperature=0.0)[0, ids.shape[1]:]


def test_the_room_leaves_the_continuation_its_place_and_at_least_half_the_context():
  assert fit.room(SEQ, 4) == 28 and fit.room(SEQ, 16) == 16
  assert fit.room(SEQ, 30) == fit.room(SEQ, 500) == 16  # a longer one slides the window anyway
  assert fit.cut_line("the prompt", 28, "--max_new_tokens", 4, SEQ) is None
  assert fit.cut_line("the prompt", 30, "--max_new_tokens", 4, SEQ) == (
      "note: the prompt is 30 tokens; with --max_new_tokens=4, the model's context "
      "(model.seq_len=32) holds its last 28, so the first 2 are not seen (--max_new_tokens=2 or "
      "fewer keeps it whole)")
  assert fit.fits(SEQ + 1, SEQ) and not fit.fits(SEQ + 2, SEQ)


@pytest.mark.slow
def test_sample_keeps_the_end_of_a_long_prompt_and_says_so(run):
  proc = module("jaxtrain.sample", f"--workdir={run}", f"--prompt={LONG}", "--max_new_tokens=4",
                "--temperature=0")
  assert proc.returncode == 0, proc.stderr
  assert f"note: the prompt is {len(LONG)} tokens; with --max_new_tokens=4, the model's context " \
      f"(model.seq_len=32) holds its last 28, so the first {len(LONG) - 28} are not seen\n" \
      in proc.stderr
  state, tok = load.load(str(run))
  assert proc.stdout == LONG + tok.decode(greedy(state, LONG[-28:], 4)) + "\n"
  # Past the context the window slides: the summary line says what the new tokens saw.
  proc = module("jaxtrain.sample", f"--workdir={run}", "--prompt=ab", "--max_new_tokens=40",
                "--temperature=0")
  assert proc.returncode == 0 and "note:" not in proc.stderr, proc.stderr
  assert proc.stderr.splitlines()[-1].endswith(
      "; past the model's context (model.seq_len=32), each new token saw only the latest 16 to 32 "
      "tokens")


@pytest.mark.slow
def test_batched_completions_keep_the_end_of_a_long_prompt_and_name_its_line(run, tmp_path):
  prompts = tmp_path / "p.jsonl"
  prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("ab", LONG, LONG[-27:])))
  proc = module("jaxtrain.sample", f"--workdir={run}", f"--prompts={prompts}", "--max_new_tokens=4",
                "--temperature=0")
  assert proc.returncode == 0, proc.stderr
  assert "note: 1 of 3 prompts are longer than 28 tokens (line 2); with --max_new_tokens=4, the " \
      "model's context (model.seq_len=32) holds each one's last 28, so their first tokens are not " \
      "seen\n" in proc.stderr
  rows = [json.loads(x) for x in prompts.with_suffix(".completions.jsonl").read_text().splitlines()]
  assert rows[1]["prompt"] == LONG
  state, tok = load.load(str(run))
  # Line 3 fits: its 27 characters after the end-of-text token that starts a document are 28.
  assert rows[1]["completion"] == tok.decode(greedy(state, LONG[-28:], 4))


@pytest.mark.slow
def test_eval_leaves_out_and_counts_a_record_longer_than_the_context(run, tmp_path):
  records = [{"prompt": "ab", "completion": "cd"}, {"prompt": LONG, "completion": "x"},
             {"context": "ab", "endings": ["c", LONG], "label": 0}, {"prompt": "ef", "completion": "g"}]
  data = tmp_path / "held.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in records))
  out = tmp_path / "r.json"
  proc = module("jaxtrain.eval", f"--workdir={run}", f"--data={data}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr
  assert f"warning: 2 of 4 records of {data} do not fit the model's context (model.seq_len=32) " \
      "with their completion or endings (lines 2, 3): left out of the scores\n" in proc.stderr
  result = json.loads(out.read_text())
  assert result["n_too_long"] == 2 and result["too_long_lines"] == [2, 3]
  assert result["n_completions"] == 2 and result["n_multiple_choice"] == 0
  state, tok = load.load(str(run))
  fitting = tmp_path / "fitting.jsonl"
  fitting.write_text("".join(json.dumps(records[i]) + "\n" for i in (0, 3)))
  alone = scoring.evaluate(state, tok, str(fitting))
  assert (result["loss"], result["exact_match"]) == (alone["loss"], alone["exact_match"])
  data.write_text(json.dumps(records[1]) + "\n")
  one_line_error(module("jaxtrain.eval", f"--workdir={run}", f"--data={data}"),
                 f"no record of {data} fits the model's context (model.seq_len=32)")


@pytest.mark.slow
def test_task_scores_in_a_run_say_what_they_left_out(run, tmp_path):
  state, tok = load.load(str(run))
  pairs = [(1, "ab", "cd"), (2, LONG, "x")]
  said = []
  record = tasks.score([tasks.Task("held", "held.jsonl", pairs, [], 2)], state, tok, said.append)
  assert record["task/held/exact_match"] in (0.0, 1.0)
  assert " of 1 | loss " in said[0]
  assert said[0].endswith("; 1 of 2 records of held.jsonl do not fit the model's context "
                          "(model.seq_len=32) with their completion or endings (line 2): left out "
                          "of the scores")
  said.clear()
  tasks.score([tasks.Task("held", "held.jsonl", pairs[1:], [], 1)], state, tok, said.append)
  assert said[0].startswith("eval step 0 task held: nothing scored (")


def msg(role: str, content: str) -> dict:
  return {"role": role, "content": content}


@pytest.mark.slow
def test_chat_leaves_out_the_earliest_exchanges_and_keeps_the_system_message(run):
  state, tok = load.load(str(run))
  system, old, new = msg("system", "hi"), [msg("user", "abcdef"), msg("assistant", "ghijk")], \
      [msg("user", "lmn")]
  kept, dropped = reply.fit_turns(state, tok, [system, *old, *new], 4)
  assert (kept, dropped) == ([system, *old, *new], 0)  # 26 tokens: they fit beside 4 new ones
  kept, dropped = reply.fit_turns(state, tok, [system, *old, *old, *new], 4)
  assert (kept, dropped) == ([system, *old, *new], 1)
  assert len(reply.context(state, tok, kept)) <= fit.room(SEQ, 4)
  with pytest.raises(UserError, match=r"^this message and the system message before it are 43 "
                     r"tokens; with --max_new_tokens=4, the model's context \(model.seq_len=32\) "
                     r"holds 28: send a shorter one, or pass a smaller --max_new_tokens$"):
    reply.fit_turns(state, tok, [system, *old, msg("user", LONG[:35])], 4, "--max_new_tokens")


@pytest.mark.slow
def test_the_chat_command_says_what_it_left_out_and_refuses_a_message_too_long(run):
  # 15 tokens a message (an end-of-text token, <|user|>, 11 bytes, <|end|>, <|assistant|>): the
  # second with the first exchange passes the 28 the context holds beside 4 new tokens.
  proc = module("jaxtrain.chat", f"--workdir={run}", "--temperature=0", "--max_new_tokens=4",
                stdin=f"abcdefghijk\nlmnopqrstuv\n{LONG}\nqr\n")
  assert proc.returncode == 0, proc.stderr
  err = [x for x in proc.stderr.splitlines() if x.startswith(("note:", "error:"))]
  assert err[0].startswith("note: the conversation is ")
  assert err[0].endswith("with --max_new_tokens=4, the model's context (model.seq_len=32) holds "
                         "28, so from now on its earliest exchanges are left out, as many as it "
                         "takes")
  assert err[1] == f"error: this message is {len(LONG) + 4} tokens; with --max_new_tokens=4, the " \
      "model's context (model.seq_len=32) holds 28: send a shorter one, or pass a smaller " \
      "--max_new_tokens"
  assert len(err) == 2  # asked again after the refusal; the last message fits


@pytest.mark.slow
def test_the_samples_at_a_runs_end_say_when_their_prompt_is_cut(run, tmp_path):
  state, tok = load.load(str(run))
  cfg = tiny_config(**{"sample.prompt": LONG, "sample.num_samples": 1, "sample.max_new_tokens": 8,
                       "sample.temperature": 0.0})

  class Out:
    def __init__(self):
      self.text = io.StringIO()

    def print(self, line: str) -> None:
      self.text.write(line + "\n")

  out = Out()
  samples.write_samples(cfg.sample, SEQ, 0, state, np.zeros(100, np.int32), tok, tmp_path, out)
  lines = out.text.getvalue().splitlines()
  assert lines[0] == f"note: sample.prompt is {len(LONG)} tokens; with sample.max_new_tokens=8, " \
      f"the model's context (model.seq_len=32) holds its last 24, so the first {len(LONG) - 24} " \
      "are not seen"
