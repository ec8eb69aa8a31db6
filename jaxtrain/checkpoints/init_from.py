"""`init_from`: a new run (step 0, a fresh optimizer, its own workdir) that starts from the params
of another jaxtrain run or of a Hugging Face model directory in the layouts export writes (hf.py).
Anything that does not fit this run's config is refused with one line naming the field or tensor."""

import json
from pathlib import Path

import jax
import numpy as np

from jaxtrain.checkpoints import hf
from jaxtrain.checkpoints import load as checkpoint
from jaxtrain.core.model import ModelConfig
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import paths
from jaxtrain.system.errors import UserError


def load_flat(path: str, c: ModelConfig, tokenizer) -> tuple[dict[str, np.ndarray], str]:
  """(flat params for a model of config `c`, what they are, for the log) from `path`."""
  source = Path(path).expanduser()
  try:
    is_run = (source / paths.RUN_FILE).exists()
    is_hf = (source / "config.json").exists() and any(source.glob("model*.safetensors"))
  except OSError as e:  # a name too long, a directory that cannot be read
    raise UserError(f"init_from: cannot read {source} ({e.strerror}); pass "
                    "--config.init_from=<a run's workdir or an exported model directory>") from None
  if is_run:
    return _from_run(source, c, tokenizer)
  if is_hf:
    _check_tokenizer(source, _tokenizer_at(source), tokenizer)
    hf_cfg, tensors = hf.read_dir(source)
    flat = hf.from_hf(hf_cfg, tensors, c, str(source))
    return flat, f"the {hf_cfg['architectures'][0]} in {source}"
  raise UserError(f"init_from: {source} is neither a jaxtrain run (no {paths.RUN_FILE}) nor a "
                  "Hugging Face model directory (config.json + model.safetensors); pass "
                  "--config.init_from=<a run's workdir or an exported model directory>")


def _tokenizer_at(source: Path):
  """The tokenizer in a run's workdir or an export (its tokenizer.json), None if it has none."""
  path = source / "tokenizer.json"
  if not path.exists():
    return None
  try:
    return tokenizer_lib.load(str(path))
  except (OSError, ValueError, KeyError) as e:
    raise UserError(f"init_from: {path} does not load ({e}); pass --config.init_from=<a run's "
                    "workdir or an exported model directory>") from None


def _check_tokenizer(source: Path, theirs, tokenizer) -> None:
  """Token ids mean the same on both sides: the same tokenizer.json, whatever its kind's name."""
  if theirs is None or tokenizer is None:
    return
  if json.loads(theirs.hf_json()) != json.loads(tokenizer.hf_json()):
    raise UserError(f"init_from: {source} was trained with another tokenizer ({theirs.name}, "
                    f"{theirs.vocab_size} tokens) than this run's ({tokenizer.name}, "
                    f"{tokenizer.vocab_size}); its token ids would mean other things: pass the "
                    "same --config.data.tokenizer (and, for char or bpe, the same text)")


def _from_run(source: Path, c: ModelConfig, tokenizer) -> tuple[dict[str, np.ndarray], str]:
  _check_tokenizer(source, _tokenizer_at(source), tokenizer)
  state = checkpoint.load_state(str(source))  # the newest intact checkpoint
  src = state.model_cfg
  for field in ("pos", "norm", "mlp", "n_heads", "tie_embeddings", "rope_theta"):
    if getattr(src, field) != getattr(c, field):
      raise UserError(f"init_from: {source} has model.{field}={getattr(src, field)}, this config "
                      f"{getattr(c, field)}; pass --config.model.{field}={getattr(src, field)}")
  if c.pos == "learned" and src.seq_len != c.seq_len:
    raise UserError(f"init_from: {source} has model.seq_len={src.seq_len} (learned positions), "
                    f"this config {c.seq_len}; pass --config.model.seq_len={src.seq_len}")
  return hf.flatten(jax.device_get(state.params)), f"step {int(state.step)} of {source}"


def apply(path: str, state, programs, tokenizer, log) -> object:
  """`state` (a fresh one) with its params replaced by those at `path`, placed as its own."""
  flat, what = load_flat(path, programs.model_cfg, tokenizer)
  params = hf.fill(programs.abstract.params, flat, path)  # shapes checked, tensor by tensor
  placed = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                        params, programs.shardings.params)
  log(f"init_from: params from {what}; step 0, a fresh optimizer")
  return state.replace(params=placed)
