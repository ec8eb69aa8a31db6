"""`python -m jaxtrain.sweep --config=F --sweep=field=v1,v2 [--sweep=...] --root=DIR [--parallel=N]
[--seeds=N] [--config.x=y ...] [--jax_platforms=cpu]`: every combination of the swept values (and
`--seeds` seeds of each), a run each.

Each run is its own process (`python -m jaxtrain`, tools/launcher.py) in DIR/<swept values>;
running the same command again continues the sweep (docs/watching.md, Sweeps). Under a time
budget every variant is compiled first, outside any budget (`compile_ahead`): a variant whose
compile an earlier run had cached would otherwise train for longer than the others.
"""

import itertools
import re
import shutil
import sys
import time
from pathlib import Path

from absl import flags

from jaxtrain.config import defaults, extensions, loading, schema, validate
from jaxtrain.system import fmt, invocation, paths
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.tools import cli, compare
from jaxtrain.tools.launcher import PROGRESS_EVERY_S, Args, Point, Sweep, done

_COMMAND = invocation.command("jaxtrain.sweep")
USAGE = (f"usage: {_COMMAND} --config=F --sweep=field=v1,v2 [--sweep=...] --root=DIR "
         "[--parallel=N] [--config.x=y ...] (see --help)")
VALUES = {"config": "FILE", "sweep": "FIELD=V1,V2", "root": "DIR", "baseline": "RUN"}  # --help shows
PASSED_ON = (("--config.FIELD=V", "A setting for every run of the sweep."),
             ("--jax_*=V", "Passed on to every run (e.g. --jax_platforms=cpu)."))
COMPILE_DIR = ".compile"  # under --root: the compile-ahead runs, removed once they end


def _known_field(name: str, flag: str) -> str:
  known = loading.field_names()
  if name not in known:
    raise UserError(f"{flag}: {name} is not a config field; {schema.suggestion(name, known)}")
  if name == "workdir":
    raise UserError(f"{flag}: the sweep sets each run's workdir under --root; drop it")
  return name


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  own = {"flag_values": flag_values}
  flags.DEFINE_string("config", None, "The config every run starts from (a file, or a recipe: nano).",
                      **own)
  flags.DEFINE_multi_string("sweep", None, "A config field and its values; the runs are every "
                            "combination of the swept values", **own)
  flags.DEFINE_string("root", None, "Where the runs go: DIR/<swept values>, logs in DIR/logs, the "
                      "comparison in DIR.", **own)
  flags.DEFINE_integer("parallel", 1, "Runs at once, each on its own share of the CPU cores.",
                       **own)
  flags.DEFINE_float("progress_every_s", PROGRESS_EVERY_S, "How often each running run's step, "
                     "loss and ETA are printed.", **own)
  flags.DEFINE_integer("seeds", 1, "Each point runs with this many seeds (the config's seed, + 1, "
                       "...); the comparison shows the spread across them.", **own)
  flags.DEFINE_string("baseline", "", "A run of the sweep (its directory's name) that the "
                      "comparison takes each run's difference to.", **own)
  flags.DEFINE_bool("compile_ahead", True, "With train.time_budget: compile every variant first, "
                    "outside the budgets, so that each trains for the same time.", **own)


def parse(argv: list[str]) -> Args:
  """The sweep's arguments (without the command's name), checked."""
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  return arguments(flag_values, cli.parse_args(argv, flag_values, known_only=True))


def arguments(f: flags.FlagValues, rest: list[str]) -> Args:
  """The sweep's flags `f` and what it passes on to every run (`rest`), checked."""
  overrides, passthrough, sweeps = [], [], []
  _load_extensions(f, rest)
  for arg in rest:
    if arg.startswith("--config.") and "=" in arg:
      _known_field(arg[len("--config."):].split("=", 1)[0], arg)
      overrides.append(arg)
    elif arg.startswith("--jax_"):
      passthrough.append(arg)
    else:
      raise UserError(f"unexpected argument {arg}; {USAGE}")
  for value in f.sweep or []:
    arg = f"--sweep={value}"
    field, eq, values = value.partition("=")
    items = [v.strip() for v in values.split(",")]
    if not eq or not all(items):
      raise UserError(f"{arg}: write --sweep=field=v1,v2 (e.g. --sweep=optim.lr=1e-3,3e-3)")
    if any(field == name for name, _ in sweeps):
      raise UserError(f"{arg}: {field} is swept twice; give all its values in one --sweep")
    sweeps.append((_known_field(field, arg), items))
  if f.seeds < 1 or (f.seeds > 1 and any(field == "seed" for field, _ in sweeps)):
    raise UserError(f"--seeds={f.seeds}: must be an integer >= 1, and not with --sweep=seed=... "
                    "(give the seeds there, or --seeds=N for N of them)")
  for need in ("config", "root"):
    if not f[need].value:
      raise UserError(f"--{need} is missing; {USAGE}")
  config_file = loading.find_config(f.config)  # a file, or a recipe's name
  if config_file is None:
    raise UserError(loading.missing_config(f.config))
  if not sweeps:
    raise UserError(f"nothing to sweep; {USAGE}")
  if f.parallel < 1:
    raise UserError(f"--parallel={f.parallel}: must be an integer >= 1 (runs at once)")
  if not f.progress_every_s > 0:
    raise UserError(f"--progress_every_s={f.progress_every_s:g}: must be a number of seconds > 0")
  return Args(config_file, sweeps, Path(f.root).expanduser(), f.parallel, overrides, passthrough,
              f.progress_every_s, f.seeds, f.compile_ahead, f.baseline)


def _load_extensions(f: flags.FlagValues, rest: list[str]) -> None:
  """The user's code the runs name (--config.extend=..., else the config file's), loaded before
  the fields are checked: their components' options are fields the sweep may set or sweep."""
  given = [arg.split("=", 1)[1] for arg in rest if arg.startswith("--config.extend=")]
  path = loading.find_config(f.config) if f.config else None
  if given or path:
    extensions.load(given[-1] if given else loading.load_config(path).extend)


def typed(field: str, text: str, default):
  """`text` as the field's type, as the run's own flag parser will read it."""
  kind = type(default)
  try:
    if kind is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    return kind(text)
  except ValueError:
    raise ConfigError(field, f"{text!r} is not {validate.KINDS[kind]}",
                      f"pass values like --sweep={field}={default}") from None


def _name(values: list[tuple[str, str]]) -> str:
  leaves = [f.rsplit(".", 1)[-1] for f, _ in values]
  short = [leaf if leaves.count(leaf) == 1 else f for leaf, (f, _) in zip(leaves, values)]
  name = "_".join(f"{s}={v}" for s, (_, v) in zip(short, values))
  return re.sub(r"[^A-Za-z0-9._=+-]", "-", name)


def grid(args: Args) -> list[Point]:
  """Every combination, each config built and validated here, so a bad value stops the sweep
  before any run starts."""
  from jaxtrain.core import components  # jax's import: only once the arguments are sound

  default = loading.flatten(defaults.default_config().to_dict())
  base = loading.load_config(args.config)
  for arg in args.overrides:
    field, text = arg[len("--config."):].split("=", 1)
    loading.override(base, **{field: typed(field, text, default[field])})
  seeds = [("seed", [str(base.seed + i) for i in range(args.seeds)])] if args.seeds > 1 else []
  points = []
  for combo in itertools.product(*[[(f, v) for v in vs] for f, vs in [*args.sweeps, *seeds]]):
    cfg = base.copy_and_resolve_references()
    values = []
    for field, text in combo:
      value = typed(field, text, default[field])
      loading.override(cfg, **{field: value})
      values.append((field, str(value) if isinstance(value, bool) else text))
    name = _name(values)
    cfg.workdir = str(args.root / name)
    cfg = components.validate(cfg)  # the components each names too
    points.append(Point(name, values, args.root / name, args.root / "logs" / f"{name}.log",
                        cfg.train.max_steps, budget=bool(cfg.train.time_budget),
                        shape_known=cfg.model.size != "auto"))
  if len({p.name for p in points}) < len(points):
    raise UserError("two runs of the sweep would share a directory name; make the values differ")
  return points


def compile_ahead(args: Args, points: list[Point]) -> Sweep | None:
  """Under a time budget, each variant's programs compiled into the compile cache before any run
  is timed: a one-step run of it (no budget) in DIR/.compile/, removed once it ends. Each timed
  run then finds its compiles cached, as a variant cached by an earlier run would: the budgets
  train for the same time. None where there is nothing to compile ahead."""
  timed = [p for p in points if p.budget and not done(p)]
  unknown = [p.name for p in timed if not p.shape_known]
  if unknown:
    print(f"sweep: model.size=auto chooses each run's shape in its own budget, so {', '.join(unknown)}"
          " cannot be compiled ahead: a variant whose compile is cached trains for longer")
  variants = {}  # seeds of one point share its programs: one compile for them all
  for p in timed:
    if p.shape_known:
      variants.setdefault(tuple(v for v in p.values if v[0] != "seed"), p)
  ahead = [Point(p.name, p.values, args.root / COMPILE_DIR / p.name,
                 args.root / "logs" / f"{p.name}.compile.log", 1,
                 extra=("--config.train.time_budget=", "--config.train.max_steps=1"))
           for p in variants.values()]
  if not ahead or not args.compile_ahead:
    if ahead:
      print("sweep: --nocompile_ahead: each timed run compiles in its own budget, and one whose "
            "compile is cached already trains for longer (jaxtrain-compare says so)")
    return None
  print(f"sweep: compiling the {len(ahead)} variant(s) first, outside their budgets (a one-step "
        f"run each, in {args.root / COMPILE_DIR}): each timed run then finds its compiles "
        "cached, so every budget trains for the same time")
  sweep = Sweep(args, ahead)
  sweep.run()
  shutil.rmtree(args.root / COMPILE_DIR, ignore_errors=True)
  return sweep


def run(rest: list[str]) -> None:
  t0 = time.time()
  args = arguments(flags.FLAGS, rest)
  points = grid(args)
  print(f"sweep: {len(points)} runs in {args.root} ({' x '.join(f'{f} {len(v)}' for f, v in args.sweeps)}"
        f"{f' x {args.seeds} seeds' if args.seeds > 1 else ''}), {args.parallel} at a time")
  warm = compile_ahead(args, points)
  if warm is not None and (warm.signal or warm.failed):
    print(f"sweep: {'stopped' if warm.signal else 'a variant failed to compile'} before any "
          "timed run; run the same command again" + (" once it is fixed" if warm.failed else ""))
    sys.exit(130 if warm.signal == "SIGINT" else 143 if warm.signal else 1)
  sweep = Sweep(args, points)
  sweep.run()
  existing = [str(p.workdir) for p in points if paths.is_run(p.workdir)]
  if existing:
    print()
    compare.compare(existing, args.root, baseline=args.baseline or None)
  print(f"sweep: ran {sweep.ran}, skipped {len(points) - sweep.ran}, failed {len(sweep.failed)}"
        f" in {fmt.duration(time.time() - t0)}" + (f" (failed: {', '.join(sweep.failed)})"
                                                   if sweep.failed else ""))
  if sweep.signal:
    print(f"interrupted by {sweep.signal}: run the same command again to continue the sweep")
    sys.exit(130 if sweep.signal == "SIGINT" else 143)
  if sweep.failed or sweep.stopped:
    sys.exit(1)


def main() -> None:
  define_flags()
  cli.main(run, USAGE.split(" (see")[0] + "\nEvery combination of the swept values, a run each, "
           "then the comparison of them all.", __name__, args=True, known_only=True,
           uses_jax=False, values=VALUES, after=PASSED_ON)
