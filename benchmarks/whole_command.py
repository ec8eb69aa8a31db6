"""jaxtrain and nanoGPT, whole commands from process start to exit, in one call on this CPU.

    python benchmarks/whole_command.py --data=tinyshakespeare.txt --nanogpt=/path/to/nanoGPT
    python benchmarks/whole_command.py --parts=one_step --runs=3 --git-ref=HEAD~1 --data=...

Three parts (`--parts`, default all), each side run as a user runs it, one command at a time:
- one_step: `python -m jaxtrain --config=C --config.train.max_steps=1` for nano and
  shakespeare_char (`--configs`) against nanoGPT's CPU recipe with --max_iters=1 (its README's
  CPU line, as benchmarks/quality.py runs it; its data/shakespeare_char prepared), each cold (a
  fresh HOME: no token, compile or font cache) and then warm (the same HOME again), and the bare
  imports each side needs (`import jax, flax, optax, orbax.checkpoint, grain`; `import torch,
  numpy`), in `--runs` alternating rounds (medians). Each run is cut into phases from when its
  lines appear, with each program's compile from jax's log (`--jax_log_compiles`).
- recipe: `configs/shakespeare_char.py` as shipped against nanoGPT's whole CPU recipe (2000
  iterations), each from a fresh HOME: val loss, wall time, each side's phases (jaxtrain's own
  `time:` line), peak RSS.
- steps: `--steps` steps at nanoGPT's CPU shape (4 x 128, T 64, B 12:
  configs/shakespeare_char_nanogpt.py) and of nano, each from a fresh HOME and again (its peak
  RSS without the compile's), against as many of nanoGPT's iterations: tokens/s (median of the
  logged steps; nanoGPT's from its own iteration times) and peak RSS.
Every run's peak RSS is its process's own (`wait4`). With --git-ref, that commit runs too (from a
temporary `git worktree`), and with --python, this checkout under another interpreter (another jax),
in the same rounds. Writes whole_command.{json,md,png} to --out
(default: benchmarks/results/<date>-whole_command-<CPU kind>/, e.g. ...-zen4).
"""

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import command_runs as cr  # noqa: E402  (after the path above)
import common  # noqa: E402
import reports  # noqa: E402
import whole_command_report as report_lib  # noqa: E402
from nanogpt_recipe import NANOGPT, NANOGPT_ARGS  # noqa: E402

from jaxtrain.system.allocator import describe  # noqa: E402

NAME = "whole_command"
PARTS = ("one_step", "recipe", "steps")
JAX_IMPORTS = "import jax, flax, optax, orbax.checkpoint, grain"
TORCH_IMPORTS = "import torch, numpy"
NANOGPT_TOKENS = NANOGPT["batch_size"] * NANOGPT["block_size"]
E_SHAPE = "configs/shakespeare_char_nanogpt.py"
CHILDREN: list[int] = []  # the command running, for the load sampler


def jaxtrain_argv(tree: cr.Tree, config: str, workdir: Path, data: str | None,
                  extra: list[str]) -> list[str]:
  needs_data = "shakespeare" in config
  return [tree.python, "-m", "jaxtrain", f"--config={config}", "--jax_platforms=cpu",
          f"--config.workdir={workdir}", "--config.headless=True", "--jax_log_compiles=true",
          *([f"--config.data.path={data}"] if needs_data and data else []), *extra]


def run_jaxtrain(tree: cr.Tree, config: str, home: Path, name: str, args,
                 extra: list[str]) -> dict:
  """One `python -m jaxtrain` of `tree` in HOME `home` (its workdir there, `name`): the timed
  run, its phases, compiles, val loss and tokens/s."""
  workdir = home / name
  result = cr.check(cr.run(jaxtrain_argv(tree, config, workdir, args.data, extra), tree.root,
                           cr.fresh_home(tree.env, home), CHILDREN),
                    f"{tree.label}: python -m jaxtrain --config={config}")
  result.update(phases=cr.jaxtrain_phases(result), summary=cr.summary_phases(result),
                compiles=cr.compiles(workdir / "logs" / "process_0.log"),
                to_first_step_s=cr.at(result["lines"], cr.FIRST_STEP),
                after_last_step_s=cr.after_last_step(result),
                val=cr.jaxtrain_val(result), tokens_per_s=cr.metrics_tokens_per_s(workdir))
  return result


def run_nanogpt(home: Path, name: str, args, extra: list[str]) -> dict:
  """nanoGPT's CPU recipe (train.py in --nanogpt) in HOME `home`, writing into `name` there."""
  argv = [sys.executable, *NANOGPT_ARGS, *extra, f"--out_dir={home / name}"]
  result = cr.check(cr.run(argv, Path(args.nanogpt), cr.fresh_home(os.environ, home), CHILDREN,
                           cpu_mark="iter 0:"), "nanoGPT's train.py")
  result.update(phases=cr.nanogpt_phases(result), val=cr.nanogpt_val(result),
                tokens_per_s=cr.nanogpt_tokens_per_s(result, NANOGPT_TOKENS),
                to_first_step_s=cr.at(result["lines"], "iter 0:"))
  return result


def import_floor(env: dict, imports: str, python: str = sys.executable) -> float:
  return cr.run([python, "-c", imports], ROOT, env, CHILDREN)["wall_s"]


def keep_lines(result: dict, n: int = 40) -> dict:
  """A run's record with only its last `n` lines (a recipe prints thousands)."""
  return dict(result, lines=result["lines"][-n:])


def one_step(trees: list[cr.Tree], args, sampler, scratch: Path) -> dict:
  """{"floors": {jax, torch}, "jaxtrain": {tree: {config: {cold, warm}}}, "nanogpt": {cold,
  warm}}: lists of runs, in alternating rounds."""
  out = {"floors": {"jax": [], "torch": [], **{t.label: [] for t in trees[1:]}},
         "nanogpt": {"cold": [], "warm": []},
         "jaxtrain": {t.label: {c: {"cold": [], "warm": []} for c in args.configs} for t in trees}}
  items = ["floors", *[(t, c) for t in trees for c in args.configs]]
  if args.nanogpt:
    items.append("nanogpt")
  for i in range(args.runs):
    for item in items if i % 2 == 0 else items[::-1]:
      if item == "floors":
        sampler.label = "import floors"
        out["floors"]["jax"].append(import_floor(trees[0].env, JAX_IMPORTS))
        for t in trees[1:]:  # each tree's own jax
          out["floors"][t.label].append(import_floor(t.env, JAX_IMPORTS, t.python))
        if args.nanogpt:
          out["floors"]["torch"].append(import_floor(os.environ, TORCH_IMPORTS))
        continue
      for cache in ("cold", "warm"):
        if item == "nanogpt":
          sampler.label = f"nanoGPT one step {cache}"
          home = scratch / f"nanogpt-home{i}"
          out["nanogpt"][cache].append(run_nanogpt(home, cache, args, ["--max_iters=1"]))
        else:
          tree, config = item
          sampler.label = f"{tree.label} {config} one step {cache}"
          home = tree.scratch / f"home-{Path(config).stem}-{i}"
          out["jaxtrain"][tree.label][config][cache].append(
              run_jaxtrain(tree, config, home, cache, args, ["--config.train.max_steps=1"]))
    reports.log(f"round {i + 1}/{args.runs}: " + "; ".join(
        [f"{t.label} {Path(c).stem} cold {r[c]['cold'][-1]['wall_s']:.1f} s warm "
         f"{r[c]['warm'][-1]['wall_s']:.1f} s" for t in trees
         for r in [out["jaxtrain"][t.label]] for c in args.configs] +
        ([f"nanoGPT cold {out['nanogpt']['cold'][-1]['wall_s']:.1f} s"] if args.nanogpt else [])))
  return out


def recipe(trees: list[cr.Tree], args, sampler, scratch: Path) -> dict:
  """The Shakespeare recipe as shipped against nanoGPT's CPU recipe, each from a fresh HOME."""
  out = {"jaxtrain": {t.label: [] for t in trees}, "nanogpt": []}
  for i in range(args.recipe_runs):
    if args.nanogpt:
      sampler.label = "nanoGPT recipe"
      out["nanogpt"].append(keep_lines(run_nanogpt(scratch / f"recipe-nanogpt-{i}", "out", args,
                                                   [])))
      reports.log(f"nanoGPT recipe: val {out['nanogpt'][-1]['val']} in "
                  f"{out['nanogpt'][-1]['wall_s']:.1f} s")
    for tree in trees:
      sampler.label = f"{tree.label} recipe"
      r = run_jaxtrain(tree, args.recipe, tree.scratch / f"recipe-{i}", "run", args, [])
      out["jaxtrain"][tree.label].append(keep_lines(r))
      reports.log(f"{tree.label} recipe: val {r['val']} in {r['wall_s']:.1f} s")
  return out


def steps(trees: list[cr.Tree], args, sampler, scratch: Path) -> dict:
  """--steps steps at nanoGPT's shape and of nano, from a fresh HOME (cold) and again (warm:
  no compile, whose memory the cold run's peak RSS holds), and as many nanoGPT iterations."""
  out = {"jaxtrain": {t.label: {} for t in trees}, "nanogpt": None}
  n = args.steps
  if args.nanogpt:
    sampler.label = "nanoGPT steps"
    out["nanogpt"] = keep_lines(run_nanogpt(scratch / "steps-nanogpt", "out", args,
                                            [f"--max_iters={n}"]))
  for tree in trees:
    for config in (E_SHAPE, "configs/nano.py"):
      extra = [f"--config.train.max_steps={n}", f"--config.train.eval_every={n}"]
      home = tree.scratch / f"steps-{Path(config).stem}"
      for cache in ("cold", "warm"):
        sampler.label = f"{tree.label} {config} steps {cache}"
        out["jaxtrain"][tree.label].setdefault(config, {})[cache] = keep_lines(
            run_jaxtrain(tree, config, home, cache, args, extra))
  return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--parts", default=",".join(PARTS), help=f"a comma list of {', '.join(PARTS)}")
  p.add_argument("--data", default=None,
                 help="the text the Shakespeare configs train on (Tiny Shakespeare's input.txt)")
  p.add_argument("--nanogpt", default=None, metavar="DIR",
                 help="a karpathy/nanoGPT checkout with data/shakespeare_char prepared; without "
                      "it, jaxtrain's side alone")
  p.add_argument("--configs", default="configs/nano.py,configs/shakespeare_char.py",
                 help="one_step: the configs, relative to each tree's root")
  p.add_argument("--runs", type=int, default=3, help="one_step: rounds; rows are their median")
  p.add_argument("--recipe", default="configs/shakespeare_char.py")
  p.add_argument("--recipe-runs", type=int, default=1)
  p.add_argument("--steps", type=int, default=200, help="steps: the runs' length")
  p.add_argument("--git-ref", default=None, help="also run this commit, in the same rounds")
  p.add_argument("--python", action="append", default=[], metavar="PATH",
                 help="also run this checkout with this interpreter (a venv with another jax), in "
                      "the same rounds; repeatable")
  p.add_argument("--out", default=None, help=f"default: benchmarks/results/<date>-{NAME}-<CPU>/")
  args = p.parse_args(argv)
  args.parts = [x for x in args.parts.split(",") if x]
  args.configs = [x for x in args.configs.split(",") if x]
  if bad := [x for x in args.parts if x not in PARTS]:
    p.error(f"--parts: unknown {bad}; choose from {', '.join(PARTS)}")
  if args.runs < 1:
    p.error("--runs must be >= 1")
  if args.data:
    args.data = str(Path(args.data).resolve())
  elif "recipe" in args.parts or "steps" in args.parts or \
      any("shakespeare" in c for c in args.configs):
    p.error("--data=input.txt is needed: the Shakespeare configs train on it")
  if args.nanogpt and not (Path(args.nanogpt) / "data/shakespeare_char/train.bin").is_file():
    p.error(f"{args.nanogpt}/data/shakespeare_char/train.bin is missing: run python "
            "data/shakespeare_char/prepare.py there first (with input.txt beside it)")
  if args.nanogpt:
    args.nanogpt = str(Path(args.nanogpt).resolve())
  return args


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  machine = reports.machine_info()
  out_dir = args.out or str(reports.results_dir(f"{NAME}-{reports.cpu_tag(machine)}"))
  loadavg_before = os.getloadavg()
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-whole-command-"))
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  # With --python, every tree is named by its versions, the first (this interpreter's) too.
  trees = [cr.with_python(sys.executable, env, scratch) if args.python else
           cr.this_checkout(env, scratch)]
  results = {}
  try:
    if args.git_ref:
      trees.append(cr.add_worktree(args.git_ref, env, scratch))
    trees += [cr.with_python(python, env, scratch) for python in args.python]
    with common.LoadSampler(lambda: [os.getpid(), *CHILDREN]) as sampler:
      for part in args.parts:
        results[part] = {"one_step": one_step, "recipe": recipe, "steps": steps}[part](
            trees, args, sampler, scratch)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
    if args.git_ref:
      cr.git("worktree", "prune")  # forgets the worktree just deleted
  report = {"benchmark": NAME, "timestamp": reports.timestamp(), "machine": machine,
            "allocator": describe(common.environ_with(common.jaxtrain_environment())),
            "args": {k: v for k, v in vars(args).items()},
            "nanogpt_command": ["python", *NANOGPT_ARGS],
            "trees": [{"label": t.label, "commit": t.commit} for t in trees],
            "load": reports.load_record(loadavg_before, sampler, samples=True), **results}
  md = report_lib.markdown(report)
  print("\n" + md)
  reports.write(out_dir, NAME, report, md, lambda path: report_lib.chart(report, path))
  return 0


if __name__ == "__main__":
  sys.exit(main())
