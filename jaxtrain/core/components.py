"""The components a run's config names, checked before any work: the user's code named in
`extend` loaded (`prepare`), every field validated with the components' names and options
(`validate`, the public `jt.validate`), and where the config names an extension's component, the
whole train step traced once without compiling (`trace`): a component that returns the wrong shape
or dtype, cannot be traced, or raises, is one error naming it, its file and line, and the fix.
"""

import ml_collections

from jaxtrain.config import defaults, extensions, lists
from jaxtrain.config import validate as validate_lib
from jaxtrain.core import kvcache, optim, registry, steps
from jaxtrain.core import model as model_lib
from jaxtrain.system.errors import ConfigError, UserError


def extend(files: str) -> list[str]:
  """Runs the Python files or modules `files` names (comma-separated, as config.extend), so that
  their components register, and their options are fields of every config made from now on
  (`jt.extend("my_ideas.py")` in a notebook, before `jt.load_config`); returns their paths."""
  return [source.path for source in extensions.load(files)]


def prepare(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`cfg` with its extensions loaded (their components registered), and the options of every
  component registered since `cfg` was made at their defaults (a copy, where any was missing)."""
  extend = cfg.get("extend", "")
  if not isinstance(extend, str):
    raise ConfigError("extend", f"must be a string, got {lists.show(extend)}",
                      "pass e.g. --config.extend=my_ideas.py")
  extensions.load(extend)
  declared = defaults.default_config().ext.to_dict()
  have = cfg.ext.to_dict() if "ext" in cfg else {}
  if "ext" in cfg and all(option in have.get(name, {}) for name, opts in declared.items()
                         for option in opts):
    return cfg
  cfg = cfg.copy_and_resolve_references()
  with cfg.unlocked():
    if "ext" not in cfg:
      cfg.ext = ml_collections.ConfigDict()
    for name, opts in declared.items():
      cfg.ext[name] = {**opts, **have.get(name, {})}
  return cfg


def validate(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Every field of `cfg` checked (config/validate.py), then the components it names: registered
  (built-in or loaded from `extend`), and through their own checks. Returns `cfg` as `prepare`
  completes it; raises ConfigError (or a UserError of the user's code)."""
  cfg = prepare(cfg)
  validate_lib.validate(cfg)
  check(cfg)
  return cfg


def check(cfg: ml_collections.ConfigDict) -> dict[str, registry.Component]:
  """The components `cfg` names ({kind: component}), each registered and content with `cfg`."""
  chosen = registry.chosen(cfg)
  for component in chosen.values():
    if component.check is not None:
      registry.call_check(component, cfg)
  m = cfg.model
  for needs, why in (("loss", "needs the logits of every token"),
                     ("model", "is a whole model that gives logits only")):
    component = chosen.get(needs)
    if component is None or component.builtin or (needs == "model" and
                                                 hasattr(component.obj, "head_weight")):
      continue
    for field in ("loss_chunk", "fused_loss"):
      if m[field]:
        raise ConfigError(f"model.{field}", f"is set, and {registry.KINDS[needs].field}="
                          f"{component.name} {why}", f"pass --config.model.{field}="
                          f"{'0' if field == 'loss_chunk' else 'False'}")
  return chosen


def extension_parts(cfg: ml_collections.ConfigDict) -> list[registry.Component]:
  """The components `cfg` chooses that are not jaxtrain's own."""
  return [c for c in registry.chosen(cfg).values() if not c.builtin]


def trace(cfg: ml_collections.ConfigDict, vocab_size: int = 256) -> None:
  """Where `cfg` names an extension's component: its model built, a train step and an evaluation
  traced (shapes only: nothing compiled or run) on `cfg`'s shapes, and a cached forward pass where
  every part extends a key-value cache. A component that breaks its contract is a UserError."""
  ours = extension_parts(cfg)
  if not ours:
    return
  import jax
  import jax.numpy as jnp
  from flax import nnx

  mc = model_lib.ModelConfig.from_config(cfg.model, cfg.model.vocab_size or vocab_size, cfg.ext)
  opt = optim.make_optimizer(cfg.optim, max_steps=cfg.train.max_steps, grad_accum=1, ext=cfg.ext)
  batch = {"tokens": jax.ShapeDtypeStruct((2, mc.seq_len + 1), jnp.int32)}
  try:
    state = jax.eval_shape(lambda: steps.init_state(mc, opt, seed=0))
    jax.eval_shape(steps.train_step, state, batch)
    if not model_lib.kv_cache(mc):
      cached = lambda params, t: nnx.merge(state.graphdef, params)(  # noqa: E731
          t, cache=kvcache.empty(mc, 2), pos=jnp.int32(0))
      jax.eval_shape(cached, state.params, jax.ShapeDtypeStruct((2, 1), jnp.int32))
  except UserError as e:  # a component's own line: JAX's note on the frames it hid is not ours
    e.__notes__ = [n for n in getattr(e, "__notes__", []) if "JAX_TRACEBACK_FILTERING" not in n]
    raise
  except Exception as e:  # outside any one component's call: the way they fit together
    names = ", ".join(f"{registry.KINDS[c.kind].field}={c.name}" for c in ours)
    raise extensions.code_error(e, f"the train step of {names} does not trace",
                                "make each return what docs/extending.md says its kind returns") \
        from None
