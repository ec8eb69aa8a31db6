"""The OpenAI-compatible HTTP app (FastAPI): `GET /v1/models`, `POST /v1/completions` and
`POST /v1/chat/completions` (whole, or streamed as server-sent events), `GET /health`, and the chat
page at `/`. Every refusal is OpenAI's error shape with its status: 400 a bad body or field, 401 a
missing key (where the server has one), 404 an unknown model or path, 413 a body too large, 429 a
full queue, 503 while the server stops, 500 a failure of its own (one line in the server's log,
never a traceback to the client).
"""

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from jaxtrain.serving import requests, scheduler
from jaxtrain.serving.flight import Flight
from jaxtrain.serving.requests import ApiError, Ask
from jaxtrain.serving.served import Served, TooLong
from jaxtrain.system.errors import UserError, first_line

MAX_BODY = 4 * 2**20  # bytes: a longer body is refused (413) before it is read whole
PAGE = Path(__file__).with_name("page.html")
WAIT_S = 1.0  # how often a whole (not streamed) request looks whether its client left


def _error(e: ApiError) -> JSONResponse:
  headers = {"Retry-After": "1"} if e.status in (429, 503) else None
  return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _body(request: Request) -> object:
  """The request's JSON, read up to MAX_BODY bytes."""
  size = request.headers.get("content-length", "")
  if size.isdigit() and int(size) > MAX_BODY:
    raise ApiError(413, f"the request body is {int(size):,} bytes; this server reads up to "
                        f"{MAX_BODY:,}", code="request_too_large")
  raw = bytearray()
  async for part in request.stream():
    raw += part
    if len(raw) > MAX_BODY:
      raise ApiError(413, f"the request body is over {MAX_BODY:,} bytes, the most this server "
                          "reads", code="request_too_large")
  try:
    return json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    raise ApiError(400, f"the request body is not JSON ({first_line(e)}); send a JSON object") from None


def _rows(served: Served, ask: Ask) -> tuple[list[scheduler.Row], list[int], list[str]]:
  """(the rows to decode, prompt i's token count, the notes on what was cut). A prompt the model
  cannot read is an ApiError naming its field."""
  rows, counts, notes = [], [], []
  base = ask.seed if ask.seed is not None else secrets.randbelow(requests.SEED_LIMIT)
  for prompt in ask.prompts:
    try:
      ids, said = (served.conversation if ask.chat else served.prompt)(prompt, ask.max_tokens)
    except UserError as e:
      raise ApiError(400, str(e), param="messages" if ask.chat else "prompt",
                     code="context_length_exceeded" if isinstance(e, TooLong) else None) from None
    counts.append(len(ids))
    notes += [n.removeprefix("note: ") for n in said]
    for j in range(ask.n):  # completion j of a prompt: seed + j, as the sample command's sample j
      rows.append(scheduler.Row(prompt=ids, max_tokens=ask.max_tokens, temperature=ask.temperature,
                                top_k=ask.top_k, top_p=ask.top_p, seed=(base + j) % requests.SEED_LIMIT,
                                stop_ids=served.stop_ids(), deliver=None))
  return rows, counts, notes


def _usage(flight: Flight, counts: list[int]) -> dict:
  made = sum(c.tokens for c in flight.choices)
  return {"prompt_tokens": sum(counts), "completion_tokens": made, "total_tokens": sum(counts) + made}


def _failed(finish: str) -> ApiError:
  return ApiError(500, finish.removeprefix("error: "), kind="server_error")


class Endpoint:
  """One request to the completions or chat endpoint, from its body to its response."""

  def __init__(self, served: Served, sched: scheduler.Scheduler, ask: Ask, echoes: list[str]):
    self.served, self.ask, self.echoes = served, ask, echoes
    self.id = f"{'chatcmpl' if ask.chat else 'cmpl'}-{secrets.token_hex(12)}"
    self.created = int(time.time())
    rows, self.counts, self.notes = _rows(served, ask)
    self.flight = Flight(sched, served.tok, rows, ask.stop)
    try:
      self.flight.start()
    except scheduler.Full:
      raise ApiError(429, f"the server's queue is full ({sched.queue_limit} completions waiting, "
                          "--queue); retry in a moment", kind="rate_limit_error",
                     code="queue_full") from None
    except scheduler.Closed:
      raise ApiError(503, "the server is stopping; it takes no new requests",
                     kind="server_error", code="shutting_down") from None

  def _head(self) -> dict:
    head = {"id": self.id, "object": ("chat.completion" if self.ask.chat else "text_completion"),
            "created": self.created, "model": self.served.name}
    return {**head, **({"jaxtrain": {"notes": self.notes}} if self.notes else {})}

  def _choice(self, i: int, text: str, finish: str | None, first: bool = False) -> dict:
    if not self.ask.chat:
      return {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
    if self.ask.stream:
      delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
      return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": finish}

  def _echo(self, i: int) -> str:
    return self.echoes[i // self.ask.n] if self.ask.echo else ""

  async def whole(self, request: Request) -> Response:
    texts = [self._echo(i) for i in range(len(self.flight.choices))]
    try:
      async for i, new, finish in self.flight.events(WAIT_S):
        if i < 0 and await request.is_disconnected():
          return Response(status_code=499)  # nobody reads it
        if finish and finish.startswith("error"):
          return _error(_failed(finish))
        if i >= 0:
          texts[i] += new
    finally:
      self.flight.cancel()
    choices = [self._choice(i, t, c.finish) for i, (t, c) in enumerate(zip(texts, self.flight.choices))]
    return JSONResponse({**self._head(), "choices": choices, "usage": _usage(self.flight, self.counts)})

  async def stream(self) -> AsyncIterator[str]:
    """Server-sent events: a chunk per new text, the finish reasons, usage where asked, [DONE];
    the notes in the first chunk only."""
    head = {**self._head(), "object": "chat.completion.chunk" if self.ask.chat else "text_completion"}
    notes = {"jaxtrain": head.pop("jaxtrain")} if "jaxtrain" in head else {}

    def event(data: dict) -> str:
      nonlocal notes
      data, notes = {**data, **notes}, {}
      return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    try:
      for i in range(len(self.flight.choices)):  # each choice opens: its role, its echo
        if self.ask.chat or self.ask.echo:
          yield event({**head, "choices": [self._choice(i, self._echo(i), None, first=True)]})
      async for i, new, finish in self.flight.events():
        if finish and finish.startswith("error"):
          yield event(_failed(finish).body())
          return
        if new or finish:
          yield event({**head, "choices": [self._choice(i, new, finish)]})
      if self.ask.include_usage:
        yield event({**head, "choices": [], "usage": _usage(self.flight, self.counts)})
      yield "data: [DONE]\n\n"
    finally:  # also where the client left mid-stream: its rows are freed
      self.flight.cancel()


def build(served: Served, sched: scheduler.Scheduler, limits: requests.Limits,
          say: Callable[[str], None], api_key: str = "") -> FastAPI:
  """The app; with `api_key`, every /v1/ request must send it (Authorization: Bearer KEY)."""
  app = FastAPI(title="jaxtrain", docs_url=None, redoc_url=None, openapi_url=None)
  page = PAGE.read_text(encoding="utf-8")

  @app.exception_handler(HTTPException)
  async def http_error(request: Request, e: HTTPException) -> JSONResponse:
    where = f"{request.method} {request.url.path}"
    message = {404: f"no {where} here; the endpoints are GET /v1/models, POST /v1/completions, "
                    "POST /v1/chat/completions",
               405: f"{where} is not allowed; see GET /v1/models and POST /v1/completions"}
    return _error(ApiError(e.status_code, message.get(e.status_code, str(e.detail)),
                           code="not_found" if e.status_code == 404 else None))

  def guarded(handler, keyed: bool = True):
    async def run(request: Request) -> Response:
      try:
        if keyed and api_key and not secrets.compare_digest(
            request.headers.get("authorization", ""), f"Bearer {api_key}"):
          raise ApiError(401, "this server wants its API key: send Authorization: Bearer KEY "
                              "(the openai client's api_key)", code="invalid_api_key")
        return await handler(request)
      except ApiError as e:
        return _error(e)
      except Exception as e:  # noqa: BLE001 - the client gets one line, the log too
        say(f"error: {request.method} {request.url.path}: {type(e).__name__}: {first_line(e)}")
        return _error(ApiError(500, f"internal error ({type(e).__name__}: {first_line(e)})",
                               kind="server_error"))
    return run

  async def generate(request: Request, kind: str) -> Response:
    ask = requests.parse(await _body(request), kind, limits)
    if ask.model not in (None, served.name):
      raise ApiError(404, f"the model {ask.model!r} does not exist here; this server serves "
                          f"{served.name!r} (GET /v1/models)", param="model", code="model_not_found")
    echoes = [p if isinstance(p, str) else served.tok.decode(p) for p in ask.prompts] \
        if ask.echo else []
    endpoint = Endpoint(served, sched, ask, echoes)
    if ask.stream:
      return StreamingResponse(endpoint.stream(), media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await endpoint.whole(request)

  async def completions(request: Request) -> Response:
    return await generate(request, "completion")

  async def chat(request: Request) -> Response:
    return await generate(request, "chat")

  async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [served.card(limits.max_tokens)]})

  async def model(request: Request) -> Response:
    name = request.path_params["name"]
    if name != served.name:
      raise ApiError(404, f"the model {name!r} does not exist here; this server serves "
                          f"{served.name!r}", param="model", code="model_not_found")
    return JSONResponse(served.card(limits.max_tokens))

  async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "model": served.name, **sched.load()})

  async def index(request: Request) -> Response:
    return HTMLResponse(page)

  app.add_api_route("/v1/completions", guarded(completions), methods=["POST"])
  app.add_api_route("/v1/chat/completions", guarded(chat), methods=["POST"])
  app.add_api_route("/v1/models", guarded(models), methods=["GET"])
  app.add_api_route("/v1/models/{name:path}", guarded(model), methods=["GET"])
  app.add_api_route("/health", guarded(health, keyed=False), methods=["GET"])
  app.add_api_route("/", guarded(index, keyed=False), methods=["GET"])
  return app
