"""The run a server serves: its checkpoint, tokenizer and name, whether it speaks the chat format,
and the tokens a request's prompt or conversation becomes, cut to the model's context as the
commands cut them (generation/fit.py, generation/reply.py), with the note that says so.

A run trained on chat records (its tokenizer has the chat tokens, data/chat_format.py) reads a
conversation in its chat template and answers until it ends its turn; any other run continues
text, a conversation's messages joined by newlines.
"""

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxtrain.checkpoints import load
from jaxtrain.data import chat_format
from jaxtrain.generation import complete, fit, reply
from jaxtrain.system import lock
from jaxtrain.system.errors import UserError

CHAT = "chat: each conversation in the run's chat template, answered until the end of its turn"
PLAIN = ("plain continuation: the run was not trained on chat records, so a conversation's "
         "messages are joined by newlines and continued as text")


class TooLong(UserError):
  """A conversation whose last message does not fit the context even alone."""


@dataclasses.dataclass(frozen=True)
class Served:
  name: str
  state: object
  tok: object
  step: int
  chat: bool
  created: int  # when the server started (the model's `created`)

  @property
  def seq_len(self) -> int:
    return self.state.model_cfg.seq_len

  def card(self, max_tokens: int) -> dict:
    """The model as /v1/models lists it; `max_tokens`: the most a request may ask for."""
    c = self.state.model_cfg
    return {"id": self.name, "object": "model", "created": self.created, "owned_by": "jaxtrain",
            "jaxtrain": {"step": self.step, "context": self.seq_len, "max_tokens": max_tokens,
                         "layers": c.n_layers,
                         "d_model": c.d_model, "vocab_size": c.vocab_size,
                         "tokenizer": self.tok.name, "chat": self.chat,
                         "prompt_format": CHAT if self.chat else PLAIN}}

  def prompt(self, prompt: str | list[int], max_tokens: int) -> tuple[np.ndarray, list[str]]:
    """(the tokens the model reads of a completion's prompt, notes): text as the sample command
    reads it (an empty prompt starts from a newline), or token ids; a prompt longer than the
    context beside `max_tokens` keeps its last tokens, and a note says so."""
    if isinstance(prompt, str):
      ids = complete.prompt_ids(self.tok, prompt, fix="send a prompt with text in it")
    else:
      vocab = self.state.model_cfg.vocab_size
      if len(prompt) == 0:
        raise UserError("the prompt has no tokens; send text or at least one token id")
      lo, hi = min(prompt), max(prompt)  # Python ints: JSON's have no bound, numpy's int64 does
      if lo < 0 or hi >= vocab:
        raise UserError(f"token ids must be in 0..{vocab - 1}, the model's vocabulary (these run "
                        f"{lo}..{hi})")
      ids = np.asarray(prompt, np.int32)
    note = fit.cut_line("the prompt", len(ids), "max_tokens", max_tokens, self.seq_len)
    return ids[-fit.room(self.seq_len, max_tokens):], [note] if note else []

  def conversation(self, messages: list[dict], max_tokens: int) -> tuple[np.ndarray, list[str]]:
    """(the tokens the model reads before its reply, notes): the chat template and <|assistant|>,
    its earliest exchanges left out where the conversation passes the context (a note says how
    many); a last message too long alone is TooLong. A plain run continues the messages'
    text (`prompt`)."""
    if not self.chat:
      return self.prompt("\n".join(m["content"] for m in messages), max_tokens)
    n = len(reply.context(self.state, self.tok, messages))  # a character it lacks: UserError
    try:
      kept, dropped = reply.fit_turns(self.state, self.tok, messages, max_tokens, "max_tokens")
    except UserError as e:
      raise TooLong(str(e)) from None
    notes = []
    if dropped:
      notes.append(f"note: the conversation is {n} tokens; "
                   f"{fit.holds('max_tokens', max_tokens, self.seq_len)} "
                   f"{fit.room(self.seq_len, max_tokens)}, so its earliest {dropped} exchange"
                   f"{'s were' if dropped > 1 else ' was'} left out")
    return reply.context(self.state, self.tok, kept), notes

  def stop_ids(self) -> frozenset:
    """Tokens that end a completion: end-of-text, and a chat's end of turn and role tokens."""
    ends = {self.tok.eot_id} if self.tok.eot_id >= 0 else set()
    if self.chat:
      ends |= set(chat_format.special_ids(self.tok).values())
    return frozenset(ends)


def open_run(workdir: str, step: str, name: str, say: Callable[[str], None]) -> Served:
  """The run in `workdir` at checkpoint `step` (latest: its newest intact one; a damaged newer one
  is skipped, and said); a run still training is said too."""
  state, tok = load.load(workdir, step)
  path = Path(workdir).expanduser()
  if lock.is_held(path / lock.WORKDIR_LOCK):
    say(f"note: {workdir} is still training; this serves its checkpoint of step {int(state.step)}"
        f"{', its newest intact one' if step == 'latest' else ''}: restart the server for a "
        "newer one")
  return Served(name=name or path.resolve().name, state=state, tok=tok, step=int(state.step),
                chat=chat_format.special_ids(tok) is not None, created=int(time.time()))
