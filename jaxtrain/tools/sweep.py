"""`python -m jaxtrain.sweep --config=F --sweep=field=v1,v2 [--sweep=...] --root=DIR [--parallel=N]
[--config.x=y ...] [--jax_platforms=cpu]`: every combination of the swept values, a run each.

Each run is its own process (`python -m jaxtrain`) in DIR/<swept values>; running the same
command again continues the sweep (docs/watching.md, Sweeps). `--parallel=N` pins each run to its
own share of the CPU cores: XLA sizes its CPU devices and thread pools by the cores a process may
use.
"""

import dataclasses
import functools
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from absl import flags

from jaxtrain.config import defaults, loading, schema, validate
from jaxtrain.system import fmt, invocation, machine, paths
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.tools import cli, compare, runs

_COMMAND = invocation.command("jaxtrain.sweep")
USAGE = (f"usage: {_COMMAND} --config=F --sweep=field=v1,v2 [--sweep=...] --root=DIR "
         "[--parallel=N] [--config.x=y ...] (see --help)")
VALUES = {"config": "FILE", "sweep": "FIELD=V1,V2", "root": "DIR"}  # what --help shows
PASSED_ON = (("--config.FIELD=V", "A setting for every run of the sweep."),
             ("--jax_*=V", "Passed on to every run (e.g. --jax_platforms=cpu)."))
PROGRESS_EVERY_S = 30.0  # the default of --progress_every_s


@dataclasses.dataclass
class Args:
  config: str
  sweeps: list[tuple[str, list[str]]]  # (field, its values as typed)
  root: Path
  parallel: int = 1
  overrides: list[str] = dataclasses.field(default_factory=list)  # --config.x=y, passed on
  passthrough: list[str] = dataclasses.field(default_factory=list)  # --jax_*, passed on
  progress_every_s: float = PROGRESS_EVERY_S


@dataclasses.dataclass
class Point:
  """One run of the grid."""

  name: str
  values: list[tuple[str, str]]  # (field, value) as passed to the run
  workdir: Path
  log: Path
  max_steps: int


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


def parse(argv: list[str]) -> Args:
  """The sweep's arguments (without the command's name), checked."""
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  return arguments(flag_values, cli.parse_args(argv, flag_values, known_only=True))


def arguments(f: flags.FlagValues, rest: list[str]) -> Args:
  """The sweep's flags `f` and what it passes on to every run (`rest`), checked."""
  overrides, passthrough, sweeps = [], [], []
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
              f.progress_every_s)


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
  default = loading.flatten(defaults.default_config().to_dict())
  base = loading.load_config(args.config)
  for arg in args.overrides:
    field, text = arg[len("--config."):].split("=", 1)
    loading.override(base, **{field: typed(field, text, default[field])})
  points = []
  for combo in itertools.product(*[[(f, v) for v in vs] for f, vs in args.sweeps]):
    cfg = base.copy_and_resolve_references()
    values = []
    for field, text in combo:
      value = typed(field, text, default[field])
      loading.override(cfg, **{field: value})
      values.append((field, str(value) if isinstance(value, bool) else text))
    name = _name(values)
    cfg.workdir = str(args.root / name)
    validate.validate(cfg)
    points.append(Point(name, values, args.root / name, args.root / "logs" / f"{name}.log",
                        cfg.train.max_steps))
  if len({p.name for p in points}) < len(points):
    raise UserError("two runs of the sweep would share a directory name; make the values differ")
  return points


def done(point: Point) -> bool:
  """Finished: reached this sweep's max_steps, or ended early by a hook (early stopping)."""
  if not paths.is_run(point.workdir):
    return False
  info = runs.read(point.workdir)
  step = info.status.get("step", info.step)
  early = step < info.status.get("max_steps", step)
  return info.finished and (step >= point.max_steps or early)


def core_slots(parallel: int) -> list[list[int]]:
  """The cores each of `parallel` concurrent runs may use: equal, disjoint shares (runs share
  cores only when there are more runs at once than cores)."""
  cores = machine.core_ids()
  if not cores or parallel == 1:
    return [cores] * parallel
  k = max(1, len(cores) // parallel)
  return [[cores[(j * k + i) % len(cores)] for i in range(k)] for j in range(parallel)]


def command(args: Args, point: Point) -> list[str]:
  return [sys.executable, "-m", "jaxtrain", f"--config={args.config}", *args.overrides,
          *(f"--config.{f}={v}" for f, v in point.values), f"--config.workdir={point.workdir}",
          "--config.headless=True", *args.passthrough]


def _last_line(path: Path) -> str:
  try:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
  except OSError:
    return ""
  return lines[-1][:300] if lines else ""


def progress(point: Point, first: tuple[int, float] | None = None,
             now: float | None = None) -> tuple[int, str] | None:
  """(step, "step 120/400, loss 2.3456, 5.1k tok/s, ETA 1m20s") from the run's metrics.jsonl;
  None before its first train line. The ETA is by the wall-clock rate since `first` (a step and
  when it was seen), evaluations and saves included."""
  info = runs.read(point.workdir) if paths.is_run(point.workdir) else None
  if info is None or not info.train:
    return None
  step, loss, speed = info.train[-1]["step"], info.final("loss"), info.final("tokens_per_sec")
  line = f"step {step}/{point.max_steps}" + (f", loss {loss:.4f}" if loss is not None else "") + \
      (f", {fmt.count(speed)} tok/s" if speed else "")
  now = time.time() if now is None else now
  if first is not None and step > first[0] and now > first[1] and step < point.max_steps:
    rate = (step - first[0]) / (now - first[1])
    line += f", ETA {fmt.duration((point.max_steps - step) / rate)}"
  return step, line


class Sweep:
  """Launches the grid's runs, `parallel` at a time, and follows them to the end."""

  def __init__(self, args: Args, points: list[Point], print_fn=None):
    self.args, self.points = args, points
    self.print = print_fn or functools.partial(print, flush=True)
    self.slots = core_slots(args.parallel)
    self.running: dict[int, tuple[Point, subprocess.Popen, float]] = {}  # by slot
    self.failed: list[str] = []
    self.stopped: list[str] = []
    self.ran = 0
    self.first_seen: dict[str, tuple[int, float]] = {}  # a run's first step that moved, and when
    self.shown: dict[str, int] = {}  # the step of a run's last progress line
    self.signal: str | None = None

  def _tag(self, point: Point) -> str:
    return f"[{self.points.index(point) + 1}/{len(self.points)}] {point.name}"

  def _start(self, point: Point, slot: int) -> None:
    point.log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cores = self.slots[slot]
    if self.args.parallel > 1:
      # On a GPU each run would take 75% of its memory up front: share it instead.
      env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / self.args.parallel:.3f}")
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores and self.args.parallel > 1 else None
    with open(point.log, "a", encoding="utf-8") as log:
      log.write(f"$ {' '.join(command(self.args, point))}\n")
      log.flush()
      proc = subprocess.Popen(command(self.args, point), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, env=env, preexec_fn=pin)
    self.running[slot] = (point, proc, time.time())
    self.ran += 1
    where = (f" on core {cores[0]}" if len(cores) == 1 else f" on cores {cores[0]}-{cores[-1]}") \
        if pin else ""
    self.print(f"{self._tag(point)}: started{where}; log {point.log}")

  def _finish(self, slot: int, code: int) -> None:
    point, _, t0 = self.running.pop(slot)
    took = fmt.duration(time.time() - t0)
    info = runs.read(point.workdir) if paths.is_run(point.workdir) else None
    if code == 0 and info is not None and info.finished:
      val = info.final("val_loss")
      self.print(f"{self._tag(point)}: done in {took}" + (f", val loss {val:.4f}" if val else ""))
    elif (info is not None and info.state == "stopped") or self.signal:
      self.stopped.append(point.name)
      at = f"at step {info.step}" if info is not None else "before its first step"
      self.print(f"{self._tag(point)}: stopped {at} after {took}; it resumes when the sweep runs "
                 "again")
    else:
      self.failed.append(point.name)
      self.print(f"{self._tag(point)}: FAILED (exit status {code}) after {took}: "
                 f"{_last_line(point.log)} (whole log: {point.log})")

  def _progress(self) -> None:
    """A line a running run whose step moved since its last line (before its first step, its
    log says what it does: tokenizing, compiling)."""
    wrap = sys.stdout.isatty()
    for point, _, t0 in self.running.values():
      now = time.time()
      found = progress(point, self.first_seen.get(point.name), now)
      if found is None or self.shown.get(point.name) == found[0]:
        continue
      if point.name in self.shown:  # the step moved while watched: the rate starts here, after
        self.first_seen.setdefault(point.name, (found[0], now))  # start-up and compiling
      self.shown[point.name] = found[0]
      line = f"{self._tag(point)}: {found[1]} ({fmt.duration(now - t0)} so far)"
      width = shutil.get_terminal_size((100, 24)).columns
      for part in (textwrap.wrap(line, width, subsequent_indent="    ") if wrap else [line]):
        self.print(part)

  def _on_signal(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if self.signal is None:
      self.print(f"\n{name}: stopping the runs (each saves a checkpoint); no new ones start")
    self.signal = self.signal or name
    for _, proc, _ in self.running.values():
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)

  def run(self) -> None:
    todo = []
    for point in self.points:
      if done(point):
        self.print(f"{self._tag(point)}: finished already, skipped")
      else:
        todo.append(point)
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      last_progress = time.time()
      while (todo and self.signal is None) or self.running:
        for slot in range(self.args.parallel):
          if slot not in self.running and todo and self.signal is None:
            self._start(todo.pop(0), slot)
        time.sleep(0.2)
        for slot, (_, proc, _) in list(self.running.items()):
          if proc.poll() is not None:
            self._finish(slot, proc.returncode)
        if time.time() - last_progress >= self.args.progress_every_s and self.running:
          last_progress = time.time()
          self._progress()
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)


def run(rest: list[str]) -> None:
  t0 = time.time()
  args = arguments(flags.FLAGS, rest)
  points = grid(args)
  print(f"sweep: {len(points)} runs in {args.root} ({' x '.join(f'{f} {len(v)}' for f, v in args.sweeps)})"
        f", {args.parallel} at a time")
  sweep = Sweep(args, points)
  sweep.run()
  existing = [str(p.workdir) for p in points if paths.is_run(p.workdir)]
  if existing:
    print()
    compare.compare(existing, args.root)
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
