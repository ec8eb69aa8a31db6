"""`jaxtrain-serve`: rows decoded together make the tokens `jt.generate` makes for each prompt
alone; requests checked whole into OpenAI's error shape; and, against a real server process, the
official `openai` client completing, chatting and streaming, raw HTTP's bad input, a client that
leaves mid-stream, 100 requests at once, the chat page in headless Chromium, a damaged newest
checkpoint and a run still training said at start-up, SIGTERM and Ctrl-C draining what is in
flight, a Ctrl-C that Python dropped while compiling, and the one line that says how to install
the serve extra."""

import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, with_root_on_path
from test_decode import _lively

import jaxtrain as jt
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.serving import requests, served
from jaxtrain.serving.engine import Engine
from jaxtrain.serving.flight import Text
from jaxtrain.serving.requests import ApiError, Limits
from jaxtrain.serving.scheduler import Full, Row, Scheduler
from jaxtrain.system import lock
from jaxtrain.system.errors import UserError
from jaxtrain.testing import init, tiny_config

LIMITS = Limits(max_tokens=64, rows=4)


@pytest.mark.parametrize("body,status,param", [
    ([1], 400, None),
    ({}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [[1, 2], []]}, 400, "prompt"),
    ({"prompt": [1, True]}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "16"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -0.1}, 400, "temperature"),
    ({"prompt": "x", "temperature": float("nan")}, 400, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "n": 5}, 400, "n"),
    ({"prompt": ["a", "b", "c"], "n": 2}, 400, "prompt"),
    ({"prompt": "x", "seed": 2**32}, 400, "seed"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"prompt": "x", "stop": [""]}, 400, "stop"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": 1}}, 400, "stream_options"),
    ({"prompt": "x", "tempreature": 1}, 400, "tempreature"),
    ({"prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": "x", "messages": []}, 400, "messages"),
])
def test_a_bad_completion_request_is_an_openai_error_naming_its_field(body, status, param):
  with pytest.raises(ApiError) as caught:
    requests.parse(body, "completion", LIMITS)
  e = caught.value
  assert (e.status, e.param) == (status, param), e.message
  assert set(e.body()["error"]) == {"message", "type", "param", "code"} and e.message


@pytest.mark.parametrize("messages,param", [
    (None, "messages"), ([], "messages"), (["hi"], "messages[0]"),
    ([{"role": "robot", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "messages[0]"),
])
def test_a_bad_conversation_is_an_openai_error_naming_the_message(messages, param):
  with pytest.raises(ApiError) as caught:
    requests.parse({"messages": messages}, "chat", LIMITS)
  assert (caught.value.status, caught.value.param) == (400, param), caught.value.message


def test_a_good_request_takes_openais_defaults_and_idle_fields():
  ask = requests.parse({"prompt": [[1, 2], [3]], "logprobs": None, "presence_penalty": 0.0,
                        "user": "me", "stop": "\n", "max_tokens": None}, "completion", LIMITS)
  assert (ask.prompts, ask.max_tokens, ask.temperature, ask.top_p, ask.n) == ([[1, 2], [3]], 16, 1.0, 1.0, 1)
  assert ask.stop == ("\n",) and ask.seed is None and not ask.stream and not ask.chat
  chat = requests.parse({"messages": [{"role": "developer", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                      {"role": "assistant", "content": None}],
                         "max_completion_tokens": 9, "stream": True, "tools": [],
                         "stream_options": {"include_usage": True}}, "chat", LIMITS)
  assert chat.prompts == [[{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]]
  assert chat.max_tokens == 9 and chat.stream and chat.include_usage


def test_a_choices_text_ends_before_a_stop_string_and_holds_back_its_start():
  text = Text(tokenizer_lib.ByteTokenizer(), ("END", "\n\n"))
  ids = lambda s: list(s.encode())  # noqa: E731
  assert text.add(ids("Hello E"), last=False) == ("Hello ", False)  # "E" may start END
  assert text.add(ids("N"), last=False) == ("", False)
  assert text.add(ids("Dx more"), last=False) == ("", True)  # "Hello " then END: nothing after
  assert text.shown == "Hello "
  euro = "€".encode()
  text = Text(tokenizer_lib.ByteTokenizer(), ())
  assert text.add([*ids("a"), euro[0]], last=False) == ("a", False)  # the rest of € is to come
  assert text.add(list(euro[1:]), last=True) == ("€", False)


@pytest.fixture(scope="module")
def lively():
  """A tiny model with noise on its params (every token matters), 32 tokens of context, and the
  switches whose caches hold more than keys and values (convolutions, x0-mix; GQA, QK-norm)."""
  return _lively(init(tiny_config(**{"model.seq_len": 32, "model.n_layers": 2, "model.canon": 3,
                                     "model.x0_mix": True, "model.n_kv_heads": 2,
                                     "model.qk_norm": True})))


SETTINGS = [dict(temperature=0.0, top_k=0, top_p=1.0, seed=0),
            dict(temperature=0.8, top_k=0, top_p=1.0, seed=5),
            dict(temperature=0.9, top_k=20, top_p=0.9, seed=7),
            dict(temperature=1.0, top_k=0, top_p=0.0, seed=3)]


@pytest.mark.slow  # compiles the engine's programs and generate's for four settings
def test_rows_decoded_together_make_the_tokens_generate_makes_for_each_alone(lively):
  prompts = [np.random.default_rng(i).integers(0, 256, n).astype(np.int32)
             for i, n in enumerate((3, 17, 30, 8))]
  engine = Engine(lively, rows=4, max_tokens=40, steps=8)
  made = {i: [] for i in range(4)}
  engine.admit(0, prompts[0], **SETTINGS[0])
  first = engine.advance()
  assert first.shape == (1, 8)  # one live row: a one-row advance
  made[0] += first[0].tolist()  # the others join one advance later, at other lengths
  for i in (1, 2, 3):
    engine.admit(i, prompts[i], **SETTINGS[i])
  for _ in range(5):  # 40 tokens: every prompt passes the 32-token window, which restarts
    for i, row in enumerate(engine.advance()):
      made[i] += row.tolist()
  for i, prompt in enumerate(prompts):
    alone = jt.generate(lively, prompt, 40, **SETTINGS[i])[len(prompt):]
    np.testing.assert_array_equal(made[i][:40], alone, err_msg=f"row {i}: {SETTINGS[i]}")
  assert len(set(made[0][:40])) > 5, "a degenerate model proves nothing"


@pytest.mark.slow
def test_the_scheduler_batches_requests_as_they_come_and_bounds_its_queue(lively):
  said, got = [], {}
  sched = Scheduler(Engine(lively, rows=2, max_tokens=20, steps=4), queue_limit=2, say=said.append)
  prompts = [np.random.default_rng(10 + i).integers(0, 256, 5 + 3 * i).astype(np.int32) for i in range(5)]
  done = threading.Event()

  def row(i: int, max_tokens: int, stop_ids=frozenset()) -> Row:
    def deliver(tokens, finish):
      got.setdefault(i, []).extend(tokens)
      if finish:
        got[(i, "finish")] = finish
        if sum(1 for k in got if isinstance(k, tuple)) == 4:
          done.set()
    return Row(prompt=prompts[i], max_tokens=max_tokens, stop_ids=stop_ids, deliver=deliver,
               **SETTINGS[i % 3])

  first = jt.generate(lively, prompts[0], 20, **SETTINGS[0])[len(prompts[0]):]
  rows = [row(0, 20, frozenset({int(first[7])})), row(1, 13), row(2, 20)]
  sched.submit(rows)  # three rows, two places: one will wait
  with pytest.raises(Full):
    sched.submit([row(3, 5), row(4, 5)])  # two places, and two may wait beyond them
  sched.start()
  time.sleep(0.5)
  sched.submit([row(3, 11)])  # arrives while the others decode
  assert done.wait(120), (got, said)
  sched.stop()
  stop_at = list(first).index(first[7])
  assert got[0] == list(first[:stop_at]) and got[(0, "finish")] == "stop"
  for i, n in ((1, 13), (2, 20), (3, 11)):
    alone = jt.generate(lively, prompts[i], n, **SETTINGS[i % 3])[len(prompts[i]):]
    assert got[i] == alone.tolist() and got[(i, "finish")] == "length", i
  assert said == [] and sched.finished == 4


def test_a_port_in_use_is_one_line():
  from jaxtrain.tools import serve

  taken = serve._bind("127.0.0.1", 0)
  try:
    with pytest.raises(UserError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*pass another --port"):
      serve._bind("127.0.0.1", taken.getsockname()[1])
  finally:
    taken.close()


# --- against a real server process ---------------------------------------------------------------

@pytest.fixture(scope="module")
def char_run(corpus_file, tmp_path_factory) -> Path:
  """A tiny char-vocabulary model trained 30 steps, checkpoints at 15 and 30."""
  workdir = tmp_path_factory.mktemp("serve") / "tiny"
  jt.run(tiny_config(**{"workdir": str(workdir), "data.path": str(corpus_file), "headless": True,
                        "data.tokenizer": "char", "train.max_steps": 30, "train.eval_every": 15,
                        "train.checkpoint_every": 15, "optim.lr": 1e-2}), show_progress=False)
  return workdir


class Server:
  """`python -m jaxtrain.serve ARGS` on a free port, its stderr read as it comes."""

  def __init__(self, *args: str):
    self.proc = subprocess.Popen([sys.executable, "-m", "jaxtrain.serve", "--port=0", *args],
                                 cwd=ROOT, env=with_root_on_path(dict(os.environ, PYTHONUNBUFFERED="1")),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.lines: list[str] = []
    threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()
    deadline = time.monotonic() + 300
    while not any(line.startswith("serving ") for line in self.lines):
      assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines)
      time.sleep(0.1)
    line = next(line for line in self.lines if line.startswith("serving "))
    self.url = line.split(" at ")[1].split("/v1")[0]
    self.host, self.port = self.url.removeprefix("http://").split(":")

  def request(self, method: str, path: str, body=None, raw: bytes | None = None,
              headers: dict | None = None, timeout: float = 120) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection(self.host, int(self.port), timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, dict(response.getheaders()), text

  def stop(self) -> int:
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
    try:
      return self.proc.wait(60)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()


@pytest.fixture(scope="module")
def server(char_run):
  s = Server(f"--workdir={char_run}", "--batch_size=4", "--queue=8", "--max_tokens=64")
  yield s
  s.stop()


def _client(server: Server, key: str = "none"):
  openai = pytest.importorskip("openai", reason="the test extras install the openai client")
  return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.mark.slow
def test_the_openai_client_completes_chats_and_streams(server, char_run):
  client = _client(server)
  (card,) = client.models.list().data
  assert card.id == "tiny" and card.model_extra["jaxtrain"]["chat"] is False
  assert card.model_extra["jaxtrain"]["prompt_format"] == served.PLAIN
  state, tok = jt.load_state(str(char_run)), jt.load_tokenizer(str(char_run))
  alone = jt.generate(state, "The quick", 24, tokenizer=tok, temperature=0.0)[len("The quick"):]
  done = client.completions.create(model="tiny", prompt="The quick", max_tokens=24, temperature=0)
  assert done.choices[0].text == alone and done.choices[0].finish_reason == "length"
  assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (9, 24)
  streamed = client.completions.create(model="tiny", prompt="The quick", max_tokens=24,
                                       temperature=0, stream=True)
  parts = [(c.choices[0].text, c.choices[0].finish_reason) for c in streamed]
  assert "".join(t for t, _ in parts) == alone and parts[-1][1] == "length" and len(parts) > 2
  stop = alone[5:8]
  cut = client.completions.create(model="tiny", prompt="The quick", max_tokens=24, temperature=0,
                                  stop=[stop], echo=True)
  assert cut.choices[0].text == "The quick" + alone[:alone.index(stop)]
  assert cut.choices[0].finish_reason == "stop"
  sampled = client.completions.create(model="tiny", prompt="The quick", max_tokens=16,
                                      temperature=0.9, top_p=0.95, seed=3, n=2)
  for i, choice in enumerate(sampled.choices):  # choice i: seed + i, as the sample command
    assert choice.text == jt.generate(state, "The quick", 16, tokenizer=tok, temperature=0.9,
                                      top_p=0.95, seed=3 + i)[len("The quick"):]
  chat = client.chat.completions.create(model="tiny", max_tokens=12, temperature=0,
                                        messages=[{"role": "user", "content": "The quick"}])
  assert chat.choices[0].message.content == alone[:12]
  chunks = list(client.chat.completions.create(
      model="tiny", max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True},
      messages=[{"role": "user", "content": "The quick"}]))
  assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == 12
  assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == alone[:12]
  long = client.completions.create(model="tiny", prompt="the sea " * 10, max_tokens=8, temperature=0)
  assert long.usage.prompt_tokens == 24 and "the first 56 are not seen" in \
      long.model_extra["jaxtrain"]["notes"][0]  # 80 tokens; 32 of context less 8 to make
  chunks = list(client.completions.create(model="tiny", prompt="the sea " * 10, max_tokens=8,
                                          temperature=0, stream=True))
  assert [bool(c.model_extra.get("jaxtrain")) for c in chunks] == [True] + [False] * (len(chunks) - 1)


@pytest.mark.slow
def test_bad_input_gets_an_openai_error_and_never_a_traceback(server):
  cases = [  # (raw body, status, words of the message)
      (b"{bad json", 400, "not JSON"), (b"\xff\xfe", 400, "not JSON"), (b"[]", 400, "not a JSON object"),
      (b'{"prompt": "x", "max_tokens": -5}', 400, "max_tokens: -5"),
      (b'{"prompt": "x", "max_tokens": 100000}', 400, "--max_tokens"),
      (b'{"prompt": "x", "temprature": 0}', 400, "did you mean temperature"),
      (b'{"prompt": "\\u2603\\u2603"}', 400, "is not in this run's vocabulary"),
      (b'{"prompt": [1, 99999]}', 400, "token ids must be in"),
      (b'{"prompt": [1, 100000000000000000000000]}', 400, "token ids must be in"),  # past int64
      (b'{"prompt": "x", "model": "gpt-4"}', 404, "serves 'tiny'"),
      (b"x" * (5 * 2**20), 413, "bytes"),
  ]
  for raw, status, words in cases:
    got, headers, text = server.request("POST", "/v1/completions", raw=raw)
    error = json.loads(text)["error"]
    assert got == status and words in error["message"], (raw[:40], got, text)
  assert server.request("GET", "/v1/nowhere")[0] == 404
  got, _, text = server.request("GET", "/v1/completions")
  assert got == 405 and json.loads(text)["error"]["message"].startswith("GET /v1/completions")
  got, _, text = server.request("POST", "/v1/completions", {"prompt": "", "max_tokens": 4})
  assert got == 200 and json.loads(text)["usage"]["prompt_tokens"] == 1  # from a newline
  assert "Traceback" not in "".join(server.lines), "".join(server.lines)


@pytest.mark.slow
def test_a_client_that_leaves_mid_stream_and_100_requests_at_once(server):
  with socket.create_connection((server.host, int(server.port)), timeout=60) as s:
    # Seeded: an unseeded draw may end at end-of-text before 64 tokens ("stop", not "length").
    body = json.dumps({"prompt": "The", "max_tokens": 64, "stream": True, "seed": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data: " not in received:  # the first event, then the client is gone
      received += s.recv(4096)

  def one(i: int) -> tuple[int, dict, str]:
    return server.request("POST", "/v1/completions", {"prompt": "The" + " sea" * (i % 4),
                                                      "max_tokens": 8})

  with ThreadPoolExecutor(100) as pool:
    answers = list(pool.map(one, range(100)))
  statuses = [status for status, _, _ in answers]
  assert set(statuses) <= {200, 429} and statuses.count(200) >= 8, statuses
  for status, headers, text in answers:
    if status == 429:
      assert json.loads(text)["error"]["code"] == "queue_full" and headers["retry-after"] == "1"
    else:
      assert json.loads(text)["choices"][0]["finish_reason"] in ("length", "stop")
  deadline = time.monotonic() + 30
  while (load := json.loads(server.request("GET", "/health")[2]))["decoding"] or load["waiting"]:
    assert time.monotonic() < deadline, load  # the left stream's row was freed
    time.sleep(0.2)
  assert server.proc.poll() is None and "Traceback" not in "".join(server.lines)


class Browser:
  """Headless Chromium, driven through its DevTools pipe (JSON messages ended by a NUL)."""

  FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"]

  def __init__(self, url: str, profile: Path):
    # Chromium's ends moved above 9 first, so that putting them at 3 and 4 overwrites neither.
    high = lambda fd: (fcntl.fcntl(fd, fcntl.F_DUPFD, 10), os.close(fd))[0]  # noqa: E731
    commands_r, self.commands = map(high, os.pipe())
    self.events, events_w = map(high, os.pipe())
    at_3_and_4 = "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); " \
                 "os.execvp(sys.argv[3], sys.argv[3:])"
    self.proc = subprocess.Popen([sys.executable, "-c", at_3_and_4, str(commands_r), str(events_w),
                                  "chromium", *self.FLAGS, f"--user-data-dir={profile}",
                                  "--remote-debugging-pipe", url],
                                 pass_fds=(commands_r, events_w), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    os.close(commands_r)
    os.close(events_w)
    self.sent, self.pending = 0, b""
    page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
    self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

  def call(self, method: str, session: str | None = None, **params) -> dict:
    self.sent += 1
    message = {"id": self.sent, "method": method, "params": params,
               **({"sessionId": session} if session else {})}
    os.write(self.commands, json.dumps(message).encode() + b"\0")
    while True:
      while b"\0" not in self.pending:
        part = os.read(self.events, 1 << 16)
        assert part, "chromium closed its pipe"
        self.pending += part
      raw, self.pending = self.pending.split(b"\0", 1)
      answer = json.loads(raw)
      if answer.get("id") == self.sent:
        assert "error" not in answer, answer
        return answer["result"]

  def js(self, expression: str):
    return self.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True,
                     awaitPromise=True)["result"].get("value")

  def wait_for(self, expression: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (value := self.js(expression)):
      assert time.monotonic() < deadline, f"waited {timeout}s for {expression}"
      time.sleep(0.1)
    return value

  def close(self) -> None:
    try:
      self.call("Browser.close")
      self.proc.wait(20)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()


@pytest.mark.slow
def test_the_chat_page_answers_in_headless_chromium(server, tmp_path):
  if shutil.which("chromium") is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
  browser = Browser(f"{server.url}/", tmp_path / "profile")
  try:
    about = browser.wait_for("document.readyState === 'complete' && "
                             "!document.getElementById('about').textContent.startsWith('loading')"
                             " && document.getElementById('about').textContent")
    assert about.startswith("step 30, 32-token context; plain continuation"), about
    browser.js("document.getElementById('text').value = 'The quick';"
               "document.getElementById('form').requestSubmit(); true")
    reply = browser.wait_for("(document.querySelector('.assistant[data-done]') || {}).textContent"
                             " || (document.querySelector('.error') || {}).textContent")
    assert browser.js("document.querySelectorAll('.error').length") == 0, reply
    assert browser.js("document.querySelector('.user').textContent") == "The quick"
    assert len(reply) > 10, reply
  finally:
    browser.close()


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_or_a_run_still_training_is_said_at_start_up(char_run, tmp_path,
                                                                                 capsys):
  workdir = tmp_path / "copy"
  shutil.copytree(char_run, workdir)
  metadata = workdir / "checkpoints" / "30" / "meta" / "metadata"
  metadata.write_bytes(metadata.read_bytes()[:10])  # the newest cut short
  training = lock.FileLock(workdir / lock.WORKDIR_LOCK)
  assert training.acquire()
  said = []
  try:
    model = served.open_run(str(workdir), "latest", "", said.append)
  finally:
    training.release()
  assert model.step == 15 and model.name == "copy"
  assert f"warning: checkpoint {workdir / 'checkpoints' / '30'} could not be read" in capsys.readouterr().err
  assert said == [f"note: {workdir} is still training; this serves its checkpoint of step 15, its "
                  "newest intact one: restart the server for a newer one"]


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_then_exits_143(server):
  events = []
  with socket.create_connection((server.host, int(server.port)), timeout=120) as s:
    # Seeded: an unseeded draw may end at end-of-text before 64 tokens ("stop", not "length").
    body = json.dumps({"prompt": "The", "max_tokens": 64, "stream": True, "seed": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data: " not in received:
      received += s.recv(4096)
    server.proc.send_signal(signal.SIGTERM)  # mid-stream
    while b"data: [DONE]" not in received and (part := s.recv(65536)):
      received += part
  events = [line for line in received.decode().split("\r\n") if line.startswith("data: {")]
  assert json.loads(events[-1][6:])["choices"][0]["finish_reason"] == "length", received[-300:]
  assert server.proc.wait(60) == 143
  said = [line.strip() for line in server.lines if line.strip()]
  assert said[-1].startswith("stopped (SIGTERM): ") and "Traceback" not in "".join(said), said


@pytest.mark.slow
def test_a_chat_run_answers_in_its_template_and_ctrl_c_drains_then_exits_0(tmp_path):
  from test_export import make_run

  from jaxtrain.generation import reply

  tok = chat_format.with_chat(tokenizer_lib.ByteTokenizer())
  state = make_run(tmp_path / "chat", tiny_config(**{"model.seq_len": 64}), tok=tok, noise=0.3)
  s = Server(f"--workdir={tmp_path / 'chat'}", "--api_key=sesame", "--name=bot", "--batch_size=2",
             "--max_tokens=64")
  try:
    assert s.request("GET", "/v1/models")[0] == 401
    client = _client(s, key="sesame")
    assert client.models.list().data[0].model_extra["jaxtrain"]["chat"] is True
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    answer = client.chat.completions.create(model="bot", messages=messages, max_tokens=20,
                                            temperature=0)
    assert answer.choices[0].message.content == reply.chat_reply(state, tok, messages, 20,
                                                                 temperature=0.0)
    too_long = [{"role": "user", "content": "x" * 200}]
    got, _, text = s.request("POST", "/v1/chat/completions", {"messages": too_long},
                             headers={"Authorization": "Bearer sesame"})
    assert got == 400 and json.loads(text)["error"]["code"] == "context_length_exceeded", text
    stream = client.chat.completions.create(model="bot", messages=messages, max_tokens=48,
                                            temperature=0.7, stream=True)
    first = next(iter(stream))
    s.proc.send_signal(signal.SIGINT)
    rest = list(stream)  # drained: the reply goes on to its end
    assert first.choices[0].delta.role == "assistant" and rest[-1].choices[0].finish_reason
    assert s.proc.wait(60) == 0
    said = [line.strip() for line in s.lines if line.strip()]
    assert said[-1].startswith("stopped (SIGINT): ") and "Traceback" not in "".join(said), said
  finally:
    s.stop()


@pytest.mark.slow
def test_without_the_serve_extra_it_says_the_one_line_that_installs_it(char_run):
  code = ("import sys, runpy; sys.modules['fastapi'] = None; "  # as if FastAPI were not installed
          "sys.argv = ['jaxtrain.serve', *sys.argv[1:]]; "
          "runpy.run_module('jaxtrain.serve', run_name='__main__')")
  proc = subprocess.run([sys.executable, "-c", code, f"--workdir={char_run}"], cwd=ROOT,
                        env=with_root_on_path(), capture_output=True, text=True, timeout=120)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert "needs FastAPI and uvicorn" in lines[0] and "pip install 'jaxtrain[serve]'" in lines[0]



@pytest.mark.slow
def test_a_ctrl_c_that_python_dropped_while_compiling_still_stops_the_server(char_run):
  code = ("import runpy, signal, sys\n"
          "from jaxtrain.serving import engine\n"
          "warm = engine.Engine.warm\n"
          "class Finalized:\n"  # a Ctrl-C inside a finalizer (JAX's gc callback): Python drops it
          "  def __del__(self): signal.raise_signal(signal.SIGINT)\n"
          "def warm_then_ctrl_c(self, threads=2):\n"
          "  warm(self, threads)\n"
          "  Finalized()\n"
          "engine.Engine.warm = warm_then_ctrl_c\n"
          "sys.argv = ['jaxtrain.serve', *sys.argv[1:]]\n"
          "runpy.run_module('jaxtrain.serve', run_name='__main__')\n")
  proc = subprocess.Popen([sys.executable, "-c", code, f"--workdir={char_run}", "--port=0"],
                          cwd=ROOT, env=with_root_on_path(), stderr=subprocess.PIPE, text=True)
  try:
    _, err = proc.communicate(timeout=120)
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130 and "serving " not in err, (proc.returncode, err)
