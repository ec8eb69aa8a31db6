"""`python -m jaxtrain.sample --workdir=runs/nano [--prompt=TEXT|@FILE] [flags]`: text from a saved
run, printed as it is made; with `--prompts=FILE.jsonl`, a completion of every record's prompt,
written as JSON lines (docs/finetune.md, Conditional sampling)."""

import codecs
import json
import sys
import time
from pathlib import Path

import numpy as np
from absl import flags

from jaxtrain.checkpoints import load
from jaxtrain.data import records
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.generation import complete, decode, fit
from jaxtrain.system import invocation, paths
from jaxtrain.system.errors import UserError
from jaxtrain.tools import cli

CHUNK = 8  # tokens per compiled call: how often the text on the screen grows
_COMMAND = invocation.command("jaxtrain.sample")
USAGE = (f"usage: {_COMMAND} --workdir=runs/nano [--prompt=TEXT|@FILE] [flags]\n"
         "Text from a saved run, printed as it is made.")


def read_prompt(value: str, flag: str = "prompt") -> str:
  """`--{flag}`'s text: the value, or with @PATH the file's."""
  if not value.startswith("@"):
    return value
  path = Path(value[1:]).expanduser()
  try:
    return path.read_text(encoding="utf-8")
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"cannot read the {flag} file {path} ({getattr(e, 'strerror', None) or e}); "
                    f"pass --{flag}=@<a UTF-8 text file> or the text itself") from None


def ask(prompt: str) -> str | None:
  """A line typed at the terminal; None at the end of input (Ctrl-D)."""
  try:
    return input(prompt)
  except EOFError:
    print(file=sys.stderr)
    return None


def sample(state, tok, prompt: str, f, out=sys.stdout) -> int:
  """Prints `f.num_samples` continuations of `prompt` as their tokens come; returns how many
  tokens were made. Byte tokens go through a UTF-8 decoder: a character's bytes may come apart."""
  ids = fit.seen(complete.prompt_ids(tok, prompt), "the prompt", "--max_new_tokens", f.max_new_tokens,
                 state.model_cfg.seq_len, lambda line: print(line, file=sys.stderr))
  byte_level = isinstance(tok, tokenizer_lib.ByteTokenizer)
  made = 0
  for i in range(f.num_samples):
    if f.num_samples > 1:
      out.write(f"--- sample {i} ---\n")
    out.write(prompt)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for part in decode.stream(state, ids[None, :],
                              f.max_new_tokens, temperature=f.temperature, top_k=f.top_k,
                              top_p=f.top_p, seed=f.seed + i, chunk=CHUNK):
      out.write(utf8.decode(bytes(np.asarray(part[0], np.uint8))) if byte_level else tok.decode(part[0]))
      out.flush()
      made += part.shape[1]
    out.write(utf8.decode(b"", final=True) + "\n")
    out.flush()
  return made


def sample_file(state, tok, f) -> Path:
  """Completes every prompt of `f.prompts`; returns where the completions were written."""
  field = load.data_field(f.workdir, "prompt_field", f.prompt_field, "prompt")
  found = records.prompts(f.prompts, field)
  out = Path(f.out).expanduser() if f.out else \
      Path(f.prompts).expanduser().with_suffix(".completions.jsonl")
  keep = fit.room(state.model_cfg.seq_len, f.max_new_tokens)
  cut = [line for line, p in found if len(complete.context_ids(state, tok, p)) > keep]
  if cut:
    holds = fit.holds("--max_new_tokens", f.max_new_tokens, state.model_cfg.seq_len)
    print(f"note: {len(cut)} of {len(found)} prompts are longer than {keep} tokens "
          f"({fit.lines(cut)}); {holds} each one's last {keep}, so their first tokens are not "
          "seen", file=sys.stderr)
  rows = []
  t0 = time.time()
  for i in range(f.num_samples):
    done = complete.complete(state, tok, [p for _, p in found], f.max_new_tokens,
                             temperature=f.temperature, top_k=f.top_k, top_p=f.top_p,
                             seed=f.seed + i, keep=keep)
    for (line, prompt), text in zip(found, done):
      rows.append({"line": line, "prompt": prompt, "completion": text,
                   **({"sample": i} if f.num_samples > 1 else {})})
  try:
    paths.write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
  except OSError as e:
    raise UserError(f"cannot write {out} ({e.strerror}); pass --out=<a writable file>") from None
  print(f"{len(rows)} completions of {len(found)} prompts in {time.time() - t0:.1f}s: {out}",
        file=sys.stderr)
  return out


def run() -> None:
  f = flags.FLAGS
  if not f.workdir:
    raise UserError("no run given; pass --workdir=<the workdir of a run>, e.g. runs/nano")
  prompt = read_prompt(f.prompt)
  if f.prompts:
    records.read_jsonl(f.prompts)  # a bad file fails before the checkpoint is read
  state, tok = load.load(f.workdir, f.step)
  print(f"step {int(state.step)} of {f.workdir} ({state.model_cfg.n_layers} layers, "
        f"{tok.vocab_size}-token {tok.name} vocabulary)", file=sys.stderr)
  if f.prompts:
    sample_file(state, tok, f)
    return
  if not f.interactive:
    n = len(complete.prompt_ids(tok, prompt))  # a bad prompt fails before anything is printed
    t0 = time.time()
    made = sample(state, tok, prompt, f)
    slid = fit.slid(n, f.max_new_tokens, state.model_cfg.seq_len)
    print(f"{made} tokens in {time.time() - t0:.1f}s{slid}", file=sys.stderr)
    return
  while prompt := ask("prompt> "):  # an empty line ends it too
    try:
      sample(state, tok, prompt.replace("\\n", "\n"), f)
    except UserError as e:  # a character outside the vocabulary: say so, ask again
      print(f"error: {e}", file=sys.stderr)


def main() -> None:
  flags.DEFINE_string("workdir", None, "The run's workdir (e.g. runs/nano).")
  flags.DEFINE_string("prompt", "", "Text to continue, or @path to read it from a file; "
                      "'' starts from a newline.")
  flags.DEFINE_integer("num_samples", 1, "Samples per prompt.", lower_bound=1, upper_bound=1024)
  flags.DEFINE_integer("max_new_tokens", 256, "Tokens to generate per sample.", lower_bound=1,
                       upper_bound=2**16)
  cli.define_sampling_flags(__name__, 0.8, "Sample i uses seed + i.")
  flags.DEFINE_string("prompts", "", "A .jsonl file of records: complete each one's prompt "
                      "(batched, each up to its end-of-text token).")
  flags.DEFINE_string("prompt_field", "", "The prompts' field in --prompts; '': the run's "
                      "data.prompt_field, else 'prompt'.")
  flags.DEFINE_string("out", "", "Where --prompts writes its completions; '': beside the "
                      "prompts, FILE.completions.jsonl.")
  flags.DEFINE_boolean("interactive", False, "Ask for prompts in a loop (an empty line or "
                       "Ctrl-D ends it).")
  cli.main(run, USAGE, __name__)
