"""What of a prompt fits the model's context, said the same way by every command that generates
or scores.

A model reads at most `model.seq_len` tokens. A prompt keeps its last `room` tokens: seq_len less
the tokens to generate, so that the prompt and its continuation share one window, but at least half
of seq_len (a continuation longer than that slides the window anyway: decode.py restarts a full
window from its latest half). A longer prompt is cut at its start, never silently (`cut_line`;
chat leaves out whole exchanges instead, reply.fit_turns). Scoring leaves out a record that does
not fit (`fits`), and counts it, since a score on a record cut short is not a score on that record.
"""

import numpy as np

from jaxtrain.generation import decode

SHOWN = 5  # line numbers a message names before "..."


def room(seq_len: int, max_new_tokens: int) -> int:
  """Prompt tokens the model sees beside `max_new_tokens` new ones."""
  return max(seq_len - max_new_tokens, decode.keep_length(seq_len))


def seen(ids: np.ndarray, what: str, flag: str, max_new_tokens: int, seq_len: int,
         say=None) -> np.ndarray:
  """The prompt's tokens the model sees beside `max_new_tokens` new ones; where it was cut at its
  start, `cut_line`'s line goes to `say`."""
  note = cut_line(what, len(ids), flag, max_new_tokens, seq_len)
  if note and say:
    say(note)
  return ids[-room(seq_len, max_new_tokens):]


def fits(n_tokens: int, seq_len: int) -> bool:
  """Whether a sequence of `n_tokens` is scored whole: every token but the last is an input, and
  the inputs fit the context."""
  return n_tokens - 1 <= seq_len


def holds(flag: str, max_new_tokens: int, seq_len: int) -> str:
  return f"with {flag}={max_new_tokens}, the model's context (model.seq_len={seq_len}) holds"


def cut_line(what: str, n: int, flag: str, max_new_tokens: int, seq_len: int) -> str | None:
  """The note for a prompt of `n` tokens (`what`: "the prompt", "sample.prompt"), None where it
  fits whole."""
  k = room(seq_len, max_new_tokens)
  if n <= k:
    return None
  fix = f" ({flag}={seq_len - n} or fewer keeps it whole)" if n < seq_len else ""
  return (f"note: {what} is {n} tokens; {holds(flag, max_new_tokens, seq_len)} its last {k}, so "
          f"the first {n - k} are not seen{fix}")


def lines(numbers: list[int]) -> str:
  shown = ", ".join(map(str, numbers[:SHOWN])) + (", ..." if len(numbers) > SHOWN else "")
  return f"line{'s' if len(numbers) > 1 else ''} {shown}"


def slid(n_prompt: int, max_new_tokens: int, seq_len: int) -> str:
  """`; past the model's context (...) ...` where the prompt and the new tokens pass seq_len
  (the window slides, decode.py), else ''."""
  seen = min(n_prompt, room(seq_len, max_new_tokens))
  if seen + max_new_tokens - 1 <= seq_len:
    return ""
  return (f"; past the model's context (model.seq_len={seq_len}), each new token saw only the "
          f"latest {decode.keep_length(seq_len)} to {seq_len} tokens")
