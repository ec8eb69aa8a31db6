"""The config fields that hold comma-separated lists (`data.mixture`, `train.eval_tasks`,
`finetune.lora_targets`): each parsed in one place, for validation and for the code that uses it
(`validate_mixture` checks the mixture against the other data fields), and the two primitives
every field check shares (`check`, `show`).
"""

import glob
import math
import os

import ml_collections

from jaxtrain.config import defaults
from jaxtrain.system.errors import ConfigError


def check(ok: bool, field: str, problem: str, fix: str) -> None:
  if not ok:
    raise ConfigError(field, problem, fix)


def show(value) -> str:
  """A value as an error message shows it: one short line, whatever the value is.

  A long value keeps its start and its end (a path's file name is what tells one from another).
  """
  if isinstance(value, dict | ml_collections.ConfigDict):
    return "a section (a dict of fields)"
  text = " ".join(repr(value).split())
  return text if len(text) <= 60 else text[:24] + "..." + text[-33:]


def lora_targets(spec: str) -> tuple[str, ...]:
  """`finetune.lora_targets` ("qkv,out") as a tuple of layer names; raises ConfigError."""
  names = tuple(name.strip() for name in spec.split(",")) if spec.strip() else ()
  for i, name in enumerate(names):
    check(name in defaults.LORA_TARGETS, "finetune.lora_targets", f"{show(name)} is not a linear "
           f"layer of the model's blocks (those are {', '.join(defaults.LORA_TARGETS)})",
           "pass some of them, comma-separated, e.g. --config.finetune.lora_targets=qkv,out")
    check(name not in names[:i], "finetune.lora_targets", f"names {name} twice",
           "name each layer once")
  return names


def mixture_sources(spec: str) -> list[tuple[str, float]]:
  """`data.mixture` ("books/*.txt:3,notes.jsonl:1") as [(source, weight)]; raises ConfigError."""
  fix = "pass --config.data.mixture=SOURCE:WEIGHT,SOURCE:WEIGHT (e.g. books/*.txt:3,notes.jsonl:1)"
  sources = []
  for item in spec.split(","):
    source, sep, weight = item.strip().rpartition(":")
    try:
      w = float(weight)
    except ValueError:
      w = math.nan
    check(bool(sep) and source != "", "data.mixture", f"{show(item)} is not SOURCE:WEIGHT", fix)
    check(math.isfinite(w) and w > 0, "data.mixture", f"{show(item)}: the weight "
           f"{show(weight)} is not a positive number", fix)
    sources.append((source, w))
  return sources


def eval_task_files(spec: str) -> list[tuple[str, str]]:
  """`train.eval_tasks` ("held.jsonl,mc.jsonl") as [(name, path)], a name its file's stem (the
  metrics are task/<name>/...); raises ConfigError. Their records are read at setup."""
  if spec.strip() == "":
    return []
  fix = "pass --config.train.eval_tasks=FILE.jsonl[,FILE.jsonl...] (held-out records), or \"\""
  tasks: list[tuple[str, str]] = []
  for item in spec.split(","):
    path = os.path.expanduser(item.strip())
    check(path != "", "train.eval_tasks", f"{show(spec)} has an empty item", fix)
    check(os.path.isfile(path), "train.eval_tasks", f"{item.strip()!r} is " +
           ("a directory, not a file" if os.path.isdir(path) else "not a file"), fix)
    name = os.path.splitext(os.path.basename(path))[0]
    check(name not in {n for n, _ in tasks}, "train.eval_tasks", f"two files are named {name!r} "
           f"(their metrics would both be task/{name}/...)", "rename one of them")
    tasks.append((name, path))
  return tasks


def validate_mixture(d: ml_collections.ConfigDict) -> None:
  """`data.mixture` beside the other data fields: one source given once, each matching files."""
  if d.mixture == "":
    return
  check(d.path in ("", defaults.REQUIRED), "data.mixture", f"is set and so is data.path ({show(d.path)})",
         "pass either --config.data.path or --config.data.mixture (its sources are the data)")
  check(not (d.prompt_field and d.completion_field), "data.mixture",
         "mixes text sources; prompt/completion records (data.prompt_field) are one source",
         "pass either --config.data.mixture or the prompt and completion fields")
  check(not d.messages_field, "data.mixture",
         "mixes text sources; chat records (data.messages_field) are one source",
         "pass either --config.data.mixture or --config.data.messages_field")
  seen = set()
  for source, _ in mixture_sources(d.mixture):
    check(source not in seen, "data.mixture", f"names {show(source)} twice",
           "name each source once (add up its weights)")
    seen.add(source)
    path = os.path.expanduser(source)
    check(os.path.exists(path) or any(os.path.isfile(f) for f in glob.iglob(path, recursive=True)),
           "data.mixture", f"the source {show(source)} matches no file (not a file, a directory "
           "with files, or a glob)", "point each source of --config.data.mixture at your text")
