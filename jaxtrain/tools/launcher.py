"""The runs of a sweep as processes (`jaxtrain.sweep`): each point of the grid a `python -m
jaxtrain` of its own, `parallel` at a time, each pinned to its own share of the CPU cores (XLA
sizes its CPU devices and thread pools by the cores a process may use), followed to its end with a
progress line now and then; and which points are done already."""

import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from jaxtrain.system import fmt, machine, paths
from jaxtrain.tools import runs

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
  seeds: int = 1  # each point run with this many seeds (seed, seed + 1, ...)
  compile_ahead: bool = True  # a time budget's runs: every variant compiled before any is timed
  baseline: str = ""  # the run the comparison takes differences to


@dataclasses.dataclass
class Point:
  """One run of the grid."""

  name: str
  values: list[tuple[str, str]]  # (field, value) as passed to the run
  workdir: Path
  log: Path
  max_steps: int
  budget: bool = False  # train.time_budget: the run plans its own end
  shape_known: bool = True  # not model.size=auto, which chooses the shape in the run's budget
  extra: tuple[str, ...] = ()  # arguments after the point's own (a compile ahead's)


def done(point: Point) -> bool:
  """Finished: reached this sweep's max_steps (a time budget's run: its own end), or ended early
  by a hook (early stopping)."""
  if not paths.is_run(point.workdir):
    return False
  info = runs.read(point.workdir)
  if point.budget:
    return info.finished
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
          "--config.headless=True", *point.extra, *args.passthrough]


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
  end = info.status.get("max_steps") or point.max_steps  # a time budget's: the steps it planned
  line = f"step {step}/{end}" + (f", loss {loss:.4f}" if loss is not None else "") + \
      (f", {fmt.count(speed)} tok/s" if speed else "")
  now = time.time() if now is None else now
  if first is not None and step > first[0] and now > first[1] and step < end:
    rate = (step - first[0]) / (now - first[1])
    line += f", ETA {fmt.duration((end - step) / rate)}"
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


