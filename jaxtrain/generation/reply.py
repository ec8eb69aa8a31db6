"""The assistant's reply in a conversation with a model trained on chat records: the conversation
in the chat format (data/chat_format.py) and <|assistant|> go through the model once (the key-value
cache's prefill), then tokens are drawn until the model ends its turn.

The turn ends at <|end|>; also at end-of-text or another role's token (a model that has not
learned the format yet), or after `max_new_tokens`.
"""

from collections.abc import Iterator

import numpy as np

from jaxtrain.data import chat_format
from jaxtrain.generation import complete, decode, fit
from jaxtrain.system.errors import UserError

CHUNK = 8  # tokens per compiled call: how often the reply on the screen grows


def context(state, tok, messages: list[dict]) -> np.ndarray:
  """What the model reads before its reply: the conversation and <|assistant|>, as a prompt
  (complete.context_ids)."""
  return complete.context_ids(state, tok,
                              chat_format.encode(tok, messages, add_generation_prompt=True))


def fit_turns(state, tok, messages: list[dict], max_new_tokens: int,
              flag: str = "max_new_tokens") -> tuple[list[dict], int]:
  """(the latest messages that fit the model's context beside a reply of `max_new_tokens`,
  how many exchanges were left out). The earliest exchanges (a user message and the replies
  after it) go first; the system message stays. A reply that passed the context would see a
  window that starts inside a turn, which a chat model never saw in training. A UserError where
  the last user message does not fit even alone (`flag`: the setting that sets max_new_tokens)."""
  seq_len = state.model_cfg.seq_len
  keep = fit.room(seq_len, max_new_tokens)
  system = messages[:1] if messages and messages[0]["role"] == "system" else []
  rest = messages[len(system):]
  cuts = [0, *(i for i, m in enumerate(rest) if m["role"] == "user" and i > 0)]
  for dropped, at in enumerate(cuts):
    n = len(context(state, tok, [*system, *rest[at:]]))
    if n <= keep:
      return [*system, *rest[at:]], dropped
  what = "this message and the system message before it are" if system else "this message is"
  raise UserError(f"{what} {n} tokens; "
                  f"{fit.holds(flag, max_new_tokens, seq_len)} {keep}: send a shorter one, or "
                  f"pass a smaller {flag}")


def stream_reply(state, tok, messages: list[dict], max_new_tokens: int = 256, *,
                 temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0) -> Iterator[str]:
  """The reply's text as it is made, up to the end of the assistant's turn (not included). A
  conversation longer than the model's context loses its earliest exchanges first (`fit_turns`)."""
  stops = {*chat_format.special_ids(tok).values(), tok.eot_id}  # <|end|>, every role's token
  ids = context(state, tok, fit_turns(state, tok, messages, max_new_tokens)[0])
  made: list[int] = []
  shown = ""
  for part in decode.stream(state, ids[None, :], max_new_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, chunk=CHUNK):
    new = part[0].tolist()
    end = next((i for i, t in enumerate(new) if t in stops), None)
    made += new if end is None else new[:end]
    text = tok.decode(made)
    if end is None:  # a character whose bytes are not all made yet waits for them
      text = text.rstrip("\ufffd")
    if text.startswith(shown) and len(text) > len(shown):
      yield text[len(shown):]
      shown = text
    if end is not None:
      return


def chat_reply(state, tok, messages: list[dict], max_new_tokens: int = 256, **kwargs) -> str:
  """The assistant's next turn after `messages` (a list of {"role", "content"}), as text.
  kwargs: temperature (0: greedy), top_k, top_p, seed."""
  if chat_format.special_ids(tok) is None:
    raise ValueError("this tokenizer has no chat tokens: the model was not trained on chat "
                     "records (data.messages_field)")
  return "".join(stream_reply(state, tok, messages, max_new_tokens, **kwargs))
