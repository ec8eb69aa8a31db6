"""Every config field checked once, up front: its type, its range, and how it fits the others.

`validate` runs before any work and raises `ConfigError` naming the first bad field and its fix.
The fields that name a component (model.mlp, optim.name, ...) are checked against its registry,
built-in and the user's own, once their code is loaded (core/components.py, `jt.validate`: both).
Whatever needs devices or data (a mesh that fits, a corpus long enough) is checked where they are.
"""

import os

import ml_collections

from jaxtrain.config import defaults, loading
from jaxtrain.config.lists import check as _check
from jaxtrain.config.lists import eval_task_files, lora_targets, validate_mixture
from jaxtrain.config.lists import show as _show
from jaxtrain.system import fmt
from jaxtrain.system.errors import ConfigError


def get(cfg: ml_collections.ConfigDict, field: str):
  """The value of a dotted field name: `get(cfg, "train.max_steps")`."""
  for part in field.split("."):
    cfg = cfg[part]
  return cfg


INT32_MAX = 2**31 - 1
STEPS_MAX = 2**30  # step counts: the device's step counter and the schedule's step + 1 are int32
# The largest value of each integer field, past which a run cannot work or end (int32 counters,
# 64-bit seeds, loops unrolled when traced): a typo'd number stops here, not in a hang or a crash.
LIMITS = {
    "seed": 2**63 - 1, "model.n_layers": 256, "model.n_heads": 2**16, "model.d_model": 2**16,
    "model.seq_len": 2**20, "model.vocab_size": 2**24, "data.vocab_size": 2**20, "train.batch_size": 2**24,
    "train.grad_accum": 2**16, "train.max_steps": STEPS_MAX, "train.log_every": STEPS_MAX,
    "train.eval_every": STEPS_MAX, "train.eval_steps": 2**12, "train.checkpoint_every": STEPS_MAX,
    "train.keep_checkpoints": INT32_MAX, "train.early_stop_patience": STEPS_MAX,
    "train.profile_steps": STEPS_MAX, "model.loss_chunk": 2**24, "train.eval_tasks_limit": 2**24,
    "optim.warmup_steps": STEPS_MAX, "model.n_kv_heads": 2**16, "optim.muon_ns_steps": 100,
    "optim.decay_steps": STEPS_MAX, "sample.num_samples": 1024, "sample.max_new_tokens": 2**16,
    "sample.top_k": 2**24, "mesh.data": 2**20, "mesh.fsdp": 2**20, "mesh.cpu_devices": 1024,
    "distributed.num_processes": 2**20, "distributed.process_id": 2**20,
    "distributed.timeout_s": INT32_MAX, "finetune.lora_rank": 2**16,
}
MAX_PARAMS = 2**40  # ~1.1e12 parameters: 17.6 TB of float32 params, gradients and AdamW state
MAX_BATCH_TOKENS = 2**31  # tokens of one micro-batch, batch_size x (seq_len + 1)
MAX_BUDGET_S = 30 * 86400
FLOAT32_BELOW_1 = 1 - 2**-24  # numbers from here to 1 round to 1 in float32
# Path fields: a NUL or a newline in one is a mistake, and would break the one-line messages.
PATH_FIELDS = ("workdir", "extend", "data.path", "data.cache_dir", "init_from", "data.tokenizer",
               "data.text_field", "data.prompt_field", "data.completion_field", "log.wandb_project",
               "data.mixture", "data.messages_field", "train.eval_tasks", "train.early_stop_metric")
KINDS = {bool: "True or False", int: "an integer", str: "a string",
          float: "a number within float32's range (|x| <= 3.4e38)"}


def _is_kind(value, kind: type) -> bool:
  if isinstance(value, bool) or kind is bool:
    return isinstance(value, bool) and kind is bool
  if kind is float:  # finite in float32, where the steps use them; ints as JAX takes them, int32
    if isinstance(value, int):
      return abs(value) <= INT32_MAX
    return isinstance(value, float) and abs(value) <= 3.4028234663852886e38  # float32's largest
  return isinstance(value, kind)


def _validate_types(cfg: ml_collections.ConfigDict) -> None:
  """Every field is there and has its default's type, and no other name is (a config file can
  set anything)."""
  loading.check_fields(cfg)
  for field, default in loading.flatten(defaults.default_config().to_dict()).items():
    try:
      value = get(cfg, field)
    except (KeyError, AttributeError, TypeError):
      raise ConfigError(field, "is missing", "build the config on jaxtrain.config.defaults.default_config() "
                        "as configs/*.py do") from None
    kind = type(default)
    example = default if default != "" else "<text>"
    _check(_is_kind(value, kind), field, f"must be {KINDS[kind]}, got {_show(value)}",
           f"pass e.g. --config.{field}={example}")
    if field in PATH_FIELDS:
      _check(not any(ord(c) < 32 for c in value), field,
             f"{_show(value)} holds a control character (NUL, newline, tab)",
             f"pass --config.{field}=<a plain path>")
    if field in LIMITS:
      _check(value <= LIMITS[field], field, f"must be at most {LIMITS[field]}, got {_show(value)}",
             f"pass a smaller --config.{field}")


def _positive_int(cfg: ml_collections.ConfigDict, field: str, minimum: int = 1) -> None:
  value = get(cfg, field)
  _check(value >= minimum, field, f"must be an integer >= {minimum}, got {value!r}",
         f"pass --config.{field}=<integer >= {minimum}>")


def _one_of(value, choices, field: str) -> None:
  _check(value in choices, field, f"{_show(value)} is not one of {', '.join(choices)}",
         f"pass --config.{field}={choices[0]} (or another of those)")


def _within(cfg: ml_collections.ConfigDict, field: str, ok: bool, bounds: str, usual: str,
            e_g: bool = False) -> None:
  _check(ok, field, f"must be {bounds}, got {get(cfg, field)}",
         f"pass {'e.g. ' if e_g else ''}--config.{field}={usual}")


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Checks every field that can be checked without devices or data; raises ConfigError."""
  _validate_types(cfg)
  _check(cfg.workdir.strip() != "", "workdir", "is empty",
         "pass --config.workdir=<directory for this run>")
  _positive_int(cfg, "seed", minimum=0)
  validate_model(cfg)
  _validate_size(cfg)
  _validate_finetune(cfg)
  _validate_train_optim(cfg)
  _validate_sizes(cfg)
  _validate_data_sample(cfg)
  _validate_mesh_distributed(cfg)
  _validate_log(cfg)


def _validate_log(cfg: ml_collections.ConfigDict) -> None:
  _one_of(cfg.log.group_stats, defaults.GROUP_STATS, "log.group_stats")
  _one_of(cfg.log.wandb_mode, defaults.WANDB_MODES, "log.wandb_mode")
  project = cfg.log.wandb_project
  # W&B refuses these characters in project names (and the name's length past 128).
  _check(project.strip() != "" and len(project) <= 128 and not any(c in project for c in "/\\#?%:"),
         "log.wandb_project", f"{_show(project)} is not a W&B project name (1-128 characters, none "
         "of / \\ # ? % :)", "pass e.g. --config.log.wandb_project=jaxtrain")


def _validate_size(cfg: ml_collections.ConfigDict) -> None:
  """model.size=auto chooses a new model for a time budget, on one process."""
  _check(cfg.model.size in defaults.SIZES, "model.size", f"{_show(cfg.model.size)} is not auto "
         "or empty", 'pass --config.model.size=auto, or "" for the shape as set')
  if cfg.model.size != "auto":
    return
  for bad, problem, fix in (
      (not cfg.train.time_budget, "is auto, which needs train.time_budget (the model is chosen "
       "for it)", "pass e.g. --config.train.time_budget=5m"),
      (cfg.init_from.strip(), f"is auto (a new model), but init_from={cfg.init_from!r} gives "
       "the model", "leave model.size empty to train the init_from model"),
      (cfg.distributed.num_processes > 1, "is auto, which chooses on one process",
       "pass the shape a one-process --dry_run chooses (model.n_layers, d_model, n_heads)")):
    _check(not bad, "model.size", problem, fix)


def model_fields(fields: dict) -> ml_collections.ConfigDict:
  """A model's fields (a ModelConfig's) through the checks of model.<field>; a ConfigError. Returns
  the config they make, for its components' own checks."""
  cfg = defaults.default_config()
  for field in [f for f in cfg.model if f in fields]:
    try:
      cfg.model[field] = fields[field]
    except TypeError:  # the config's own type check: an int field given "2"
      raise ConfigError(f"model.{field}", f"must be {type(cfg.model[field]).__name__}, got "
                        f"{fields[field]!r}", f"pass {field}={cfg.model[field]!r}") from None
  validate_model(cfg)
  return cfg


def validate_model(cfg: ml_collections.ConfigDict) -> None:
  m = cfg.model
  for f in ("n_layers", "n_heads", "d_model", "seq_len"):
    _positive_int(cfg, f"model.{f}")
  for f in ("vocab_size", "n_kv_heads", "loss_chunk", "canon"):
    _positive_int(cfg, f"model.{f}", minimum=0)
  _check(m.d_model % m.n_heads == 0, "model.d_model",
         f"{m.d_model} is not divisible by model.n_heads={m.n_heads}",
         "make d_model a multiple of n_heads")
  _one_of(m.dtype, defaults.DTYPES, "model.dtype")
  _one_of(m.attention, defaults.ATTENTION, "model.attention")
  _one_of(m.remat, defaults.REMATS, "model.remat")
  _check(m.canon <= 64, "model.canon", f"{m.canon} is wider than a short convolution (at most 64)",
         "pass --config.model.canon=4 (or 0 for none)")
  _check(m.n_kv_heads == 0 or m.n_heads % m.n_kv_heads == 0, "model.n_kv_heads",
         f"{m.n_kv_heads} does not divide model.n_heads={m.n_heads}",
         "pass a divisor of n_heads, or 0 for as many as n_heads")
  _within(cfg, "model.mlp_ratio", 0 < m.mlp_ratio <= 256, "in (0, 256]", "4.0")
  _within(cfg, "model.dropout", 0.0 <= m.dropout < 1.0, "in [0, 1)", "0.0")
  _check(not (m.fused_loss and m.loss_chunk), "model.fused_loss", "and model.loss_chunk are "
         "two ways to take the cross-entropy; pick one", "pass --config.model.loss_chunk=0")
  # At 0 or below (or a base float32 rounds to 0), RoPE's angles become inf * 0 or nan.
  _within(cfg, "model.rope_theta", m.rope_theta >= 1e-30, "> 0 (at least 1e-30)", "10000.0")


def _validate_finetune(cfg: ml_collections.ConfigDict) -> None:
  f = cfg.finetune
  _positive_int(cfg, "finetune.lora_rank", minimum=0)
  _within(cfg, "finetune.lora_alpha", f.lora_alpha >= 1e-30, "> 0 (at least 1e-30)", "16", e_g=True)
  targets = lora_targets(f.lora_targets)
  if f.lora_rank == 0:
    return
  _check(bool(targets), "finetune.lora_targets", "is empty, so LoRA (finetune.lora_rank="
         f"{f.lora_rank}) would train nothing", "pass e.g. --config.finetune.lora_targets=qkv,out")
  _check(cfg.init_from.strip() != "", "finetune.lora_rank", f"is {f.lora_rank} (LoRA) but "
         "init_from is empty: LoRA adapts a trained model, whose params it leaves as they are",
         "pass --config.init_from=<a run's workdir or a Hugging Face directory>, or "
         "--config.finetune.lora_rank=0 to train every param")


# Sizes of a typical large run: a product of fields that is too large names its largest factor.
_TYPICAL = {"model.n_layers": 12, "model.d_model": 768, "model.mlp_ratio": 4,
            "model.vocab_size": 50304, "model.seq_len": 1024, "train.batch_size": 512}


def _largest(cfg: ml_collections.ConfigDict, *fields: str) -> str:
  return max(fields, key=lambda f: get(cfg, f) / _TYPICAL[f])


def _validate_sizes(cfg: ml_collections.ConfigDict) -> None:
  """Sizes that no machine holds are refused here, before anything is allocated."""
  m, t = cfg.model, cfg.train
  # About the model's parameters, as model.ModelConfig counts them (vocab 256 where it is 0).
  width = defaults.mlp_width(m.mlp, m.mlp_ratio, m.d_model)
  per_layer = 4 * m.d_model**2 + (2 if m.mlp != "swiglu" else 3) * m.d_model * width
  n = m.n_layers * per_layer + (1 if m.tie_embeddings else 2) * (m.vocab_size or 256) * m.d_model \
      + (m.seq_len * m.d_model if m.pos == "learned" else 0)
  _check(n <= MAX_PARAMS, _largest(cfg, "model.n_layers", "model.d_model", "model.mlp_ratio",
                                   "model.vocab_size"),
         f"the model would have ~{n:.3g} parameters, more than the {MAX_PARAMS:.3g} any machine "
         "can train", "make model.d_model, model.n_layers, model.mlp_ratio or model.vocab_size "
         "smaller")
  tokens = t.batch_size * (m.seq_len + 1)
  _check(tokens <= MAX_BATCH_TOKENS, _largest(cfg, "train.batch_size", "model.seq_len"),
         f"one micro-batch would hold batch_size x (seq_len + 1) = {tokens:.3g} tokens, more than "
         f"{MAX_BATCH_TOKENS:.3g}", "lower train.batch_size (raise train.grad_accum to keep the "
         "tokens per step) or model.seq_len")


def time_budget_s(cfg: ml_collections.ConfigDict) -> float | None:
  """train.time_budget's seconds (the one place it is parsed); None where it is empty."""
  if cfg.train.time_budget == "":
    return None
  seconds = fmt.parse_duration(cfg.train.time_budget)
  _check(seconds is not None and seconds <= MAX_BUDGET_S, "train.time_budget",
         f"{_show(cfg.train.time_budget)} is not a duration of up to 30 days",
         'pass e.g. --config.train.time_budget=10m (or 90s, 1h30m), or "" for train.max_steps')
  return seconds


def _validate_train_optim(cfg: ml_collections.ConfigDict) -> None:
  o = cfg.optim
  for f in ("batch_size", "grad_accum", "max_steps", "log_every", "eval_every", "eval_steps",
            "checkpoint_every", "keep_checkpoints"):
    _positive_int(cfg, f"train.{f}")
  for f in ("early_stop_patience", "profile_steps", "eval_tasks_limit"):
    _positive_int(cfg, f"train.{f}", minimum=0)
  time_budget_s(cfg)
  _validate_eval_tasks(cfg.train)

  _within(cfg, "optim.lr", o.lr > 0, "> 0", "1e-3", e_g=True)
  _within(cfg, "optim.matrix_lr", o.matrix_lr > 0, "> 0", "0.02", e_g=True)
  _within(cfg, "optim.decay_fraction", 0 < o.decay_fraction <= 1, "in (0, 1]", "0.2")
  _within(cfg, "optim.momentum", 0.0 <= o.momentum < FLOAT32_BELOW_1, "in [0, 1)", "0.95")
  _within(cfg, "optim.min_lr_ratio", 0.0 <= o.min_lr_ratio <= 1.0, "in [0, 1]", "0.1")
  _positive_int(cfg, "optim.muon_ns_steps")
  _positive_int(cfg, "optim.warmup_steps", minimum=0)
  _positive_int(cfg, "optim.decay_steps", minimum=0)
  _within(cfg, "optim.weight_decay", o.weight_decay >= 0, ">= 0", "0.1")
  _within(cfg, "optim.z_loss", 0.0 <= o.z_loss <= 1.0, "in [0, 1] (0 turns it off)", "1e-4")
  _within(cfg, "optim.clip_norm", o.clip_norm >= 0, ">= 0 (0 turns clipping off)", "1.0")
  for b, usual in (("b1", "0.9"), ("b2", "0.95")):  # AdamW divides by 1 - b**step, in float32
    _within(cfg, f"optim.{b}", 0.0 <= o[b] < FLOAT32_BELOW_1, "in [0, 1) (and below 1 in float32)",
            usual)
  # A smaller eps rounds to 0 in float32, and a parameter with no gradient yet gets 0 / 0.
  _within(cfg, "optim.eps", o.eps >= 1e-30, "> 0 (at least 1e-30)", "1e-8")
  _one_of(o.loss_scaling, defaults.LOSS_SCALING, "optim.loss_scaling")


def _validate_data_sample(cfg: ml_collections.ConfigDict) -> None:
  d, s = cfg.data, cfg.sample
  path = os.path.expanduser(d.tokenizer)  # a string: _validate_types said so
  if d.tokenizer not in defaults.TOKENIZERS and ("/" in d.tokenizer or d.tokenizer.endswith(".json")):
    _check(os.path.isfile(path), "data.tokenizer", f"the file {path} does not exist"
           if not os.path.exists(path) else f"{path} is a directory, not a file",
           "pass the path of an existing tokenizer.json (or --config.data.tokenizer=bpe, byte, char)")
  _check(d.tokenizer in defaults.TOKENIZERS or os.path.isfile(path),
         "data.tokenizer", f"{_show(d.tokenizer)} is not byte, char, bpe, gpt2 or a tokenizer.json "
         "file", "pass --config.data.tokenizer=bpe (or byte, char, gpt2, or the path of a "
         "tokenizer.json)")
  _check(d.text_field != "", "data.text_field", "is empty", "pass --config.data.text_field=text")
  _validate_format(d)
  _check(not (d.messages_field and (d.prompt_field or d.completion_field)), "data.messages_field",
         f"is set ({_show(d.messages_field)}) and so are the prompt/completion fields; a record is "
         "a chat or a prompt and its completion, not both", "pass either "
         "--config.data.messages_field or --config.data.prompt_field and completion_field")
  for f, other in (("prompt_field", "completion_field"), ("completion_field", "prompt_field")):
    _check(bool(d[f]) or not d[other], f"data.{f}", f"is empty but data.{other} is set "
           "(prompt/completion records need both)", f"pass --config.data.{f}=<its field>, or "
           f"leave data.{other} empty for plain text")
  _check(not d.prompt_field or d.prompt_field != d.completion_field, "data.completion_field",
         f"is the same field as data.prompt_field ({d.prompt_field!r})",
         "pass the field that holds the completions")
  _check(d.vocab_size >= 257, "data.vocab_size", f"{d.vocab_size} is too small for byte-level "
         "BPE (256 byte tokens + end-of-text)", "pass --config.data.vocab_size=4096 (at least 257)")
  # Whether each split holds a window depends on the corpus: data.check_lengths says at run time.
  # Underflow-sized fractions are refused here (the tokens they would need overflow a float).
  _within(cfg, "data.val_fraction", 1e-30 <= d.val_fraction < 1, "in (0, 1) (at least 1e-30)", "0.1")
  _validate_data_path(d)
  validate_mixture(d)

  for f in ("num_samples", "max_new_tokens", "top_k"):
    _positive_int(cfg, f"sample.{f}", minimum=0)
  # Logits are divided by it in float32, where a smaller temperature is 0: nan samples.
  _within(cfg, "sample.temperature", s.temperature == 0 or s.temperature >= 1e-30,
          ">= 0 (0 is greedy; else at least 1e-30)", "0.8")



def _validate_format(d: ml_collections.ConfigDict) -> None:
  """Token files (data.format uint16 or llmc) are ids already: no records, nothing to learn."""
  _one_of(d.format, defaults.DATA_FORMATS, "data.format")
  if d.format not in ("uint16", "llmc"):
    return  # auto: data/tokenfiles.py says the same once it knows which files are token ids
  for f in ("prompt_field", "messages_field", "mixture"):
    _check(not d[f], f"data.{f}", f"is set, and data.format={d.format} reads token ids, not text",
           f"pass --config.data.{f}= (empty), or --config.data.format=auto for text")
  _check(d.tokenizer not in ("char", "bpe"), "data.tokenizer", f"{d.tokenizer} is learned from "
         f"text, and data.format={d.format} reads token ids", "pass the tokenizer.json the ids "
         "come from, or leave data.tokenizer=byte (the default: ids without a tokenizer)")


def _validate_mesh_distributed(cfg: ml_collections.ConfigDict) -> None:
  for f in ("data", "fsdp"):
    v = cfg.mesh[f]
    _check(v == -1 or v >= 1, f"mesh.{f}",
           f"must be -1 (all devices) or >= 1, got {v!r}", f"pass --config.mesh.{f}=-1")
  _positive_int(cfg, "mesh.cpu_devices", minimum=0)
  dist = cfg.distributed
  _positive_int(cfg, "distributed.num_processes", minimum=0)
  _positive_int(cfg, "distributed.timeout_s")
  _check(dist.process_id >= -1, "distributed.process_id",
         f"must be -1 (from the environment) or >= 0, got {dist.process_id!r}",
         "pass --config.distributed.process_id=<0 .. num_processes-1>")
  if dist.coordinator_address:
    host, _, port = dist.coordinator_address.rpartition(":")
    _check(bool(host) and port.isascii() and port.isdigit() and 0 < int(port) < 2**16,
           "distributed.coordinator_address",
           f"{dist.coordinator_address!r} is not host:port",
           "pass e.g. --config.distributed.coordinator_address=10.0.0.1:1234")
    _check(dist.num_processes >= 1 and 0 <= dist.process_id < dist.num_processes,
           "distributed.process_id",
           f"with a coordinator address, num_processes ({dist.num_processes}) and process_id "
           f"({dist.process_id}) must be set, 0 <= process_id < num_processes",
           "pass --config.distributed.num_processes=N --config.distributed.process_id=i")
  # Each process takes an equal share of the rows of every micro-batch.
  _check(dist.num_processes == 0 or cfg.train.batch_size % dist.num_processes == 0,
         "train.batch_size", f"{cfg.train.batch_size} does not split evenly over "
         f"distributed.num_processes={dist.num_processes}",
         f"pass a multiple of {dist.num_processes}")
  _check(not (cfg.mesh.data == -1 and cfg.mesh.fsdp == -1), "mesh.fsdp",
         "only one mesh axis can be -1",
         "pass --config.mesh.fsdp=1 or give mesh.data an explicit size")


def _validate_data_path(d: ml_collections.ConfigDict) -> None:
  """A recipe's `data.path = "<required>"` is the user's to give: what such a file holds, and where
  Tiny Shakespeare comes from for the text recipes."""
  if d.path != defaults.REQUIRED or d.mixture:
    return
  if d.messages_field:
    what, fix = "chat records", (f"chats.jsonl, .jsonl or .parquet records whose {d.messages_field!r} "
                                 "field is a list of {role, content} messages (docs/finetune.md)")
  elif d.prompt_field:
    what, fix = "prompt/completion records", (
        f"train.jsonl, .jsonl or .parquet records with {d.prompt_field!r} and "
        f"{d.completion_field!r} fields (docs/finetune.md)")
  else:
    what, fix = "text", ("input.txt, any UTF-8 text (Tiny Shakespeare: curl -o input.txt "
                         f"{defaults.TINY_SHAKESPEARE})")
  raise ConfigError("data.path", f"is not given (this recipe trains on {what} of yours)",
                    f"pass --config.data.path={fix}")


def _validate_eval_tasks(t: ml_collections.ConfigDict) -> None:
  names = [n for n, _ in eval_task_files(t.eval_tasks)]
  metric, parts = t.early_stop_metric, t.early_stop_metric.split("/")
  task_metric = len(parts) == 3 and parts[0] == "task" and parts[1] in names and \
      parts[2] in defaults.TASK_METRICS
  _check(metric in ("val_loss", "val_bpb") or task_metric, "train.early_stop_metric",
         f"{_show(metric)} is not val_loss, val_bpb or task/<name>/<{'|'.join(defaults.TASK_METRICS)}> "
         f"of a train.eval_tasks file (names: {', '.join(names) or 'none set'})",
         "pass --config.train.early_stop_metric=val_loss" +
         (f" (or e.g. task/{names[0]}/exact_match)" if names else ""))
