"""Whole commands timed from spawn to exit, for the benchmarks that compare them: the source trees
they run from (this checkout, or a commit in a temporary `git worktree`), one command's timed
lines, wall and CPU seconds and peak RSS, and each side's phases read from its lines: jaxtrain's
(`python -m jaxtrain`, with jax's log of each compile) and nanoGPT's (its train.py).

Imports neither jax nor torch: the commands do.
"""

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from jaxtrain.system import fmt

ROOT = Path(__file__).resolve().parents[1]
FIRST_STEP = "compiled and ran the first step"


@dataclasses.dataclass
class Tree:
  """A source tree whose `python -m jaxtrain` is timed: this checkout, or a worktree at a ref."""
  label: str
  root: Path
  commit: str
  env: dict  # PYTHONPATH on `root`
  scratch: Path  # its caches and workdirs
  python: str = sys.executable  # the interpreter (and so the jax) its commands run with


def git(*args: str, cwd: Path = ROOT) -> str:
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                        check=True).stdout.strip()


def make_tree(label: str, root: Path, commit: str, env: dict, scratch: Path,
              python: str = sys.executable) -> Tree:
  path = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
  tree = Tree(label, root, commit, dict(env, PYTHONPATH=path), scratch, python)
  scratch.mkdir(parents=True, exist_ok=True)
  # The tree's own jaxtrain, not one installed in the environment, must be the one that runs.
  found = subprocess.run([python, "-c", "import jaxtrain; print(jaxtrain.__file__)"],
                         cwd=root, env=tree.env, capture_output=True, text=True)
  if found.returncode or not Path(found.stdout.strip()).resolve().is_relative_to(root.resolve()):
    raise SystemExit(f"error: {label}: python imports jaxtrain from {found.stdout.strip() or '?'}"
                     f", not from {root}:\n{found.stderr[-1000:]}")
  return tree


def this_checkout(env: dict, scratch: Path) -> Tree:
  commit = git("rev-parse", "HEAD")
  dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
  return make_tree("working tree", ROOT, commit + (" + uncommitted changes" if dirty else ""),
                   env, scratch / "tree0")


def with_python(python: str, env: dict, scratch: Path) -> Tree:
  """This checkout run by another interpreter (a venv with another jax), labelled by its
  versions: 'jax 0.12.0.1, flax 0.12.12 (Python 3.12.1)'."""
  said = subprocess.run([python, "-c", "import sys; from jaxtrain.system import stack; "
                         "print(stack.line(), f'(Python {sys.version.split()[0]})')"],
                        cwd=ROOT, env=env, capture_output=True, text=True)
  if said.returncode:
    raise SystemExit(f"error: --python={python}: it cannot import jaxtrain:\n{said.stderr[-600:]}")
  label = said.stdout.strip()
  commit = this_checkout(env, scratch / "probe").commit
  return make_tree(label, ROOT, commit, env, scratch / re.sub(r"\W+", "-", label), python)


def add_worktree(ref: str, env: dict, scratch: Path) -> Tree:
  try:
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
  except subprocess.CalledProcessError:
    raise SystemExit(f"error: --git-ref={ref} names no commit in {ROOT}") from None
  root = scratch / "worktree"
  git("worktree", "add", "--detach", str(root), commit)
  return make_tree(ref, root, commit, env, scratch / "tree1")


def fresh_home(env: dict, home: Path) -> dict:
  """`env` as a new user's first shell has it: HOME `home` (made empty if new), and nothing that
  points the caches elsewhere (jaxtrain's, XLA's, matplotlib's, the XDG ones)."""
  home.mkdir(parents=True, exist_ok=True)
  drop = ("JAXTRAIN_CACHE", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR")
  return {**{k: v for k, v in env.items() if k not in drop}, "HOME": str(home),
          "PYTHONUNBUFFERED": "1"}


def cpu_s(pid: int) -> float | None:
  """CPU seconds (user and system, every thread) a live process has used."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(argv: list[str], cwd: Path, env: dict, children: list[int] | None = None,
        cpu_mark: str = FIRST_STEP) -> dict:
  """One command, spawn to exit: its lines (seconds since spawn, text), wall and CPU seconds, the
  CPU seconds when a line holding `cpu_mark` appeared, peak RSS (MiB; the process's own, across
  jaxtrain's re-exec of itself) and its exit status. `children` holds its pid while it runs (for
  a load sampler)."""
  t0 = time.perf_counter()
  proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace")
  if children is not None:
    children[:] = [proc.pid]
  lines, cpu_at_mark = [], None
  for line in proc.stdout:
    lines.append((round(time.perf_counter() - t0, 3), line.rstrip()))
    if cpu_at_mark is None and cpu_mark in line:
      cpu_at_mark = cpu_s(proc.pid)
  _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - t0
  proc.returncode = os.waitstatus_to_exitcode(status)
  if children is not None:
    children.clear()
  return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
          "cpu_at_mark_s": cpu_at_mark, "max_rss_mib": round(usage.ru_maxrss / 1024, 1),
          "returncode": proc.returncode, "lines": lines}


def check(result: dict, what: str) -> dict:
  if result["returncode"] != 0:
    raise SystemExit(f"error: {what} exited {result['returncode']}:\n" +
                     "\n".join(text for _, text in result["lines"][-25:]))
  return result


def at(lines: list, text: str, last: bool = False) -> float | None:
  """When the first (or last) line holding `text` appeared."""
  hits = [t for t, line in lines if text in line]
  return (hits[-1] if last else hits[0]) if hits else None


# ---- jaxtrain ------------------------------------------------------------------------------


def after_last_step(result: dict) -> float | None:
  """Seconds from the last step's line to the exit: the end of a run (its last evaluation,
  checkpoint, samples, plot and summary)."""
  steps = [t for t, line in result["lines"] if re.match(r"step +\d+/\d+ \|", line)]
  return round(result["wall_s"] - steps[-1], 3) if steps else None

# The lines that end each phase of a short run, in order; the last phase runs to the exit.
JAXTRAIN_MARKS = [("to first line", "jaxtrain "), ("data and build", "memory per device"),
                  ("compiles", "starting a new run"), ("first step", FIRST_STEP),
                  ("evaluation", "eval step "), ("samples", "samples at step"),
                  ("plot and summary", "time: ")]


def jaxtrain_phases(result: dict) -> dict:
  """Seconds of each phase of a jaxtrain run, from when its lines appeared, and to its exit."""
  lines, out, before = result["lines"], {}, 0.0
  for name, text in JAXTRAIN_MARKS:
    t = at(lines, text, last=name == "evaluation")
    if t is not None and t >= before:
      out[name] = round(t - before, 3)
      before = t
  out["to exit"] = round(result["wall_s"] - before, 3)
  return out


TIME_LINE = re.compile(r"^time(?: of this start)?: (\S+) = (.*)$")


def summary_phases(result: dict) -> dict:
  """The run's own `time: ... = start-up 1.8s + compile 5.7s + ...` line as {phase: seconds},
  with what came after it (the exit) and before its clock started (python and the imports)."""
  for _, line in result["lines"]:
    m = TIME_LINE.match(line)
    if m:
      parts = dict(p.rsplit(" ", 1) for p in m.group(2).split(" + "))
      out = {name: fmt.parse_duration(value) or 0.0 for name, value in parts.items()}
      out["exit"] = round(result["wall_s"] - at(result["lines"], "time: "), 3)
      return out
  return {}


COMPILED = re.compile(r"^(\S+ \S+),(\d+) .*Finished XLA compilation of jit\((\S+)\) in (\S+) sec")
BIG_PROGRAMS = ("train_step", "eval_step", "<lambda>", "_prefill", "_decode", "_all_finite", "_survey")


def compiles(log: Path) -> dict:
  """{program: seconds its compile took (or its read from the cache)} from jax's log in a run's
  logs/ (`--jax_log_compiles=true`); programs of one name summed, the one-op programs as "small
  programs"."""
  out: dict[str, float] = {}
  if not log.exists():
    return out
  for line in log.read_text(errors="replace").splitlines():
    m = COMPILED.match(line)
    if m:
      name = m.group(3) if m.group(3) in BIG_PROGRAMS else "small programs"
      out[name] = round(out.get(name, 0.0) + float(m.group(4)), 3)
  return out


def jaxtrain_val(result: dict) -> float | None:
  """The val loss of the run's closing `done:` line."""
  for _, line in result["lines"]:
    m = re.search(r"^done: .*\| val loss ([\d.]+)", line)
    if m:
      return float(m.group(1))
  return None


def metrics_tokens_per_s(workdir: Path) -> float | None:
  """The median tokens/s of a run's logged steps (metrics.jsonl)."""
  import json

  path = workdir / "metrics.jsonl"
  if not path.exists():
    return None
  rates = [r["tokens_per_sec"] for r in map(json.loads, path.read_text().splitlines())
           if r.get("tokens_per_sec")]
  return statistics.median(rates) if rates else None


# ---- nanoGPT -------------------------------------------------------------------------------

NANOGPT_EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")
NANOGPT_ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")


def nanogpt_phases(result: dict) -> dict:
  """Seconds of nanoGPT's phases from its lines: start-up (python, torch, the data and model,
  to the line before its first evaluation), evaluations (each from the line before it), the
  checkpoint saves, training (the rest up to its last iteration's line) and to exit."""
  lines = result["lines"]
  first_eval = next((i for i, (_, s) in enumerate(lines) if NANOGPT_EVAL.match(s)), None)
  if first_eval is None:
    return {"to exit": result["wall_s"]}
  startup = lines[first_eval - 1][0] if first_eval else 0.0
  evals = sum(t - lines[i - 1][0] for i, (t, s) in enumerate(lines) if NANOGPT_EVAL.match(s))
  saves = sum(lines[i + 1][0] - t for i, (t, s) in enumerate(lines[:-1])
              if s.startswith("saving checkpoint"))
  last_iter = max((t for t, s in lines if NANOGPT_ITER.match(s)), default=startup)
  return {"start-up": round(startup, 3), "eval": round(evals, 3), "checkpoints": round(saves, 3),
          "train": round(last_iter - startup - evals - saves, 3),
          "to exit": round(result["wall_s"] - last_iter, 3)}


def nanogpt_val(result: dict) -> float | None:
  """The val loss of nanoGPT's last evaluation."""
  vals = [float(m.group(2)) for _, s in result["lines"] if (m := NANOGPT_EVAL.match(s))]
  return vals[-1] if vals else None


def nanogpt_tokens_per_s(result: dict, tokens_per_iter: int) -> float | None:
  """Tokens/s from the median of nanoGPT's own iteration times, past iteration 0 and without the
  iterations whose time holds an evaluation."""
  ms, after_eval = [], False
  for _, s in result["lines"]:
    if NANOGPT_EVAL.match(s):
      after_eval = True
    elif m := NANOGPT_ITER.match(s):
      if int(m.group(1)) > 0 and not after_eval:
        ms.append(float(m.group(2)))
      after_eval = False
  return tokens_per_iter / (statistics.median(ms) / 1000) if ms else None
