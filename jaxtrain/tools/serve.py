"""`python -m jaxtrain.serve --workdir=runs/nano [--port=8000] [flags]`: a run's model behind an
OpenAI-compatible HTTP API, with a chat page at `/` (docs/after-training.md, Serving; the app:
jaxtrain/serving/).

It binds 127.0.0.1 unless told another host, compiles what it runs before it says it is ready,
and decodes the requests that arrive together in one batch. Ctrl-C or SIGTERM: no new requests,
the ones in flight finish (up to --drain_s), then it exits 0 (Ctrl-C) or 143 (SIGTERM). Its
dependencies come with the `serve` extra; without them it says how to install them (exit 2).
"""

import socket
import sys
import time

from absl import flags

from jaxtrain.system import invocation, machine, signals
from jaxtrain.system.errors import UserError
from jaxtrain.tools import cli

_COMMAND = invocation.command("jaxtrain.serve")
USAGE = (f"usage: {_COMMAND} --workdir=runs/nano [--port=8000] [flags]\n"
         "A run's model behind an OpenAI-compatible HTTP API, with a chat page at /.")
STEPS = 8  # tokens per advance of every row: how often a stream grows, how soon a new request joins
INSTALL = ("pip install 'jaxtrain[serve]' (in a checkout of jaxtrain: pip install -e '.[serve]')")


def say(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def _needs_extra() -> None:
  try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
  except ImportError as e:
    raise UserError(f"{_COMMAND} needs FastAPI and uvicorn ({e.name} is not installed): "
                    f"{INSTALL}") from None


def _bind(host: str, port: int) -> socket.socket:
  """A listening socket on host:port (port 0: a free one), or a UserError that says why not."""
  try:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(2048)
  except OSError as e:
    why = e.strerror or str(e)
    raise UserError(f"cannot listen on {host}:{port} ({why}); pass another --port (or --port=0 "
                    "for a free one), or --host") from None
  return sock


def _url(sock: socket.socket) -> str:
  host, port = sock.getsockname()[:2]
  return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def run() -> None:
  f = flags.FLAGS
  if not f.workdir:
    raise UserError("no run given; pass --workdir=<the workdir of a run>, e.g. runs/nano")
  _needs_extra()
  import uvicorn

  from jaxtrain.serving import app as app_lib
  from jaxtrain.serving import requests, served
  from jaxtrain.serving.engine import Engine
  from jaxtrain.serving.scheduler import Scheduler

  sock = _bind(f.host, f.port)
  model = served.open_run(f.workdir, f.step, f.name, say)
  c = model.state.model_cfg
  say(f"step {model.step} of {f.workdir} ({c.n_layers} layers, {c.seq_len}-token context, "
      f"{model.tok.vocab_size}-token {model.tok.name} vocabulary); "
      f"{'chat template' if model.chat else 'plain continuation (not trained on chat records)'}")
  t0 = time.perf_counter()
  engine = Engine(model.state, f.batch_size, f.max_tokens, STEPS)
  engine.warm(threads=machine.cores())  # compiles in parallel: XLA's compiler holds no lock
  signals.check()  # a Ctrl-C that Python dropped while loading or compiling: no server starts
  sched = Scheduler(engine, f.queue, say)
  sched.start()
  limits = requests.Limits(max_tokens=f.max_tokens, rows=f.batch_size)
  app = app_lib.build(model, sched, limits, say, api_key=f.api_key)
  config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                          timeout_graceful_shutdown=f.drain_s)
  server = uvicorn.Server(config)
  if f.host not in ("127.0.0.1", "localhost", "::1"):
    say(f"note: --host={f.host} lets other machines reach this server"
        f"{'' if f.api_key else ' without a key (--api_key sets one)'}")
  say(f"serving {model.name!r} at {_url(sock)}/v1 (OpenAI API) and {_url(sock)}/ (chat page); "
      f"{f.batch_size} completions at once; compiled in {time.perf_counter() - t0:.1f}s; "
      "Ctrl-C stops")
  stopped = None
  try:
    server.run(sockets=[sock])  # uvicorn drains on a signal, then raises it again here
  except KeyboardInterrupt as e:
    stopped = signals.name_of(e)
  finally:
    sched.stop()
  say(f"stopped{f' ({stopped})' if stopped else ''}: {sched.finished} completions served")
  if stopped == "SIGTERM":
    raise signals.Terminated()
  signals.handled()  # Ctrl-C is how a server is stopped: exit status 0


def main() -> None:
  flags.DEFINE_string("workdir", None, "The run's workdir (e.g. runs/nano).")
  flags.DEFINE_string("step", "latest", "Checkpoint: latest (the newest intact one), best "
                      "(lowest val loss) or a step.")
  flags.DEFINE_string("host", "127.0.0.1", "The address to listen on: 127.0.0.1 is this machine "
                      "only; 0.0.0.0 every network it is on.")
  flags.DEFINE_integer("port", 8000, "The port to listen on; 0: a free one (said at start-up).",
                       lower_bound=0, upper_bound=65535)
  flags.DEFINE_string("name", "", "The model's name in the API (its `model` field); '': the "
                      "workdir's folder name.")
  flags.DEFINE_integer("batch_size", 8, "Completions decoded together; more wait in the queue.",
                       lower_bound=1, upper_bound=1024)
  flags.DEFINE_integer("queue", 64, "Completions that may wait for a place in the batch; one "
                       "more is refused (429).", lower_bound=0, upper_bound=100_000)
  flags.DEFINE_integer("max_tokens", 1024, "The most tokens a request may ask for per "
                       "completion.", lower_bound=1, upper_bound=2**16)
  flags.DEFINE_float("drain_s", 30.0, "After Ctrl-C or SIGTERM: seconds for the requests in "
                     "flight to finish before they are cut.", lower_bound=0.0)
  flags.DEFINE_string("api_key", "", "A key that every request must send (Authorization: "
                      "Bearer KEY); '': none.")
  cli.main(run, USAGE, __name__)
