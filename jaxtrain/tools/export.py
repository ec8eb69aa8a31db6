"""`python -m jaxtrain.export --workdir=runs/nano --out=hf/nano [--step=latest|best|N]`: a run's
model as a Hugging Face transformers directory (config.json, model.safetensors, tokenizer.json),
loadable with `transformers.AutoModelForCausalLM.from_pretrained(out)`. The mapping: hf.py.
A run trained on chat records also gets its chat format as a chat template (tokenizer_config.json)
and generation that stops at the end of the assistant's turn. A LoRA run's adapters are merged into
its kernels (W + alpha/r A B): the directory is an ordinary model."""

import json
import os
import sys
from pathlib import Path

import numpy as np

from jaxtrain.checkpoints import hf, load
from jaxtrain.core import lora
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import paths
from jaxtrain.system.errors import UserError

USAGE = ("usage: python -m jaxtrain.export --workdir=runs/nano --out=hf/nano [--step=latest|best|N]\n"
         "A run's model as a Hugging Face transformers directory.")
WRITTEN = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
           "generation_config.json")


def export(workdir: str, out: str, step: str = "latest") -> Path:
  """Writes the model of `workdir`'s checkpoint `step` into directory `out`; returns it."""
  state, tok = load.load(workdir, step)
  c = state.model_cfg
  # Token ids from flat files without a tokenizer may have no end-of-text id (-1): none, then.
  eos, bos = (tok.eot_id if tok.eot_id >= 0 else None), tokenizer_lib.bos_id(tok)
  config = hf.hf_config(c, eos, bos)  # before anything is written: no equivalent is refused
  target = _target(out)
  # LoRA adapters folded into their kernels: an ordinary model of the same layout.
  tensors = hf.to_hf(hf.flatten(lora.merged(state.params, state.lora)), c)
  from safetensors.numpy import save_file

  save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
  # safetensors writes through a private temporary file (mode 0600): an export is to be shared,
  # so it gets the mode of any file the user creates (0666 less the umask), as the others have.
  (target / "model.safetensors").chmod(0o666 & ~_umask())
  paths.write_json(target / "config.json", {**config, "jaxtrain": {
      "workdir": str(Path(workdir).absolute()), "step": int(state.step)}})
  # max_new_tokens, not max_length (transformers warns when a call's max_new_tokens meets one);
  # half the trained length, so that a plain call with a short prompt stays within it (GPT-2's
  # learned positions end there). pad is eos, as transformers would set it, with a warning.
  turns = chat_format.special_ids(tok)  # a chat model's turn ends at <|end|>
  paths.write_json(target / "generation_config.json", {
      "do_sample": True, "temperature": 0.8, "max_new_tokens": max(1, c.seq_len // 2),
      "eos_token_id": [turns[chat_format.END], eos] if turns else eos, "pad_token_id": eos,
      **({"bos_token_id": bos} if bos is not None else {})})
  write_tokenizer(tok, target)
  return target


def _umask() -> int:
  mask = os.umask(0o022)  # reading it means setting it: put back at once
  os.umask(mask)
  return mask


def _target(out: str) -> Path:
  """`out`, created; refused if it holds files an export did not write (nothing is overwritten
  but an earlier export)."""
  path = Path(out).expanduser()
  if path.exists() and not path.is_dir():
    raise UserError(f"--out={path} is a file; pass --out=<a new or empty directory>")
  if path.is_dir():
    others = sorted(p.name for p in path.iterdir() if p.name not in WRITTEN)
    if others:
      raise UserError(f"--out={path} holds other files ({', '.join(others[:3])}); pass "
                      "--out=<a new or empty directory> so nothing there is overwritten")
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --out={path} ({e.strerror}); pass a directory you can "
                    "write to") from None
  return path


def write_tokenizer(tok, target: Path) -> None:
  """tokenizer.json (every jaxtrain tokenizer has an exact `tokenizers` form, end-of-text token
  included) and the tokenizer_config.json that transformers' AutoTokenizer reads beside it, with
  the chat template where the tokenizer has the chat tokens: `apply_chat_template` then gives the
  tokens jaxtrain trains on and chats with (data/chat_format.py)."""
  (target / "tokenizer.json").write_text(tok.hf_json(), encoding="utf-8")
  bos = tokenizer_lib.bos_id(tok)
  special = {"eos_token": tokenizer_lib.EOT, "pad_token": tokenizer_lib.EOT,
             **({"bos_token": tok.decode([bos])} if bos is not None else {})}
  paths.write_json(target / "tokenizer_config.json", {
      "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 10**9,
      "clean_up_tokenization_spaces": False, **special, "jaxtrain_tokenizer": tok.to_json(),
      **({"chat_template": chat_format.TEMPLATE} if chat_format.special_ids(tok) else {})})


def main() -> None:
  from absl import flags

  from jaxtrain.tools import cli

  flags.DEFINE_string("workdir", None, "The run's workdir (e.g. runs/nano).")
  flags.DEFINE_string("out", None, "The directory to write (new or empty).")
  flags.DEFINE_string("step", "latest", "Checkpoint: latest, best (lowest val loss) or a step.")

  def run() -> None:
    f = flags.FLAGS
    if not f.workdir or not f.out:
      raise UserError("pass --workdir=<the workdir of a run> and --out=<a new directory>")
    target = export(f.workdir, f.out, f.step)
    arch = json.loads((target / "config.json").read_text())["architectures"][0]
    n = sum(int(np.prod(x.shape)) for x in hf.read_dir(target)[1].values())
    print(f"wrote {arch} ({n:,} numbers) to {target}; load it with "
          f"transformers.AutoModelForCausalLM.from_pretrained({str(target)!r})", file=sys.stderr)

  cli.main(run, USAGE, __name__)
