"""`python -m jaxtrain.export --workdir=runs/nano --out=hf/nano [--step=latest|best|N]`: a run's
model as a Hugging Face transformers directory (docs/tools.md; the mapping: checkpoints/hf.py), or
with `--format=gguf --out=nano.gguf [--dtype=float16]` as one GGUF file for llama.cpp and Ollama
(checkpoints/gguf_file.py).

Which architecture each target writes is the table of checkpoints/targets.py: a model field or
value it has no mapping for is refused by name. Everything is written under a temporary name and
run from what was written on a probe batch against jaxtrain's own logits
(checkpoints/export_check.py) before it is renamed into place: an export that differs, or is
stopped halfway, leaves nothing at `out`, and an existing `out` is refused, never overwritten."""

import os
import shutil
import sys
from pathlib import Path

from jaxtrain.checkpoints import export_check, gguf_file, hf, load, targets
from jaxtrain.core import lora
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import invocation, paths
from jaxtrain.system.errors import UserError

_COMMAND = invocation.command("jaxtrain.export")
USAGE = (f"usage: {_COMMAND} --workdir=runs/nano --out=hf/nano [--step=latest|best|N] "
         "[--format=hf|gguf] [--dtype=float32|float16|bfloat16]\n"
         "A run's model as a Hugging Face transformers directory, or a GGUF file (--format=gguf).")
WRITTEN = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
           "generation_config.json")  # and hf.MODELING_FILE for a model of jaxtrain's own class
FORMATS = ("hf", "gguf")


def _target(out: str, file: bool) -> Path:
  """`out` as an absolute path that nothing is at yet (or, for a directory, an empty one); else
  a UserError: nothing is overwritten."""
  target = Path(out).expanduser().absolute()
  if file and target.is_dir():
    raise UserError(f"--out={out} is a directory; pass --out=<a new file>, e.g. {out}/model.gguf")
  if file and target.exists():
    raise UserError(f"--out={out} exists; pass --out=<a new file>, or remove {out} first: nothing "
                    "is overwritten")
  if not file and target.exists() and not target.is_dir():
    raise UserError(f"--out={out} is a file; pass --out=<a new or empty directory>")
  if not file and target.is_dir() and any(target.iterdir()):
    held = sorted(p.name for p in target.iterdir())
    what = "an earlier export" if "config.json" in held else f"other files ({', '.join(held[:3])})"
    raise UserError(f"--out={out} holds {what}; pass --out=<a new or empty directory>, or "
                    f"remove {out} first: nothing is overwritten")
  return target


def _build(target: Path, make) -> None:
  """`make(path)` writes and checks the export under a temporary name beside `target`; then it
  replaces `target` (a missing file, or a missing or empty directory) all at once."""
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --out={target} ({e.strerror}); pass a directory you can "
                    "write to") from None
  building = target.with_name(f".{target.name}.tmp{os.getpid()}")
  try:
    make(building)
    os.replace(building, target)
  except OSError as e:
    raise UserError(f"cannot write --out={target} ({e.strerror}); pass a directory you can "
                    "write to, with room") from None
  finally:
    if building.is_dir():
      shutil.rmtree(building, ignore_errors=True)
    elif building.exists():
      building.unlink()


def export(workdir: str, out: str, step: str = "latest") -> Path:
  """Writes the model of `workdir`'s checkpoint `step` into directory `out`; returns it."""
  target = _target(out, file=False)
  state, tok = load.load(workdir, step)
  targets.choose("hf", load.model_section(workdir, int(state.step)))
  c = state.model_cfg
  # Token ids from flat files without a tokenizer may have no end-of-text id (-1): none, then.
  eos, bos = (tok.eot_id if tok.eot_id >= 0 else None), tokenizer_lib.bos_id(tok)
  config = hf.hf_config(c, eos, bos)

  def make(building: Path) -> None:
    building.mkdir()
    _write(building, state, tok, config, workdir, eos, bos)
    export_check.check_hf(building, state, tok)
  _build(target, make)
  return target


def export_gguf(workdir: str, out: str, step: str = "latest", dtype: str = "float32") -> Path:
  """Writes the model of `workdir`'s checkpoint `step` as the GGUF file `out`; returns it."""
  if dtype not in gguf_file.DTYPES:
    raise UserError(f"--dtype={dtype} is not one of {', '.join(gguf_file.DTYPES)}")
  gguf_file.gguf_module()  # its one line to install, before anything is read
  target = _target(out, file=True)
  state, tok = load.load(workdir, step)
  arch = targets.choose("gguf", load.model_section(workdir, int(state.step)))
  gguf_file.tokenizer(tok, state.model_cfg.vocab_size, state.model_cfg.doc_mask)  # refused early
  flat = hf.flatten(lora.merged(state.params, state.lora))
  name = Path(workdir).absolute().name  # the run's name, never a local path

  def make(building: Path) -> None:
    gguf_file.write(building, state.model_cfg, arch, flat, tok, dtype, name)
    export_check.check_gguf(building, state, tok, dtype)
  _build(target, make)
  return target


def _write(target: Path, state, tok, config: dict, workdir: str, eos, bos) -> None:
  c = state.model_cfg
  # LoRA adapters folded into their kernels: an ordinary model of the same layout.
  tensors = hf.to_hf(hf.flatten(lora.merged(state.params, state.lora)), c)
  from safetensors.numpy import save_file

  # The run by its folder's name only: an export is shared, and a local path says nothing elsewhere.
  paths.write_json(target / "config.json", {**config, "jaxtrain": {
      "run": Path(workdir).expanduser().absolute().name, "step": int(state.step)}})
  save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
  # safetensors writes through a private temporary file (mode 0600): an export is to be shared,
  # so it gets the mode of any file the user creates (0666 less the umask), as the others have.
  shutil.copymode(target / "config.json", target / "model.safetensors")
  if config["architectures"][0] == hf.CUSTOM:  # the model's own code, loaded with trust_remote_code
    shutil.copyfile(Path(hf.__file__).with_name("hf_modeling.py"), target / hf.MODELING_FILE)
  # max_new_tokens, not max_length (transformers warns when a call's max_new_tokens meets one);
  # half the trained length, so that a plain call with a short prompt stays within it (GPT-2's
  # learned positions end there). pad is eos, as transformers would set it, with a warning.
  turns = chat_format.special_ids(tok)  # a chat model's turn ends at <|end|>
  paths.write_json(target / "generation_config.json", {
      "do_sample": True, "temperature": 0.8, "max_new_tokens": max(1, c.seq_len // 2),
      "eos_token_id": [turns[chat_format.END], eos] if turns else eos, "pad_token_id": eos,
      **({"bos_token_id": bos} if bos is not None else {})})
  write_tokenizer(tok, target)


def write_tokenizer(tok, target: Path) -> None:
  """tokenizer.json and the tokenizer_config.json that transformers' AutoTokenizer reads beside
  it, with the chat template (data/chat_format.py) where the tokenizer has the chat tokens."""
  (target / "tokenizer.json").write_text(tok.hf_json(), encoding="utf-8")
  bos = tokenizer_lib.bos_id(tok)
  ends = tok.eot_id >= 0  # nanoGPT's characters and bare ids may have no end-of-text token
  special = {**({"eos_token": tokenizer_lib.EOT, "pad_token": tokenizer_lib.EOT} if ends else {}),
             **({"bos_token": tok.decode([bos])} if bos is not None else {})}
  paths.write_json(target / "tokenizer_config.json", {
      "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 10**9,
      "clean_up_tokenization_spaces": False, **special, "jaxtrain_tokenizer": tok.to_json(),
      **({"chat_template": chat_format.TEMPLATE} if chat_format.special_ids(tok) else {})})


def written_line(target: Path, out: str) -> str:
  """What was written and how transformers loads it."""
  config, tensors = hf.read_dir(target)
  arch = config["architectures"][0]
  n = sum(x.size for x in tensors.values())
  if arch != hf.CUSTOM:
    return (f"wrote {arch} ({n:,} numbers) to {out}; load it with "
            f"transformers.AutoModelForCausalLM.from_pretrained({out!r})")
  from jaxtrain.core.model import ModelConfig

  custom = {f: config[f] for f in hf.CUSTOM_FIELDS}
  return (f"wrote {arch} ({n:,} numbers) to {out}, with its code ({hf.MODELING_FILE}: no "
          "transformers class has "
          f"{', '.join(b.split(' ')[0] for b in hf.blockers(ModelConfig(**custom)))}); load it with "
          f"transformers.AutoModelForCausalLM.from_pretrained({out!r}, trust_remote_code=True)")


def gguf_line(target: Path, out: str) -> str:
  """What was written and how llama.cpp runs it."""
  meta, tensors = gguf_file.read(target)
  n = sum(x.size for x in tensors.values())
  return (f"wrote a GGUF of llama.cpp's {meta['general.architecture']} architecture ({n:,} "
          f"numbers) to {out}; run it with llama-cli -m {out} (docs/after-training.md: Ollama)")


def main() -> None:
  from absl import flags

  from jaxtrain.tools import cli

  flags.DEFINE_string("workdir", None, "The run's workdir (e.g. runs/nano).")
  flags.DEFINE_string("out", None, "The directory to write (new or empty); with --format=gguf, "
                      "the file (new).")
  flags.DEFINE_string("step", "latest", "Checkpoint: latest, best (lowest val loss) or a step.")
  flags.DEFINE_string("format", "hf", "hf: a Hugging Face transformers directory; gguf: one GGUF "
                      "file for llama.cpp and Ollama (pip install 'jaxtrain[gguf]').")
  flags.DEFINE_string("dtype", "float32", "gguf: the matrices' type: float32, float16 or bfloat16.")

  def run() -> None:
    f = flags.FLAGS
    if f.format not in FORMATS:
      raise UserError(f"--format={f.format} is not one of {', '.join(FORMATS)}")
    if not f.workdir or not f.out:
      raise UserError("pass --workdir=<the workdir of a run> and --out=<a new "
                      f"{'file' if f.format == 'gguf' else 'directory'}>")
    if f.format == "gguf":
      target = export_gguf(f.workdir, f.out, f.step, f.dtype)
      print(gguf_line(target, f.out), file=sys.stderr)
      return
    if f.dtype != "float32":
      raise UserError(f"--dtype={f.dtype}: the Hugging Face export writes float32 (transformers' "
                      "torch_dtype converts on load); --dtype is for --format=gguf")
    target = export(f.workdir, f.out, f.step)
    print(written_line(target, f.out), file=sys.stderr)

  cli.main(run, USAGE, __name__)
