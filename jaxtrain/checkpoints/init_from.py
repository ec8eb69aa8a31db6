"""`init_from`: a new run (step 0, a fresh optimizer, its own workdir) that starts from the params
of another jaxtrain run or of a Hugging Face model directory in the layouts export writes (hf.py).
Anything that does not fit this run's config is refused with one line naming the field or tensor.

`resolve` first fills in the model: each `model.*` field the user did not set takes the source's
value (a run's config.json, or what a Hugging Face config.json fixes), so a fine-tune config need
not restate the model.

A chat run (data.messages_field) may start from a source whose tokenizer is its own less the chat
tokens (data/chat_format.py): the embedding (and an untied head) grows by their rows, each the mean of the
source's rows, a start that keeps the source's predictions for what follows them."""

import json
from collections.abc import Collection
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxtrain.checkpoints import hf
from jaxtrain.checkpoints.load import load_state
from jaxtrain.config import defaults, extensions, loading
from jaxtrain.core import lora, registry
from jaxtrain.core.model import ModelConfig
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import paths
from jaxtrain.system.errors import UserError

# Model fields that shape the params or fix what they mean: the fine-tune must keep the source's.
# (model.seq_len too with learned positions.) The others (dropout, dtype, attention, seq_len with
# RoPE, ...) are free to change; unset, they also take the source's value.
MATCH_FIELDS = ("n_layers", "n_heads", "d_model", "vocab_size", "norm", "pos", "mlp", "mlp_ratio",
                "tie_embeddings", "rope_theta", "n_kv_heads", "qk_norm", "x0_mix", "canon")
_FIX = "pass --config.init_from=<a run's workdir or an exported model directory>"


def _source_model(cfg: ml_collections.ConfigDict
                  ) -> tuple[dict, str, ml_collections.ConfigDict | None] | None:
  """(the model section to derive from, where it is, the source run's whole config or None for a
  Hugging Face directory), or None when init_from is neither. A resumed fine-tune derives from its
  own config.json, which holds what its first leg took."""
  own, source = Path(cfg.workdir).expanduser(), Path(cfg.init_from).expanduser()
  try:
    ckpts = own / "checkpoints"
    if (own / "config.json").is_file() and ckpts.is_dir() \
        and any(p.name.isdigit() for p in ckpts.iterdir()):
      source = own
    elif not (source / paths.RUN_FILE).is_file() and (source / "config.json").is_file() \
        and any(source.glob("model*.safetensors")):
      theirs = _hf_model(source, cfg.model.to_dict())
      return None if theirs is None else (theirs, str(source), None)
    elif not (source / paths.RUN_FILE).is_file() or not (source / "config.json").is_file():
      return None  # nothing there: load_flat says so
  except OSError:  # a name too long, a directory that cannot be read: load_flat says so
    return None
  try:
    saved = paths.read_json(source / "config.json")
  except (OSError, ValueError) as e:
    raise UserError(f"init_from: {source / 'config.json'} does not read ({e}); {_FIX}") from None
  run = loading.from_saved(saved)  # its extensions loaded: their components registered
  return run.model.to_dict(), str(source), run


def _hf_model(source: Path, ours: dict) -> dict | None:
  """The model section `ours` with what a Hugging Face directory's config.json fixes: layout,
  sizes, heads, vocabulary (and seq_len with learned positions); None if it does not read (load_flat
  then says why)."""
  try:
    hf_cfg = json.loads((source / "config.json").read_text(encoding="utf-8"))
    fields = hf.model_fields(hf_cfg)
    theirs = {**ours, **{f: fields[f] for f in hf.FIXED if f in fields}}
    kv = fields.get("kv_heads", fields["n_heads"])
    theirs["n_kv_heads"] = 0 if kv == fields["n_heads"] else kv
    theirs["vocab_size"] = hf_cfg.get("vocab_size", ours["vocab_size"])
    if fields["pos"] == "learned":
      theirs["seq_len"] = hf_cfg.get("n_positions", ours["seq_len"])
    # The MLP width as a ratio: this config's where it gives that width, else the one that does.
    d, hidden, mlp = fields["d_model"], fields["mlp_hidden"], fields["mlp"]
    for ratio in (ours["mlp_ratio"], hidden / d * (1.5 if mlp == "swiglu" else 1)):
      if defaults.mlp_width(mlp, ratio, d) == hidden:
        theirs["mlp_ratio"] = ratio
        break
  except (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError, UserError):
    return None
  # A value of another kind than the field's is left out (load_flat then names the mismatch);
  # values out of range are refused by validation after resolve.
  return {f: (float(v) if isinstance(ours[f], float) else v) if _same_kind(v, ours[f]) else ours[f]
          for f, v in theirs.items()}


def _same_kind(value, like) -> bool:
  if isinstance(value, bool) or isinstance(like, bool):
    return isinstance(value, bool) and isinstance(like, bool)
  if isinstance(like, float):
    return isinstance(value, int | float)
  return isinstance(value, type(like))

def _check_match(theirs: dict, ours: dict, source, advice: str = "") -> None:
  """Refuses in one line the model fields that must match the source's and differ, every one."""
  fields = [*MATCH_FIELDS, *(["seq_len"] if theirs["pos"] == "learned" else [])]
  wrong = [f for f in fields if ours[f] != theirs[f]]
  if wrong:
    bad = "; ".join(f"model.{f}={theirs[f]}, this config {ours[f]}" for f in wrong)
    fix = " ".join(f"--config.model.{f}={theirs[f]}" for f in wrong)
    raise UserError(f"init_from: {source} has {bad}; {advice}pass {fix}")


def resolve(cfg: ml_collections.ConfigDict, explicit: Collection[str] = ()
            ) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(cfg with the source run's value in every model field not set, the fields so taken).

  A field is set when `explicit` names it (e.g. `model.dropout`, from the command line) or the
  config gives it a value other than its default. Set fields that must match the source's and do
  not are refused in one line naming every one of them."""
  if not cfg.init_from:
    return cfg, []
  own = Path(cfg.workdir).expanduser() / "checkpoints"
  try:
    resuming = own.is_dir() and any(p.name.isdigit() for p in own.iterdir())
  except OSError:  # the workdir's own trouble: setup names it
    resuming = True
  if not resuming:  # a resumed fine-tune reads its own checkpoint: its source may be gone
    _kind(Path(cfg.init_from).expanduser())  # refused here, before any data is read
  found = _source_model(cfg)
  if found is None:
    return cfg, []
  theirs, source, run = found
  default = defaults.default_config().model.to_dict()
  ours = cfg.model.to_dict()
  given = {f for f in ours if f"model.{f}" in explicit or ours[f] != default[f]}
  resolved = {f: (ours[f] if f in given else theirs[f]) for f in ours}
  _check_match(theirs, resolved, source, "drop those settings (a model field left unset takes "
               "the source's value) or ")
  taken = [f"model.{f}={theirs[f]}" for f in ours if f not in given and ours[f] != theirs[f]]
  out = cfg.copy_and_resolve_references()
  loading.override(out, **{f"model.{f}": v for f, v in resolved.items()})
  if run is not None:
    taken += _take_extensions(out, run, explicit)
  return out, taken


def _take_extensions(out: ml_collections.ConfigDict, run: ml_collections.ConfigDict,
                     explicit: Collection[str]) -> list[str]:
  """The files and options of the source run's own model components that `out` names as the
  source does, taken (in place) where not set, as model fields are: without them a component
  would compute with other options than it trained with, or not load when the fine-tune is read."""
  taken, files = [], []
  loaded = {source.path for source in extensions.load(out.extend)}
  for kind in registry.MODEL_KINDS:
    field = registry.KINDS[kind].field.split(".")[1]
    component = registry.get(kind, out.model[field])
    if component.builtin or run.model[field] != component.name:
      continue
    if component.source not in loaded and component.source not in files:
      files.append(component.source)
    name, ours = component.name, dict(out.ext[component.name]) if component.name in out.ext else {}
    for option, default in component.options:
      if f"ext.{name}.{option}" not in explicit and \
          ours.get(option, default) == default != run.ext[name][option]:
        ours[option] = run.ext[name][option]
        taken.append(f"ext.{name}.{option}={ours[option]}")
    with out.unlocked():
      out.ext[name] = ours
  if files:
    with out.unlocked():
      out.extend = ",".join(filter(None, [out.extend, *files]))
    taken.insert(0, f"extend={out.extend}")
  return taken


def load_flat(path: str, c: ModelConfig, tokenizer) -> tuple[dict[str, np.ndarray], str]:
  """(flat params for a model of config `c`, what they are, for the log) from `path`."""
  source = Path(path).expanduser()
  kind = _kind(source)
  grow = _check_tokenizer(source, tokenizer)
  if kind == "run":
    state = load_state(str(source))  # the newest intact checkpoint
    src = state.model_cfg
    grown = {"vocab_size": src.vocab_size} if grow and src.vocab_size <= c.vocab_size else {}
    _check_match(vars(src), {**vars(c), **grown}, source)
    # A LoRA run gives its adapters folded into its kernels: the model it trained.
    flat = hf.flatten(lora.merged(state.params, state.lora))
    what = f"step {int(state.step)} of {source}"
  else:
    hf_cfg, tensors = hf.read_dir(source)
    flat = hf.from_hf(hf_cfg, tensors, c, str(source))
    what = f"the {hf_cfg['architectures'][0]} in {source}"
  return _grown(flat, what, c.vocab_size if grow else 0)


def _kind(source: Path) -> str:
  """"run" (a jaxtrain run's workdir) or "hf" (a Hugging Face model directory); anything else is
  a UserError."""
  try:
    if (source / paths.RUN_FILE).exists():
      return "run"
    if (source / "config.json").exists() and any(source.glob("model*.safetensors")):
      return "hf"
    exists = source.exists()
  except OSError as e:  # a name too long, a directory that cannot be read
    raise UserError(f"init_from: cannot read {source} ({e.strerror}); {_FIX}") from None
  if not exists:
    raise UserError(f"init_from: {source} does not exist; {_FIX}")
  raise UserError(f"init_from: {source} is neither a jaxtrain run (no {paths.RUN_FILE}) nor a "
                  f"Hugging Face model directory (config.json + model.safetensors); {_FIX}")


def _check_tokenizer(source: Path, tokenizer) -> bool:
  """Token ids mean the same on both sides: the same tokenizer.json (a run's or an export's, where
  it has one), whatever its kind's name. True when this run's is the source's with the chat tokens
  added after its own."""
  path = source / "tokenizer.json"
  if not path.exists():
    return False
  try:
    theirs = tokenizer_lib.load(str(path))
  except (OSError, ValueError, KeyError) as e:
    raise UserError(f"init_from: {path} does not load ({e}); {_FIX}") from None
  if tokenizer is None:
    return False
  mine = json.loads(tokenizer.hf_json())
  if json.loads(theirs.hf_json()) == mine:
    return False
  if chat_format.special_ids(tokenizer) and json.loads(chat_format.with_chat(theirs).hf_json()) == mine:
    return True
  raise UserError(f"init_from: {source} was trained with another tokenizer ({theirs.name}, "
                  f"{theirs.vocab_size} tokens) than this run's ({tokenizer.name}, "
                  f"{tokenizer.vocab_size}); its token ids would mean other things: pass the "
                  "same --config.data.tokenizer (and, for char or bpe, the same text)")


def _grown(flat: dict[str, np.ndarray], what: str, vocab_size: int) -> tuple[dict, str]:
  """`flat` with the embedding's rows (and an untied head's columns) up to `vocab_size`, each new
  one the mean of the source's; `vocab_size` 0 or no larger: as it is."""
  table = flat["wte/embedding"]
  n = len(table)
  if vocab_size <= n:
    return flat, what
  out = dict(flat)
  rows = np.broadcast_to(table.mean(0), (vocab_size - n, table.shape[1]))
  out["wte/embedding"] = np.concatenate([table, rows])
  if "lm_head/kernel" in flat:
    head = flat["lm_head/kernel"]
    cols = np.broadcast_to(head.mean(1, keepdims=True), (head.shape[0], vocab_size - n))
    out["lm_head/kernel"] = np.concatenate([head, cols], axis=1)
  return out, f"{what}, with {vocab_size - n} new token embeddings (the chat tokens) at its mean"


def apply(path: str, state, programs, tokenizer, log) -> object:
  """`state` (a fresh one) with its params replaced by those at `path`, placed as its own. LoRA
  adapters, which the source has not, keep their fresh values."""
  flat, what = load_flat(path, programs.model_cfg, tokenizer)
  params = hf.fill(lora.base(programs.abstract.params), flat, path)  # shapes checked, one by one
  placed = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                        params, lora.base(programs.shardings.params))
  adapters = "" if state.lora is None else (
      f"; LoRA rank {state.lora.rank} on {','.join(state.lora.targets)}: "
      f"{lora.count(state.trainable()):,} of {lora.count(state.params):,} params train")
  log(f"init_from: params from {what}; step 0, a fresh optimizer{adapters}")
  return state.replace(params=lora.combine(state.params, placed))
