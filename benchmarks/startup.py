"""Seconds from `python -m jaxtrain` to its first finished step, against the import floor.

    python benchmarks/startup.py --runs=5
    python benchmarks/startup.py --runs=5 --git-ref=HEAD~1   # and that commit, in the same rounds

Three measurements, each the median of --runs, taken in alternating rounds so that load which
comes and goes hits them alike:
- import floor: a fresh `python -c "import jax, flax, optax, orbax.checkpoint, grain"`, wall
  time: what any run pays before jaxtrain itself does anything;
- cold: `python -m jaxtrain --config=... --jax_platforms=cpu --config.train.max_steps=1` with
  empty jaxtrain and XLA caches, seconds to its "compiled and ran the first step" line (the
  tokenized corpus is cached: tokenizing is a first-run cost of its own, reported apart);
- warm: the same again, on the caches the cold run left.
Each run re-executes itself once to set up its allocator, as a user's does; that is timed too.
Each run is also cut into phases, from the times its lines appear and from jax's own log of each
compile (`--jax_log_compiles`, in the run's logs/): to its first line (python, imports, config,
platform), data and build (the token cache read, the programs built), compiles (to "starting a new
run": the train step's compile with what runs beside it), the first step (the validation set
placed, the hooks started, the step run), the first evaluation (max_steps=1: the evaluation of
step 1, its eval step's compile where it was not compiled ahead) and the samples at the end (where
a --config.sample.* argument keeps them: each run has none otherwise); and the seconds jax's log
gives each program's compile (a cache hit: its read).
--warm-extra gives the warm runs arguments of their own (a warm cache met by another max_steps).
With --git-ref, that commit is checked out into a temporary `git worktree` and run from there
(PYTHONPATH on that tree) in the same rounds, so that before and after meet the same load.
Targets: warm <= 3x the import floor, cold <= 8 s. Writes startup.{json,md,png} to --out (default:
benchmarks/results/<date>-startup/). Extra `--config.*` arguments go to every run.
"""

import argparse
import dataclasses
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

from jaxtrain.system.allocator import describe  # noqa: E402

NAME = "startup"
FIRST_STEP = "compiled and ran the first step"
IMPORTS = "import jax, flax, optax, orbax.checkpoint, grain"
TARGET_WARM_OVER_FLOOR = 3.0
TARGET_COLD_S = 8.0


@dataclasses.dataclass
class Tree:
  """A source tree whose `python -m jaxtrain` is timed: this checkout, or a worktree at a ref."""
  label: str
  root: Path
  commit: str
  env: dict  # PYTHONPATH on `root`
  scratch: Path  # its caches and workdirs


def git(*args: str, cwd: Path = ROOT) -> str:
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                        check=True).stdout.strip()


def make_tree(label: str, root: Path, commit: str, env: dict, scratch: Path) -> Tree:
  path = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
  tree = Tree(label, root, commit, dict(env, PYTHONPATH=path), scratch)
  scratch.mkdir(parents=True, exist_ok=True)
  # The tree's own jaxtrain, not one installed in the environment, must be the one that runs.
  found = subprocess.run([sys.executable, "-c", "import jaxtrain; print(jaxtrain.__file__)"],
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


def add_worktree(ref: str, env: dict, scratch: Path) -> Tree:
  try:
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
  except subprocess.CalledProcessError:
    raise SystemExit(f"error: --git-ref={ref} names no commit in {ROOT}") from None
  root = scratch / "worktree"
  git("worktree", "add", "--detach", str(root), commit)
  return make_tree(ref, root, commit, env, scratch / "tree1")


def import_floor(env: dict) -> float:
  t0 = time.perf_counter()
  subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True)
  return time.perf_counter() - t0


def time_to_first_step(tree: Tree, config: str, caches: str, workdir: str,
                       extra: list[str]) -> dict:
  """Seconds from process start to the first-step line, and the run's phases (caches: a
  directory under the tree's scratch; its own empty one makes a cold run)."""
  cache = tree.scratch / caches
  env = dict(tree.env, JAXTRAIN_CACHE=str(cache), JAX_COMPILATION_CACHE_DIR=str(cache / "xla"))
  samples = [] if any(a.startswith("--config.sample.") for a in extra) else \
      ["--config.sample.num_samples=0"]
  args = [sys.executable, "-m", "jaxtrain", f"--config={config}", "--jax_platforms=cpu",
          f"--config.workdir={tree.scratch / workdir}", "--config.train.max_steps=1",
          "--config.headless=True", *samples, "--jax_log_compiles=true",
          f"--config.data.cache_dir={tree.scratch / 'tokens'}", *extra]
  t0, wall0 = time.perf_counter(), time.time()
  proc = subprocess.Popen(args, cwd=tree.root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  timed, cpu_to_first = [], None  # (seconds since spawn, line)
  for line in proc.stdout:
    timed.append((time.perf_counter() - t0, line.rstrip()))
    if cpu_to_first is None and FIRST_STEP in line:
      cpu_to_first = _cpu_s(proc.pid)
  _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  first_step = _at(timed, FIRST_STEP)
  if proc.returncode != 0 or first_step is None:
    raise SystemExit(f"error: {tree.label}: `python -m jaxtrain` failed (exit {proc.returncode})"
                     ":\n" + "\n".join(line for _, line in timed[-20:]))
  log = tree.scratch / workdir / "logs" / "process_0.log"
  return {"to_first_step_s": first_step, "total_s": time.perf_counter() - t0,
          "cpu_to_first_step_s": cpu_to_first, "cpu_total_s": usage.ru_utime + usage.ru_stime,
          "phases": phases(timed), "compiles": compiles(log, wall0)}


def _cpu_s(pid: int) -> float | None:
  """CPU seconds (user and system, every thread) a live process has used."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _at(timed: list, start: str) -> float | None:
  """When the first line that starts with (or, for the first step, holds) `start` appeared."""
  return next((t for t, line in timed if line.startswith(start) or start == FIRST_STEP
               and start in line), None)


def phases(timed: list) -> dict:
  """Seconds of each phase of a one-step run, from when its lines appeared."""
  marks = [("to first line", "jaxtrain "), ("data and build", "memory per device"),
           ("compiles", "starting a new run"), ("first step", FIRST_STEP),
           ("first evaluation", "eval step 1:"), ("samples", "samples at step"),
           ("to exit", None)]
  out, before = {}, 0.0
  for name, start in marks:
    at = timed[-1][0] if start is None else _at(timed, start)
    if at is not None:
      out[name] = round(at - before, 3)
      before = at
  return out


COMPILED = re.compile(r"^(\S+ \S+),(\d+) .*Finished XLA compilation of jit\((\S+)\) in (\S+) sec")


def compiles(log: Path, wall0: float) -> dict:
  """{program: seconds its compile took (or its read from the cache)} from jax's log in the run's
  logs/; programs of one name summed (the many one-op programs: "small programs")."""
  out: dict[str, float] = {}
  if not log.exists():
    return out
  for line in log.read_text(errors="replace").splitlines():
    m = COMPILED.match(line)
    if m:
      name = m.group(3) if m.group(3) in BIG_PROGRAMS else "small programs"
      out[name] = round(out.get(name, 0.0) + float(m.group(4)), 3)
  return out


BIG_PROGRAMS = ("train_step", "eval_step", "<lambda>", "_prefill", "_decode", "_all_finite")


def measure(trees: list[Tree], args, extra: list[str]) -> tuple[list[float], dict, dict]:
  """(import floors, {label: cold runs}, {label: warm runs}), in alternating rounds."""
  floors, cold, warm = [], {t.label: [] for t in trees}, {t.label: [] for t in trees}
  order = ["floor", *trees]
  for i in range(args.runs):
    for item in order if i % 2 == 0 else order[::-1]:  # none always goes first
      if item == "floor":
        floors.append(import_floor(trees[0].env))
        continue
      cold[item.label].append(time_to_first_step(item, args.config, f"cache{i}", f"c{i}", extra))
      warm[item.label].append(time_to_first_step(item, args.config, f"cache{i}", f"w{i}",
                                                 [*extra, *args.warm_extra.split()]))
    line = "; ".join(f"{t.label}: cold {cold[t.label][-1]['to_first_step_s']:.2f} s, warm "
                     f"{warm[t.label][-1]['to_first_step_s']:.2f} s" for t in trees)
    print(f"round {i + 1}/{args.runs}: import floor {floors[-1]:.2f} s; {line}", flush=True)
  return floors, cold, warm


def tree_row(tree: Tree, first: dict, cold: list[dict], warm: list[dict], floor: float) -> dict:
  med = lambda runs: statistics.median(r["to_first_step_s"] for r in runs)
  cold_s, warm_s = med(cold), med(warm)
  return {"label": tree.label, "commit": tree.commit, "first_run_ever_s": first["to_first_step_s"],
          "cold": {"median_to_first_step_s": cold_s, "runs": cold},
          "warm": {"median_to_first_step_s": warm_s, "runs": warm,
                   "median_total_s": statistics.median(r["total_s"] for r in warm)},
          "warm_over_import_floor": warm_s / floor,
          "meets": {"warm": warm_s <= TARGET_WARM_OVER_FLOOR * floor,
                    "cold": cold_s <= TARGET_COLD_S},
          "median_phases": {"cold": _medians(cold, "phases"), "warm": _medians(warm, "phases")},
          "median_compiles": {"cold": _medians(cold, "compiles"),
                              "warm": _medians(warm, "compiles")},
          "median_cpu_s": {c: {k: statistics.median(r[f"cpu_{k}_s"] or 0.0 for r in runs)
                               for k in ("to_first_step", "total")}
                           for c, runs in (("cold", cold), ("warm", warm))}}


def _medians(runs: list[dict], key: str) -> dict:
  names = list(dict.fromkeys(name for r in runs for name in r[key]))
  return {n: round(statistics.median(r[key].get(n, 0.0) for r in runs), 3) for n in names}


def phase_table(report: dict) -> str:
  """Median seconds of each phase and of each program's compile, per tree, cold and warm."""
  trees = report["trees"]
  phase_names = list(dict.fromkeys(n for t in trees for c in ("cold", "warm")
                                   for n in t["median_phases"][c]))
  programs = list(dict.fromkeys(n for t in trees for c in ("cold", "warm")
                                for n in t["median_compiles"][c]))
  rows = []
  for t in trees:
    for cache in ("cold", "warm"):
      ph, co = t["median_phases"][cache], t["median_compiles"][cache]
      cpu = t["median_cpu_s"][cache]
      rows.append([t["label"], cache, *(f"{ph[n]:.2f}" if n in ph else "-" for n in phase_names),
                   *(f"{co[n]:.2f}" if n in co else "-" for n in programs),
                   f"{cpu['to_first_step']:.2f}", f"{cpu['total']:.2f}"])
  return reports.markdown_table(["tree", "cache", *phase_names,
                                 *(f"compile {n}" for n in programs),
                                 "CPU s to first step", "CPU s whole run"], rows)


def chart(report: dict, path: Path) -> None:
  """One stacked bar a tree and cache: the phases of a one-step run, to its exit."""
  plt = reports.pyplot()
  bars = [(f"{t['label']}\n{cache}", t["median_phases"][cache]) for t in report["trees"]
          for cache in ("cold", "warm")]
  names = list(dict.fromkeys(n for _, ph in bars for n in ph))
  fig, ax = plt.subplots(figsize=(8, 1.0 + 0.7 * len(bars)))
  for j, (_, ph) in enumerate(bars):
    left = 0.0
    for i, n in enumerate(names):
      ax.barh(j, ph.get(n, 0.0), left=left, color=f"C{i}", label=n if j == 0 else None)
      left += ph.get(n, 0.0)
  ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel("seconds from spawn (median of the rounds)")
  ax.set_title(f"{report['config']}: one-step run, by phase; "
               f"{reports.machine_name(report['machine'])}", fontsize=9)
  ax.legend(fontsize=7, ncol=4, loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def markdown(report: dict) -> str:
  m, floor = report["machine"], report["import_floor"]
  runs = lambda rows: ", ".join(f"{r['to_first_step_s']:.2f}" for r in rows)
  met = lambda ok: "met" if ok else "MISSED"
  rows = [[t["label"], t["commit"][:12] + t["commit"][40:], f"{t['first_run_ever_s']:.2f}",
           f"{t['cold']['median_to_first_step_s']:.2f} ({runs(t['cold']['runs'])})",
           f"{t['warm']['median_to_first_step_s']:.2f} ({runs(t['warm']['runs'])})",
           f"{t['warm']['median_total_s']:.2f}",
           f"{t['warm_over_import_floor']:.2f}x",
           f"warm {met(t['meets']['warm'])}, cold {met(t['meets']['cold'])}"]
          for t in report["trees"]]
  return "\n".join([
      f"# Time to first step: {report['config']} ({report['timestamp']})", "",
      f"- {reports.cpu_line(m)}; python {m['python']}, jax {m['versions']['jax']}",
      f"- each run re-executes itself once to set up its allocator ({report['allocator']}); that "
      f"is timed too; extra arguments: {' '.join(report['extra']) or 'none'}"
      + (f"; the warm runs' own: {report['warm_extra']}" if report.get("warm_extra") else ""),
      f"- import floor (`python -c \"{IMPORTS}\"`): median {floor['median_s']:.2f} s "
      f"({', '.join(f'{s:.2f}' for s in floor['runs_s'])})",
      f"- {report['runs']} alternating round(s); load: {reports.load_line(report['load'])}", "",
      reports.markdown_table(
          ["tree", "commit", "first run ever s", "cold s: median (runs)", "warm s: median (runs)",
           "warm whole run s", "warm / import floor", "targets"], rows), "",
      f"cold: empty jaxtrain and XLA caches (the tokenized corpus cached); warm: the caches the "
      f"cold run left; times are to the first finished step, and the whole warm 1-step run "
      f"(process start to exit, checkpoint written) is given beside them. Targets: warm <= "
      f"{TARGET_WARM_OVER_FLOOR:g}x the import floor, cold <= {TARGET_COLD_S:g} s. first run "
      "ever: also tokenizes the corpus.", "",
      "## Where the time goes (medians, seconds)", "", phase_table(report), "",
      "Phases, each from the line that ends the one before: to first line (python, the allocator's "
      "re-exec, imports, config, platform); data and build (the token cache read, the programs "
      "built, the summary); compiles (to \"starting a new run\": the train step's compile and what "
      "runs beside it); first step (validation set placed, hooks started, the step run); first "
      "evaluation (step 1's, with its eval step's compile where it was not done ahead); samples "
      "(where kept); to exit (the save written, the loss plot, the exit). compile X: jax's own log "
      "of X's compile, or of its read from the compile cache (several compiles of one program add "
      "up; <lambda>: init and the checkpoint's checksums); small programs: every one-op program, "
      "summed. CPU s: user and system seconds of the run's process (every thread), to its first "
      "step and in all: the work done, which other processes' load does not stretch as it "
      "stretches wall time.", ""])


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/nano.py", help="relative to each tree's root")
  p.add_argument("--runs", type=int, default=5, help="rounds; each row is their median")
  p.add_argument("--warm-extra", default="",
                 help="--config.* arguments of the warm runs only, e.g. "
                 "'--config.train.max_steps=2': a warm cache met by a run that differs")
  p.add_argument("--git-ref", default=None,
                 help="also time this commit, from a temporary git worktree, in the same rounds")
  p.add_argument("--out", default=None,
                 help=f"output directory (default: benchmarks/results/<date>-{NAME}/)")
  args, extra = p.parse_known_args(argv)
  bad = [a for a in extra if not a.startswith("--config.")]
  if bad:
    p.error(f"unrecognized arguments {bad}; only --config.* overrides are passed on")
  if args.runs < 1:
    p.error("--runs must be >= 1")
  args.out = args.out or str(reports.results_dir(NAME))
  return args, extra


def main(argv: list[str] | None = None) -> int:
  args, extra = parse_args(argv)
  # Not applied here: each run sets up its allocator by re-executing itself, as a user's does.
  allocator = describe(common.environ_with(common.jaxtrain_environment()))
  loadavg_before = os.getloadavg()
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-startup-"))
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  trees = [this_checkout(env, scratch)]
  try:
    if args.git_ref:
      trees.append(add_worktree(args.git_ref, env, scratch))
    # A first run of each tree fills its token cache (and shows what a new machine pays for it).
    first = {t.label: time_to_first_step(t, args.config, "first", "first", extra) for t in trees}
    for t in trees:
      print(f"{t.label}: first run ever (tokenize + compile): "
            f"{first[t.label]['to_first_step_s']:.2f} s to the first step", flush=True)
    with common.LoadSampler(common.ours) as sampler:
      floors, cold, warm = measure(trees, args, extra)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
    if args.git_ref:
      git("worktree", "prune")  # forgets the worktree just deleted
  floor = statistics.median(floors)
  report = {
      "benchmark": NAME, "timestamp": reports.timestamp(), "config": args.config, "extra": extra,
      "warm_extra": args.warm_extra,
      "runs": args.runs, "git_ref": args.git_ref, "machine": reports.machine_info(),
      "allocator": allocator,
      "load": reports.load_record(loadavg_before, sampler, samples=True),
      "import_floor": {"command": f'python -c "{IMPORTS}"', "median_s": floor, "runs_s": floors},
      "targets": {"warm_over_import_floor": TARGET_WARM_OVER_FLOOR, "cold_s": TARGET_COLD_S},
      "trees": [tree_row(t, first[t.label], cold[t.label], warm[t.label], floor) for t in trees],
  }
  md = markdown(report)
  print("\n" + md)
  for t in report["trees"]:
    print(f"{t['label']}: warm {t['warm']['median_to_first_step_s']:.2f} s = "
          f"{t['warm_over_import_floor']:.2f}x the import floor (target <= "
          f"{TARGET_WARM_OVER_FLOOR:g}x: {'met' if t['meets']['warm'] else 'MISSED'}); cold "
          f"{t['cold']['median_to_first_step_s']:.2f} s (target <= {TARGET_COLD_S:g} s: "
          f"{'met' if t['meets']['cold'] else 'MISSED'})")
  reports.write(args.out, NAME, report, md, lambda path: chart(report, path))
  return 0


if __name__ == "__main__":
  sys.exit(main())
