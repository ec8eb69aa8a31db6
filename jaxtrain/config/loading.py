"""A config as a run gets it: a config file or a recipe's name loaded (`load_config`,
`find_config`) and checked against the defaults' fields, dotted overrides (`override`), a saved
run's config on today's defaults (`from_saved`), dotted names (`flatten`, `field_names`), and
which changes a resume may cross (`config_changes`, `STATE_FIELDS`).
"""

import difflib
import importlib.util
import os
from pathlib import Path

import ml_collections

# The modules themselves, not through the package's __init__ (which imports this one)
import jaxtrain.config.extensions as extensions
import jaxtrain.config.schema as schema
from jaxtrain.config.defaults import default_config
from jaxtrain.system.errors import ConfigError, UserError


def override(cfg: ml_collections.ConfigDict, **dotted) -> ml_collections.ConfigDict:
  """Sets fields by dotted name, in place: `override(cfg, **{"train.max_steps": 100})`. A name
  that is not a field of the defaults is a ConfigError naming the nearest ones."""
  for key, value in dotted.items():
    node = cfg
    *path, leaf = key.split(".")
    for part in path:
      node = node[part] if isinstance(node, ml_collections.ConfigDict) and part in node else None
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      raise ConfigError(key, "is not a config field", schema.suggestion(key, field_names()))
    node[leaf] = value
  return cfg


def field_names() -> list[str]:
  """Every field's dotted name, as `--config.NAME=...` takes it."""
  return list(flatten(default_config().to_dict()))


# Fields that left the tree (docs/config.md, the config gate): the value under which a saved run
# trained what jaxtrain trains now, the patch that brings the field back, and the commit it applies to.
_GATE = "benchmarks/results/2026-11-28-config-gate/"
REMOVED = {
    "model.value_embeds": (
        False, "benchmarks/results/2026-11-24-quality-zen4/value_embeds.diff", "0a4fec37da"),
    "model.logit_softcap": (0.0, _GATE + "logit_softcap.diff", "c68e09ace1"),
    "optim.clip_per_group": (False, _GATE + "clip_per_group.diff", "2676896f6f"),
    "optim.embedding_weight_decay": (0.0, _GATE + "group_weight_decay.diff", "6fe2ca570a"),
    "optim.head_weight_decay": (-1.0, _GATE + "group_weight_decay.diff", "6fe2ca570a"),
    "optim.embedding_lr": (0.0, _GATE + "group_lr.diff", "4d19be6ed4"),
    "optim.head_lr": (0.0, _GATE + "group_lr.diff", "4d19be6ed4"),
}


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """A run's saved config (config.json, a checkpoint's metadata) on top of today's defaults: a run
  saved before a field existed gets the field's default, which is what it trained with. One that
  used a field since removed, as other than today's behaviour, is a UserError: it cannot be run,
  resumed or read as it trained."""
  extensions.load(saved.get("extend", ""), saved.get(extensions.SOURCES_KEY))  # their options
  cfg = default_config()
  defaults, flat = flatten(cfg.to_dict()), flatten(saved)
  for field, (same, patch, commit) in REMOVED.items():
    if flat.get(field, same) != same:
      raise UserError(f"this run was trained with {field}={flat[field]!r}, which jaxtrain no "
                      f"longer has; in jaxtrain's repository, `git checkout {commit} && git apply "
                      f"{patch}` brings it back")
  override(cfg, **{k: v for k, v in flat.items() if k in defaults})
  return cfg


def shipped_configs() -> Path | None:
  """The run recipes: jaxtrain/recipes/ in an installed wheel, else configs/ beside the package
  (a clone, or an editable install of one); None when neither is there."""
  package = Path(__file__).resolve().parents[1]
  for folder in (package / "recipes", package.parent / "configs"):
    if any(folder.glob("*.py")):
      return folder
  return None


def recipe_names() -> list[str]:
  """The names `--config=NAME` and `load_config(NAME)` take: nano, small, ..."""
  shipped = shipped_configs()
  return sorted(p.stem for p in shipped.glob("*.py")) if shipped else []


def find_config(path: str) -> str | None:
  """The config file `path` means: the file itself (relative to the working directory), or for
  a bare name (`nano`) that is not a file there, that recipe; None if neither exists."""
  if os.path.isfile(os.path.expanduser(path)):
    return path
  shipped = shipped_configs()
  if shipped and path in recipe_names():
    return str(shipped / f"{path}.py")
  return None


def missing_config(path: str, how: str = "--config={}") -> str:
  """The recipe that the config file not found is likely to be (`how` it is passed), and the
  others' names."""
  shipped = shipped_configs()
  if shipped is None:
    return (f"config file {path} not found (from {os.getcwd()}); pass the path of a config file "
            "(examples: the configs/ folder of the jaxtrain repository)")
  names = recipe_names()
  close = difflib.get_close_matches(Path(path).stem, names, n=1, cutoff=0.6)
  name = close[0] if close else "nano"
  rest = "" if close else f", or another recipe: {', '.join(names)}"
  return (f"config file {path} not found (from {os.getcwd()}); pass {how.format(name)} (the "
          f"recipe {shipped / name}.py){rest}")


def load_config(path: str, **dotted) -> ml_collections.ConfigDict:
  """The ConfigDict of a config file (e.g. "configs/nano.py", relative to the working directory)
  or of a recipe by name ("nano", as `--config=nano`), with dotted overrides applied.

  Every name it holds is checked against the defaults: an unknown field, or a file that fails to
  load, raises a UserError that names the file, the line and (for a field) the nearest real one."""
  if not isinstance(path, str | os.PathLike):
    raise UserError(f"load_config: pass a recipe's name or a config file's path, not "
                    f"{type(path).__name__}: e.g. load_config(\"nano\")")
  path = find_config(os.fspath(path)) or os.fspath(path)
  if not os.path.isfile(os.path.expanduser(path)):
    raise UserError(missing_config(path, 'load_config("{}")'))
  full = os.path.abspath(os.path.expanduser(path))
  defaults = default_config().to_dict()
  try:
    spec = importlib.util.spec_from_file_location(f"jaxtrain_config_{abs(hash(full))}", full)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.get_config()
  except Exception as e:  # whatever the file's own code raised
    raise _load_error(path, full, e, defaults) from None
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise UserError(f"{path}: get_config() returned {type(cfg).__name__}, not a ConfigDict; "
                    "build it on jaxtrain.config.default_config() as configs/*.py do")
  check_fields(cfg, f"set in {path}")
  return override(cfg, **dotted)


def _load_error(path: str, full: str, e: Exception, defaults: dict) -> UserError:
  line = schema.line_in(e, full)
  at = f"{path}, line {line}" if line else path
  key = schema.locked_key(e, defaults)
  if key is not None:
    return ConfigError(key, f"is not a config field ({at})",
                       schema.suggestion(key, schema.names(defaults)))
  return UserError(f"the config file {at} does not load: {type(e).__name__}: "
                   f"{schema.message_of(e)}; fix the file")


def check_fields(cfg: ml_collections.ConfigDict, where: str = "") -> None:
  """Raises a ConfigError for the first name in `cfg` that the defaults do not have."""
  defaults = default_config().to_dict()
  unknown = schema.unknown_fields(cfg, defaults)
  if unknown:
    where = f" ({where})" if where else ""
    raise ConfigError(unknown[0], f"is not a config field{where}",
                      schema.suggestion(unknown[0], schema.names(defaults)))


# Changing these changes the train state's shapes or what its numbers mean: no resume across them.
STATE_FIELDS = (
    "seed", "model.n_layers", "model.n_heads", "model.d_model", "model.seq_len",
    "model.vocab_size", "model.norm", "model.pos", "model.mlp", "model.mlp_ratio",
    "model.tie_embeddings", "model.rope_theta", "data.tokenizer", "data.val_fraction",
    "train.grad_accum", "train.skip_nonfinite", "optim.loss_scaling", "model.n_kv_heads",
    "model.qk_norm", "optim.name", "data.vocab_size", "model.doc_mask",
    "finetune.lora_rank", "model.x0_mix",
    "model.canon", "model.attention_variant", "model.block", "model.arch",
)
LORA_FIELDS = ("finetune.lora_alpha", "finetune.lora_targets")  # breaking where LoRA is on
# The model and optimizer fields known not to change the state's shapes or what its numbers mean:
# a resume may change these (the rest of training's course, its speed or memory). Any other
# model.* or optim.* field that changed, one added since (by a fork, or a user's own code) included,
# is taken as changing the state: a resume across it is refused by name.
HARMLESS = (
    "model.size", "model.dropout", "model.dtype", "model.attention", "model.zero_init_out",
    "model.remat", "model.loss_chunk", "model.fused_loss",
    "optim.schedule", "optim.lr", "optim.min_lr_ratio", "optim.decay_fraction", "optim.matrix_lr",
    "optim.momentum", "optim.muon_ns_steps", "optim.warmup_steps", "optim.decay_steps",
    "optim.weight_decay", "optim.z_loss", "optim.loss_term", "optim.clip_norm", "optim.b1",
    "optim.b2", "optim.eps",
)


def flatten(d: dict, prefix: str = "") -> dict:
  """{"a": {"b": 1}} -> {"a.b": 1}: the dotted names `--config.a.b=...` overrides use."""
  out = {}
  for key, value in d.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def _state_field(field: str) -> bool:
  """Whether a change of `field` forbids a resume (LoRA's and clipping's aside)."""
  unknown = field.startswith(("model.", "optim.")) and field not in HARMLESS
  # An extension's options: what one changes is the extension's to know, so none is harmless.
  return field in STATE_FIELDS or unknown or field.startswith("ext.")


def config_changes(saved: dict, current: dict) -> tuple[list[str], list[str]]:
  """(changes that forbid a resume, harmless changes), each as 'field: old -> new'. A model or
  optimizer field that only one side has (a field added by other code than this jaxtrain's) is a
  change too, from or to `<absent>`."""
  flat_saved = flatten(saved)
  old, new = {**flatten(from_saved(saved).to_dict()), **{
      k: v for k, v in flat_saved.items()
      if k.startswith(("model.", "optim.")) and k not in REMOVED}}, flatten(current)
  breaking, harmless = [], []
  for field in sorted(set(new) | set(old)):
    if _state_field(field) and (field in old) != (field in new):
      change = f"{field}: {old.get(field, '<absent>')!r} -> {new.get(field, '<absent>')!r}"
      breaking.append(change.replace("'<absent>'", "<absent>"))
      continue
    if field in old and field in new and old[field] != new[field]:
      change = f"{field}: {old[field]!r} -> {new[field]!r}"
      # Clipping on or off adds or removes an optimizer-state entry; its value alone does not.
      toggles_clip = field == "optim.clip_norm" and (old[field] == 0) != (new[field] == 0)
      # Adapters' scale and placement change the state's meaning and shapes, if there are any.
      lora = field in LORA_FIELDS and (old["finetune.lora_rank"] or new["finetune.lora_rank"])
      (breaking if _state_field(field) or toggles_clip or lora else harmless).append(change)
  return breaking, harmless
