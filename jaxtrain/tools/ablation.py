"""What keeps a comparison of runs from misleading (`jaxtrain.compare`): the difference of each run
to a chosen baseline, the spread of runs that differ only in their seed, and one line where the
runs trained different steps or tokens or paid different compile times (a time budget's runs: a
compile cached by an earlier run buys steps), with their losses at the last step all evaluated."""

import math
import statistics
from collections.abc import Callable

from jaxtrain.config import defaults
from jaxtrain.system import fmt
from jaxtrain.tools import runs

# Fields a comparison leaves out when it asks whether runs differ only in their seed.
NOT_A_DIFFERENCE = ("seed", "workdir", "train.max_steps")
COMPILE_APART_S = 2.0  # compile times this far apart (and by a quarter) are said


def tokens_per_step(info: runs.RunInfo) -> int | None:
  c = info.config
  try:
    return int(c["train.batch_size"] * c["train.grad_accum"] * c["model.seq_len"])
  except (KeyError, TypeError):
    return None


def seed_groups(infos: list[runs.RunInfo], fields: list[str]) -> list[list[runs.RunInfo]]:
  """The runs grouped by the values of `fields` (the ones that differ), seed aside: each group's
  runs differ only in their seed. In the order of their first run."""
  groups: dict[tuple, list[runs.RunInfo]] = {}
  for info in infos:
    key = tuple(repr(info.config.get(f)) for f in fields if f not in NOT_A_DIFFERENCE)
    groups.setdefault(key, []).append(info)
  return list(groups.values())


def find(infos: list[runs.RunInfo], names: list[str], baseline: str) -> runs.RunInfo | None:
  """The run `baseline` names: its directory name or path; None when it names none."""
  for name, info in zip(names, infos):
    if baseline in (name, info.path.name, str(info.path)):
      return info
  return None


def delta(value: float | None, base: float | None) -> str:
  if value is None or base is None:
    return "-"
  return "baseline" if value == base else f"{value - base:+.4f}"


def spread_table(groups: list[list[runs.RunInfo]], fields: list[str], key: str,
                 base_group: list[runs.RunInfo] | None,
                 show: Callable[[runs.RunInfo, str], str]) -> tuple[list[str], list[list[str]]] | None:
  """(header, rows) of the runs that differ only in their seed: per group, its `fields` as
  `show(run, field)` gives them, its runs' best `key` (mean, standard deviation, range) and its
  mean's difference to the baseline group's, with the standard error of that difference; None
  where no group has two runs."""
  if not any(len(g) > 1 for g in groups):
    return None
  stats = [_stats([v for info in g if (v := info.best(key)) is not None]) for g in groups]
  base = stats[groups.index(base_group)] if base_group in groups else None
  shown = [f for f in fields if f not in NOT_A_DIFFERENCE]
  header = [*shown, "runs", f"mean best {key}", "std", "min", "max", "Δ mean"]
  body = []
  for group, (n, mean, std, low, high) in zip(groups, stats):
    row = [show(group[0], f) for f in shown]
    if base is None or mean is None or base[1] is None:
      change = "-"
    elif group is base_group:
      change = "baseline"
    else:
      err = math.sqrt((std or 0.0) ** 2 / n + (base[2] or 0.0) ** 2 / base[0])
      change = f"{mean - base[1]:+.4f}" + (f" ± {err:.4f}" if n > 1 and base[0] > 1 else "")
    body.append([*row, str(n), *(_loss(x) for x in (mean, std, low, high)), change])
  return header, body


def _stats(values: list[float]) -> tuple:
  if not values:
    return 0, None, None, None, None
  std = statistics.stdev(values) if len(values) > 1 else None
  return len(values), statistics.fmean(values), std, min(values), max(values)


def _loss(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"


def _span(values: list, show) -> str:
  low, high = min(values), max(values)
  return show(low) if low == high else f"{show(low)} to {show(high)}"


def unequal(infos: list[runs.RunInfo]) -> str | None:
  """One warning line where the runs trained different steps or tokens, or (under a time budget,
  where a compile costs training time) paid different compile times; None where they did not."""
  if len(infos) < 2:
    return None
  steps = [info.step for info in infos]
  tokens = [info.step * t for info in infos if (t := tokens_per_step(info)) is not None]
  budget = any(info.config.get("train.time_budget") for info in infos)
  compiles = [c for info in infos if isinstance(c := info.status.get("compile_s"), int | float)]
  said = []
  if len(set(steps)) > 1:
    said.append(f"different steps ({_span(steps, str)})")
  if len(set(tokens)) > 1:
    said.append(f"different tokens ({_span(tokens, fmt.count)})")
  if budget and len(compiles) > 1 and \
      max(compiles) - min(compiles) > max(COMPILE_APART_S, 0.25 * max(compiles)):
    said.append(f"paid different compile times ({_span(compiles, fmt.duration)})")
  if not said:
    return None
  why = ("; under a time budget a run whose compile was cached trains longer (jaxtrain-sweep "
         "compiles every variant before its timed runs)") if budget else ""
  after = "; the line below compares them at equal steps" if len(set(steps)) > 1 else ""
  return (f"warning: these runs trained {', '.join(said)}: their final and best losses do not "
          f"compare as they stand{why}{after}")


def at_equal_steps(infos: list[runs.RunInfo], names: list[str], key: str) -> str | None:
  """The runs' `key` at the last step every one of them evaluated, best first; None where they
  share no evaluated step or trained the same steps."""
  if len({info.step for info in infos}) < 2:
    return None
  evaluated = [{r["step"]: r.get(key) for r in info.evals if isinstance(r.get(key), int | float)}
               for info in infos]
  common = set.intersection(*(set(e) for e in evaluated)) if evaluated else set()
  if not common:
    return None
  step = max(common)
  values = sorted(((e[step], name) for e, name in zip(evaluated, names)),
                  reverse=defaults.higher_is_better(key))
  # A schedule decays to its own run's end: at one step, runs of other ends are at other rates.
  ends = {info.max_steps for info in infos}
  caveat = ("; each at its own point of a schedule that decays to its own end, so the fair test "
            "is runs of equal steps") if len(ends) > 1 else ""
  return (f"at equal steps: {key} at step {step} (the last step every run evaluated): "
          + ", ".join(f"{name} {v:.4f}" for v, name in values) + caveat)
