"""What a request asks for, checked whole before anything runs: the bodies of OpenAI's
`/v1/completions` and `/v1/chat/completions`, each field's type and range, and every mistake an
`ApiError`: OpenAI's error shape, its HTTP status and the field it names.

OpenAI's fields that this server does not compute (log-probabilities, penalties, tools, ...) are
taken at the value that asks nothing of it, and refused otherwise; a field OpenAI does not have is
refused with the nearest real name. `top_k` is an addition, as vLLM and llama.cpp have it.
"""

import dataclasses
import difflib
import math

SEED_LIMIT = 2**32  # jax.random.PRNGKey keeps 32 bits of a seed: larger ones would repeat
MAX_STOPS = 4  # as OpenAI
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stream",
          "stream_options", "user", "safety_identifier", "prompt_cache_key"}
FIELDS = {"completion": COMMON | {"prompt", "echo"},
          "chat": COMMON | {"messages", "max_completion_tokens"}}
# OpenAI's fields that this server does not compute: each value that asks nothing of it.
IDLE = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "suffix": (None, ""),
        "best_of": (None, 1), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
        "logit_bias": (None, {}), "response_format": (None, {"type": "text"}), "tools": (None, []),
        "tool_choice": (None, "none", "auto"), "functions": (None, []),
        "function_call": (None, "none", "auto"), "parallel_tool_calls": (None, True, False),
        "store": (None, False), "metadata": (None, {}), "service_tier": (None, "auto", "default"),
        "modalities": (None, ["text"]), "reasoning_effort": (None,), "prediction": (None,),
        "audio": (None,), "web_search_options": (None,), "verbosity": (None,)}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
  """A request refused: `status` and OpenAI's error body."""

  def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
               kind: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Limits:
  max_tokens: int  # the most tokens a request may ask for per completion
  rows: int  # the most completions a request may ask for (prompts x n): the engine's rows


@dataclasses.dataclass(frozen=True)
class Ask:
  """A checked request. `prompts`: a completion's prompts (text or token ids each), or one
  conversation (a list of {"role", "content"}) for a chat."""
  chat: bool
  model: str | None
  prompts: list
  max_tokens: int
  temperature: float
  top_p: float
  top_k: int
  n: int
  seed: int | None
  stop: tuple[str, ...]
  stream: bool
  include_usage: bool
  echo: bool


def _kind(value) -> str:
  names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
           dict: "an object", type(None): "null"}
  return names.get(type(value), type(value).__name__)


def _integer(body: dict, name: str, default, low: int, high: int, why: str = "") -> int | None:
  value = body.get(name)
  value = default if value is None else value  # null: the default, as OpenAI takes it
  if value is None:
    return None
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
    shown = f"{value!r}" if isinstance(value, int | float) else _kind(value)
    raise ApiError(400, f"{name}: {shown} is not an integer from {low} to {high}{why}; pass one in "
                        "that range", param=name)
  return value


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
  value = body.get(name, default)
  if value is None:
    value = default
  if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
      or not low <= value <= high:
    shown = f"{value!r}" if isinstance(value, int | float) else _kind(value)
    raise ApiError(400, f"{name}: {shown} is not a number from {low:g} to {high:g}; pass one in "
                        "that range", param=name)
  return float(value)


def _boolean(body: dict, name: str) -> bool:
  value = body.get(name, False)
  if value is not None and not isinstance(value, bool):
    raise ApiError(400, f"{name}: {_kind(value)} is not true or false", param=name)
  return bool(value)


def _stop(body: dict) -> tuple[str, ...]:
  value = body.get("stop")
  stops = [] if value is None else [value] if isinstance(value, str) else value
  if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
      not all(isinstance(s, str) and s for s in stops):
    raise ApiError(400, f"stop: pass a string or an array of up to {MAX_STOPS} non-empty strings, "
                        f"not {_kind(value) if not isinstance(value, list) else 'that array'}",
                   param="stop")
  return tuple(stops)


def _fields(body: dict, kind: str) -> None:
  """Every field is one this endpoint knows; an OpenAI field it does not compute only at a value
  that asks nothing of it."""
  known = FIELDS[kind]
  for name, value in body.items():
    if name in known:
      continue
    if name in IDLE:
      if any(value == ok and isinstance(value, bool) == isinstance(ok, bool) for ok in IDLE[name]):
        continue
      raise ApiError(400, f"{name}: this server does not compute it; leave it out", param=name,
                     code="unsupported_parameter")
    near = difflib.get_close_matches(name, sorted(known | set(IDLE)), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise ApiError(400, f"unknown field {name!r}{hint}; the fields are OpenAI's "
                        f"{'chat ' if kind == 'chat' else ''}completion fields", param=name,
                   code="unknown_parameter")


def _prompts(body: dict) -> list:
  """A completion's prompts: a string, an array of strings, an array of token ids, or an array
  of arrays of token ids."""
  value = body.get("prompt")
  if isinstance(value, str):
    return [value]
  is_ids = lambda x: isinstance(x, list) and x and all(  # noqa: E731
      isinstance(t, int) and not isinstance(t, bool) for t in x)
  if isinstance(value, list) and value:
    if all(isinstance(p, str) for p in value):
      return list(value)
    if is_ids(value):
      return [value]
    if all(is_ids(p) for p in value):
      return list(value)
  raise ApiError(400, "prompt: pass a string, an array of strings, an array of token ids or an "
                      f"array of such arrays (none empty), not {_kind(value)}"
                      f"{' of that shape' if isinstance(value, list) else ''}", param="prompt")


def _content(m: dict, i: int):
  content = m.get("content")
  if content is None and m.get("role") == "assistant":
    return ""
  if isinstance(content, list):  # parts: text only
    if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
           for p in content):
      return "".join(p["text"] for p in content)
    raise ApiError(400, f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": "
                        "...}) can be read by this model", param=f"messages[{i}].content")
  if not isinstance(content, str):
    raise ApiError(400, f"messages[{i}].content: {_kind(content)} is not text",
                   param=f"messages[{i}].content")
  return content


def _messages(body: dict) -> list[dict]:
  """A conversation: {"role", "content"} messages, roles system (or developer), user and
  assistant, content text or text parts."""
  value = body.get("messages")
  if not isinstance(value, list) or not value:
    raise ApiError(400, f"messages: pass an array of {{\"role\", \"content\"}} messages, not "
                        f"{'an empty array' if value == [] else _kind(value)}", param="messages")
  out = []
  for i, m in enumerate(value):
    if not isinstance(m, dict):
      raise ApiError(400, f"messages[{i}]: {_kind(m)} is not a message", param=f"messages[{i}]")
    extra = set(m) - {"role", "content", "name"}
    if extra:
      raise ApiError(400, f"messages[{i}]: this server reads role and content, not "
                          f"{', '.join(sorted(extra))}", param=f"messages[{i}]")
    if m.get("role") not in ROLES:
      raise ApiError(400, f"messages[{i}].role: {m.get('role')!r} is not one of "
                          f"{', '.join(ROLES)}", param=f"messages[{i}].role")
    out.append({"role": ROLES[m["role"]], "content": _content(m, i)})
  return out


def parse(body, kind: str, limits: Limits) -> Ask:
  """The request of a JSON body sent to the completions ("completion") or the chat completions
  ("chat") endpoint, checked whole; an ApiError otherwise."""
  if not isinstance(body, dict):
    raise ApiError(400, f"the request body is {_kind(body)}, not a JSON object")
  _fields(body, kind)
  chat = kind == "chat"
  model = body.get("model")
  if model is not None and not isinstance(model, str):
    raise ApiError(400, f"model: {_kind(model)} is not a model's name", param="model")
  prompts = [_messages(body)] if chat else _prompts(body)
  name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
      else "max_tokens"
  default = min(256, limits.max_tokens) if chat else min(16, limits.max_tokens)  # 16: OpenAI's
  max_tokens = _integer(body, name, default, 1, limits.max_tokens, " (this server's --max_tokens)")
  n = _integer(body, "n", 1, 1, limits.rows, " (this server's --batch_size)")
  if len(prompts) * n > limits.rows:
    raise ApiError(400, f"{len(prompts)} prompts x n={n} is {len(prompts) * n} completions; this "
                        f"server makes at most {limits.rows} in one request (--batch_size): send "
                        "fewer at a time", param="prompt")
  options = body.get("stream_options")
  if options is not None and not (isinstance(options, dict) and set(options) <= {"include_usage"}
                                  and isinstance(options.get("include_usage", False), bool)):
    raise ApiError(400, "stream_options: pass {\"include_usage\": true} or leave it out",
                   param="stream_options")
  return Ask(chat=chat, model=model, prompts=prompts, max_tokens=max_tokens,
             temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
             top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
             top_k=_integer(body, "top_k", 0, 0, 2**31 - 1), n=n,
             seed=_integer(body, "seed", None, 0, SEED_LIMIT - 1), stop=_stop(body),
             stream=_boolean(body, "stream"),
             include_usage=bool(options and options.get("include_usage")),
             echo=False if chat else _boolean(body, "echo"))
