"""Per-group training statistics, computed inside the compiled train step from trees it already
holds: each group's gradient norm, parameter norm and update-to-parameter ratio (the groups and
the metrics' names: docs/tracking.md, Per-group statistics). A "/" in a metric's name marks a
statistic; the loop copies them off the device only on the steps it logs.
"""

import jax
import jax.numpy as jnp
import optax

from jaxtrain.core import optim

MODES = ("groups", "layers", "none")
STATS = ("grad_norm", "param_norm", "update_ratio")


def is_stat(key: str) -> bool:
  return "/" in key


def group_of(path, muon_group: str, mode: str) -> str:
  """The statistics group of the param at `path`; `muon_group` is optim.param_groups' for it."""
  names = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
  if muon_group in ("embedding", "head"):
    return muon_group
  if muon_group == "vector":
    group = "norms"
  else:
    group = "attention" if "attn" in names else "mlp" if "mlp" in names else "other"
  if mode == "layers" and "blocks" in names:
    return f"layer{names[names.index('blocks') + 1]}.{group}"
  return group


def groups(params, mode: str) -> dict[str, list[int]]:
  """{group: indices of its leaves in jax.tree.leaves(params)}, in the order leaves come."""
  with_path = jax.tree_util.tree_leaves_with_path(params)
  muon = jax.tree.leaves(optim.param_groups(params))
  out: dict[str, list[int]] = {}
  for i, ((path, _), muon_group) in enumerate(zip(with_path, muon)):
    out.setdefault(group_of(path, muon_group, mode), []).append(i)
  return out


def group_stats(old_params, grads, new_params, mode: str) -> dict[str, jax.Array]:
  """The statistics of one micro-step: `old_params` before the update, `grads` of this
  micro-batch, `new_params` after it (unchanged on a micro-step that only accumulates). An update
  ratio is ||new - old|| / ||old|| of its group (0 while those params are all zero). The update is
  taken from the params, which the step holds anyway, rather than from the optimizer's output,
  which XLA would then have to keep apart from the fused param update."""
  if mode == "none":
    return {}
  p, g, n = (jax.tree.leaves(t) for t in (old_params, grads, new_params))
  out = {}
  for name, idx in groups(old_params, mode).items():
    p_norm = optax.tree.norm([p[i] for i in idx])  # float32, as params and gradients are
    u_norm = optax.tree.norm([n[i] - p[i] for i in idx])
    out[f"grad_norm/{name}"] = optax.tree.norm([g[i] for i in idx])
    out[f"param_norm/{name}"] = p_norm
    out[f"update_ratio/{name}"] = jnp.where(p_norm > 0, u_norm / jnp.where(p_norm > 0, p_norm, 1), 0.0)
  return out


def combine(micro: list[dict]) -> dict[str, float]:
  """One optimizer step's statistics from its micro-steps' (host values): gradient norms are the
  mean over micro-batches, as the global grad_norm; the param norm and update ratio are the last
  micro-step's, the one whose update the optimizer applied."""
  def mean(key: str) -> float:
    values = [float(m[key]) for m in (micro if key.startswith("grad_norm/") else micro[-1:])]
    return sum(values) / len(values)
  return {key: mean(key) for key in micro[-1] if is_stat(key)}
