"""Chat records (`data.messages_field`): each a list of {"role", "content"} messages, in one format.

A message is its role's token, its content, then the end-of-turn token:

    <|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>Hello.<|end|>

and a record is one document (the end-of-text token after it). The four tokens are special tokens
added after any tokenizer's own (`with_chat`): text that spells one stays text. Only assistant
turns count in the loss (their content and their <|end|>). A model answers after <|assistant|>
and stops at <|end|>. `TEMPLATE` is the same format as a Jinja chat template, which transformers'
`apply_chat_template` renders to the same tokens.
"""

from collections.abc import Iterator

import ml_collections
import numpy as np

from jaxtrain.data import tokenizer as tokenizer_lib

ROLES = ("system", "user", "assistant")
ROLE_TOKENS = {role: f"<|{role}|>" for role in ROLES}
ASSISTANT, END = ROLE_TOKENS["assistant"], "<|end|>"
TOKENS = (*ROLE_TOKENS.values(), END)  # in this order after the tokenizer's own tokens
TEMPLATE = (  # each role's token written whole: transformers can tell it from message text
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{- '<|system|>' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '<|user|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- '<|assistant|>' -}}"
    "{%- else -%}"
    "{{- raise_exception('roles are system, user and assistant, not ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- message['content'] + '<|end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}")


def is_chat(data: ml_collections.ConfigDict) -> bool:
  """Whether `data` (a config's data section) is chat records (only assistant turns in the loss)."""
  return bool(data.messages_field)


class Special(str):
  """A document piece that is one special token (its text is the token's name), not text."""


def _kind(value) -> str:
  return "null" if value is None else type(value).__name__


def problem(messages) -> str | None:
  """What is wrong with a record's messages, as a phrase; None if they are a chat to learn from."""
  if not isinstance(messages, list):
    return f"is {_kind(messages)}, not a list of {{role, content}} messages"
  for i, m in enumerate(messages, start=1):
    if not isinstance(m, dict):
      return f"message {i} is {_kind(m)}, not an object with role and content"
    for key in ("role", "content"):
      if key not in m:
        return f"message {i} has no {key!r} (it has: {', '.join(m) or 'nothing'})"
      if not isinstance(m[key], str):
        return f"message {i}: {key!r} is {_kind(m[key])}, not text"
    if m["role"] not in ROLES:
      return f"message {i} has role {m['role']!r}; roles are {', '.join(ROLES)}"
  if not any(m["role"] == "assistant" for m in messages):
    return "has no assistant turn (nothing in it would be learned)"
  return None


def pieces(messages: list[dict]) -> Iterator[tuple[str, bool, bool]]:
  """(text or Special, ends_document, in_loss) of one chat record, the end-of-text out of the
  loss (the empty last piece ends the document)."""
  for m in messages:
    loss = m["role"] == "assistant"
    yield Special(ROLE_TOKENS[m["role"]]), False, False
    if m["content"]:
      yield m["content"], False, loss
    yield Special(END), False, loss
  yield "", True, False


def special_ids(tok) -> dict[str, int] | None:
  """{token: id} of the chat tokens, if `tok` has them all as special tokens; else None."""
  special = tok.specials if isinstance(tok, tokenizer_lib.HFTokenizer) else {}
  return {t: special[t] for t in TOKENS} if all(t in special for t in TOKENS) else None


def with_chat(tok) -> tokenizer_lib.HFTokenizer:
  """`tok` with the chat tokens added after its own (ids vocab_size .. vocab_size + 3; a token
  it already has keeps its id), as a `tokenizers` tokenizer: its tokenizer.json holds them."""
  if special_ids(tok) is not None:
    return tok
  import tokenizers as t  # as tokenizer.py does: a byte run without chat never needs it

  base = t.Tokenizer.from_str(tok.hf_json())
  base.add_special_tokens([t.AddedToken(name, special=True) for name in TOKENS])
  return tokenizer_lib.HFTokenizer(base.to_str(), name=f"{tok.name}+chat")


def encode(tok, messages: list[dict], add_generation_prompt: bool = False) -> np.ndarray:
  """The tokens of a conversation in the chat format (what training reads of a record, less its
  end-of-text); with `add_generation_prompt`, <|assistant|> after it: the model's turn."""
  ids = special_ids(tok)
  if ids is None:
    raise ValueError("this tokenizer has no chat tokens (a run trained on data.messages_field "
                     "has them)")
  parts = []
  for m in messages:
    parts += [[ids[ROLE_TOKENS[m["role"]]]], tok.encode(m["content"]), [ids[END]]]
  if add_generation_prompt:
    parts.append([ids[ASSISTANT]])
  return np.concatenate([np.asarray(p, np.int64) for p in parts]).astype(np.int32) if parts \
      else np.zeros(0, np.int32)
