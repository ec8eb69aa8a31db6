"""`python -m jaxtrain.chat --workdir=runs/chat [--system=TEXT|@FILE] [flags]`: talk with a run
trained on chat records (data.messages_field; docs/finetune.md, Talking with a chat run).

Each line read from stdin is the user's next message (`\\n` in it: a newline); the conversation
is kept. On a terminal it asks with `you> `; from a pipe it prints only the replies, so a script
can drive it.
"""

import sys

from absl import flags

from jaxtrain.checkpoints import load
from jaxtrain.data import chat_format
from jaxtrain.generation import fit, reply
from jaxtrain.system import invocation
from jaxtrain.system.errors import UserError
from jaxtrain.tools import cli
from jaxtrain.tools.sample import ask, read_prompt

_COMMAND = invocation.command("jaxtrain.chat")
USAGE = (f"usage: {_COMMAND} --workdir=runs/chat [--system=TEXT] [flags]\n"
         "Talk with a run trained on chat records: one message a line on stdin, the replies on "
         "stdout.")


def read_message(tty: bool) -> str | None:
  """The user's next message; None at the end of input."""
  if tty:
    return ask("you> ")
  line = sys.stdin.readline()
  return None if line == "" else line.rstrip("\r\n")


def converse(state, tok, f, tty: bool, out=sys.stdout) -> int:
  """Reads messages and writes replies until the input ends; returns the number of replies."""
  messages = [{"role": "system", "content": read_prompt(f.system, "system")}] if f.system else []
  if messages:
    chat_format.encode(tok, messages)  # a character the vocabulary lacks: said before any turn
  replies = left_out = 0
  while (text := read_message(tty)) is not None:
    if not text.strip():
      continue
    turn = [*messages, {"role": "user", "content": text.replace("\\n", "\n")}]
    try:
      kept, dropped = reply.fit_turns(state, tok, turn, f.max_new_tokens, "--max_new_tokens")
    except UserError as e:  # a character outside the vocabulary, a message too long: ask again
      print(f"error: {e}", file=sys.stderr)
      continue
    if dropped and not left_out:  # said the first time only: a line each turn would drown replies
      n = len(reply.context(state, tok, turn))
      holds = fit.holds("--max_new_tokens", f.max_new_tokens, state.model_cfg.seq_len)
      print(f"note: the conversation is {n} tokens; {holds} "
            f"{fit.room(state.model_cfg.seq_len, f.max_new_tokens)}, so from now on its earliest "
            "exchanges are left out, as many as it takes", file=sys.stderr)
    turn, left_out = kept, left_out + dropped
    pieces = []
    for piece in reply.stream_reply(state, tok, turn, f.max_new_tokens,
                                    temperature=f.temperature, top_k=f.top_k, top_p=f.top_p,
                                    seed=f.seed + replies):
      out.write(piece)
      out.flush()
      pieces.append(piece)
    out.write("\n\n" if tty else "\n")
    out.flush()
    messages = [*turn, {"role": "assistant", "content": "".join(pieces)}]
    replies += 1
  return replies


def run() -> None:
  f = flags.FLAGS
  if not f.workdir:
    raise UserError("no run given; pass --workdir=<the workdir of a run trained on chat records>")
  read_prompt(f.system, "system")  # an unreadable file fails before the checkpoint is read
  state, tok = load.load(f.workdir, f.step)
  if chat_format.special_ids(tok) is None:
    raise UserError(f"{f.workdir} was not trained on chat records (its tokenizer has no chat "
                    "tokens); train one with --config.data.messages_field=messages "
                    "(docs/finetune.md, Chat)")
  tty = sys.stdin.isatty()
  print(f"step {int(state.step)} of {f.workdir} ({state.model_cfg.n_layers} layers, "
        f"{tok.vocab_size}-token vocabulary)" + ("; Ctrl-D ends" if tty else ""), file=sys.stderr)
  converse(state, tok, f, tty)


def main() -> None:
  flags.DEFINE_string("workdir", None, "The run's workdir (trained with data.messages_field).")
  flags.DEFINE_string("system", "", "A system message that opens the conversation, or @path "
                      "to read it from a file; '': none.")
  flags.DEFINE_integer("max_new_tokens", 256, "Tokens per reply at most (a reply ends at the "
                       "end of its turn).", lower_bound=1, upper_bound=2**16)
  cli.define_sampling_flags(__name__, 0.7, "Reply i uses seed + i.")
  cli.main(run, USAGE, __name__)
