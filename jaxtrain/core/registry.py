"""The components a config names: each kind's built-in ones and those of the user's own code, all
registered the same way (`@jt.mlp("name")`, ...) and chosen by one config field each (`KINDS`).

A component is a class or function (what each kind is called with: docs/extending.md) and its
options, {name: default}: they become the config fields ext.<component>.<option> (validated by
their default's type, shown by --dry_run, kept in config.json, set from the command line) and
reach it as keyword arguments. Where the built-ins live: core/layers.py (norms, positions, MLPs,
attention variants, the block), core/model.py (the model), core/optim.py (optimizers, schedules).
"""

import dataclasses
import inspect
import linecache
import os
import re
from collections.abc import Callable
from typing import Any

from jaxtrain.config import defaults
from jaxtrain.system.errors import ConfigError, UserError


@dataclasses.dataclass(frozen=True)
class Kind:
  field: str  # the config field that names the component of this kind a run uses
  called: str  # what the component is, and what it is called with


KINDS = {
    "norm": Kind("model.norm", "a class: Norm(c, rngs, **options)(x_BTD) -> x_BTD"),
    "positions": Kind("model.pos", "a class: Positions(c, rngs, **options), with embed(x_BTD, "
                      "pos_T) -> x_BTD and/or rotate(x_BTHK, pos_T) -> x_BTHK"),
    "mlp": Kind("model.mlp", "a class: MLP(c, rngs, **options)(x_BTD) -> x_BTD"),
    "attention": Kind("model.attention_variant", "a function: attend(q_BTHK, k_BSGK, v_BSGK, "
                      "at, **options) -> y_BTHK (at: jt.Attend, the positions and masks)"),
    "block": Kind("model.block", "a class: Block(c, rngs, **options)(x_BTD, at) -> x_BTD"),
    "model": Kind("model.arch", "a class: Model(c, rngs, **options)(tokens_BT) -> logits_BTV"),
    "optimizer": Kind("optim.name", "a function: make(lr, o, **options) -> "
                      "optax.GradientTransformation (lr: the schedule, o: the optim settings)"),
    "schedule": Kind("optim.schedule", "a function: after(progress, peak, o, **options) -> the "
                     "learning rate after warmup (progress: 0 -> 1 over the decay)"),
    "loss": Kind("optim.loss_term", "a function: term(logits_BTV, targets_BT, **options) -> "
                 "float32[B, T], added to the training loss"),
}
MODEL_KINDS = ("norm", "positions", "mlp", "attention", "block", "model")
# Features a component may say it has, given to its decorator beside its options.
FEATURES = {"kv_cache": "it extends a key-value cache (sampling uses one)",
            "check": "check(cfg): raises jt.ConfigError for options or fields it cannot take",
            "flops": "flops(o, params) -> matmul FLOPs an optimizer step adds",
            "start": "start(o, decay_end) -> (decay start, decay length) of a schedule"}
OPTION_TYPES = (bool, int, float, str)
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Component:
  kind: str
  name: str
  obj: Any  # the class or function
  options: tuple[tuple[str, Any], ...]  # (option, default), as declared
  source: str  # the file that defines it
  line: int
  builtin: bool
  kv_cache: bool = True
  check: Callable | None = None
  flops: Callable | None = None
  start: Callable | None = None
  batched_init: bool = False  # its params are draws.normal's, which draws.batched makes faster

  @property
  def where(self) -> str:
    try:
      source = min(self.source, os.path.relpath(self.source), key=len)
    except ValueError:  # another drive
      source = self.source
    return f"{source}, line {self.line}" if self.line else source


_REGISTRY: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}


def _origin(obj) -> tuple[str, int]:
  """The file and line that define `obj` (a class of a file run by config/extensions.py is in no
  module Python knows: its methods' code says where it is)."""
  try:
    return inspect.getsourcefile(obj) or "<unknown>", inspect.getsourcelines(obj)[1]
  except (OSError, TypeError):
    pass
  code = getattr(obj, "__code__", None)
  if code is not None:
    return code.co_filename, code.co_firstlineno
  for value in vars(obj).values() if isinstance(obj, type) else ():
    code = getattr(value, "__code__", None)
    if code is not None:
      lines = linecache.getlines(code.co_filename)
      at = [i + 1 for i, text in enumerate(lines[:code.co_firstlineno])
            if re.match(rf"\s*class\s+{obj.__name__}\b", text)]
      return code.co_filename, at[-1] if at else code.co_firstlineno
  return "<unknown>", 0


def register(kind: str, name: str, obj, options: dict | None = None, *, builtin: bool = False,
             **features) -> Component:
  """Adds `obj` as the `kind` component `name`. A name taken by another file (or a built-in) is a
  UserError; the same file registering it again (a reload) replaces it."""
  options = dict(options or {})
  if kind not in KINDS:
    raise UserError(f"no component kind {kind!r}; the kinds: {', '.join(KINDS)}")
  if not isinstance(name, str) or not _NAME.fullmatch(name):
    raise UserError(f"{kind} name {name!r}: use lowercase letters, digits and _ (a config value "
                    "and a config section's name)")
  for option, default in options.items():
    if not _NAME.fullmatch(option) or type(default) not in OPTION_TYPES:
      raise UserError(f"{kind} {name!r}: option {option}={default!r}: an option is a lowercase "
                      "name with a default of type bool, int, float or str")
  unknown = set(features) - set(FEATURES) - ({"batched_init"} if builtin else set())
  if unknown:
    raise UserError(f"{kind} {name!r}: {', '.join(sorted(unknown))} is not a feature a component "
                    f"declares ({', '.join(FEATURES)}); options are bool, int, float or str")
  source, line = _origin(obj)
  new = Component(kind, name, obj, tuple(options.items()), source, line, builtin, **features)
  old = _REGISTRY[kind].get(name)
  if old is not None and (old.builtin or builtin or old.source != source):
    taken = f"a built-in {kind}" if old.builtin else f"registered by {old.where}"
    raise UserError(f"{kind} {name!r} ({new.where}) is {taken}; give it another name")
  if options and not builtin:
    _claim_options(new)
  _REGISTRY[kind][name] = new
  return new


def _claim_options(new: Component) -> None:
  """Options are ext.<name>.*: two components of one name with options would share the section."""
  for kind, components in _REGISTRY.items():
    other = components.get(new.name)
    if kind != new.kind and other is not None and other.options:
      raise UserError(f"{new.kind} {new.name!r} ({new.where}) and {kind} {new.name!r} "
                      f"({other.where}) both have options, which would share ext.{new.name}; "
                      "rename one")
  defaults.declare_options(new.name, dict(new.options))


def decorator(kind: str, name: str, options: dict, builtin: bool = False, **features):
  def add(obj):
    register(kind, name, obj, options, builtin=builtin, **features)
    return obj
  return add


def names(kind: str) -> list[str]:
  return list(_REGISTRY[kind])


def get(kind: str, name: str) -> Component:
  """The `kind` component `name`; an unknown name is a ConfigError of its field listing them."""
  found = _REGISTRY[kind].get(name)
  if found is None:
    raise unknown(kind, name)
  return found


def unknown(kind: str, name: str, extend: str = "") -> ConfigError:
  field, comps = KINDS[kind].field, _REGISTRY[kind].values()
  builtin = [c.name for c in comps if c.builtin]
  theirs = [f"{c.name} ({c.where})" for c in comps if not c.builtin]
  listed = f"built-in: {', '.join(builtin) or 'none'}; registered: {', '.join(theirs) or 'none'}"
  where = f"in --config.extend={extend}" if extend else "in a file you name in --config.extend"
  first = f"--config.{field}={builtin[0]}, or " if builtin else ""
  return ConfigError(field, f"{name!r} names no {kind} here ({listed})",
                     f"pass {first}register yours: @jt.{kind}({name!r}) {where} (docs/extending.md)")


def chosen(cfg) -> dict[str, Component]:
  """{kind: the component `cfg` names} (a loss term only where one is named); a ConfigError for a
  name that is not registered."""
  found = {}
  for kind, k in KINDS.items():
    section, field = k.field.split(".")
    name = cfg[section][field]
    if kind == "loss" and name == "":
      continue
    if name not in _REGISTRY[kind]:
      raise unknown(kind, name, cfg.extend)
    found[kind] = _REGISTRY[kind][name]
  return found


def options_of(ext, name: str) -> tuple[tuple[str, Any], ...]:
  """The options of component `name` as a run's `ext` section (a ConfigDict or dict) sets them."""
  section = ext.get(name) if ext is not None else None
  return tuple(sorted(dict(section).items())) if section else ()


def call(component: Component, *args, options: tuple = ()):
  """`component.obj(*args, **options)`: an exception raised in the user's code is a UserError that
  shows their frames (config/extensions.code_error)."""
  if component.builtin:
    return component.obj(*args, **dict(options))
  try:
    return component.obj(*args, **dict(options))
  except UserError:
    raise
  except Exception as e:
    raise in_component(component, e) from None


def call_check(component: Component, cfg) -> None:
  """A component's own `check(cfg)`: a ConfigError it raises is the run's; any other exception,
  the component's bug, is told with its frames."""
  try:
    component.check(cfg)
  except UserError:
    raise
  except Exception as e:
    raise in_component(component, e, "check raised") from None


def in_component(component: Component, e: BaseException, what: str = "raised") -> UserError:
  from jaxtrain.config import extensions

  field = KINDS[component.kind].field
  traced = type(e).__name__ in ("ConcretizationTypeError", "TracerBoolConversionError",
                                "TracerArrayConversionError", "TracerIntegerConversionError")
  fix = ("it is traced: use jnp operations on arrays, no float(), int(), bool(), `if` or "
         "numpy on them (static shapes and options are fine)") if traced else \
      f"fix {os.path.basename(component.source)}"
  return extensions.code_error(e, f"{field}={component.name}: the {component.kind} {what}", fix)


# The decorators the public surface exports (jt.norm, ...): `@jt.mlp("mine", width=2.0)`.
def norm(name: str, *, check: Callable | None = None, **options):
  return decorator("norm", name, options, check=check)


def positions(name: str, *, kv_cache: bool = True, check: Callable | None = None, **options):
  return decorator("positions", name, options, kv_cache=kv_cache, check=check)


def mlp(name: str, *, check: Callable | None = None, **options):
  return decorator("mlp", name, options, check=check)


def attention(name: str, *, kv_cache: bool = True, check: Callable | None = None, **options):
  return decorator("attention", name, options, kv_cache=kv_cache, check=check)


def block(name: str, *, kv_cache: bool = True, check: Callable | None = None, **options):
  return decorator("block", name, options, kv_cache=kv_cache, check=check)


def model(name: str, *, kv_cache: bool = False, check: Callable | None = None, **options):
  return decorator("model", name, options, kv_cache=kv_cache, check=check)


def optimizer(name: str, *, flops: Callable | None = None, check: Callable | None = None,
              **options):
  return decorator("optimizer", name, options, flops=flops, check=check)


def schedule(name: str, *, start: Callable | None = None, check: Callable | None = None,
             **options):
  return decorator("schedule", name, options, start=start, check=check)


def loss(name: str, *, check: Callable | None = None, **options):
  return decorator("loss", name, options, check=check)
