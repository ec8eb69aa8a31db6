"""Wall and CPU seconds of `python -m jaxtrain.sample` and `python -m jaxtrain.eval` on a saved
run, from an empty compile cache (cold) and from the cache that left (warm), for this checkout
and another commit in alternating rounds.

    python benchmarks/command_startup.py --runs=3 --git-ref=HEAD~3

The run: nano's shape trained for --steps on prompt/completion records (three letters and a key,
then a pattern the key decides; tests/test_finetune.py's task), made once by this checkout. The
commands: `jaxtrain.sample --prompt=... ` (the default 256 new tokens, one sample) and
`jaxtrain.eval --data=` 48 held-out records of the same task (loss, bpb, greedy exact match).
Each tree runs in its own `git worktree` (command_runs.py); the machine's load is sampled throughout.
Writes command_startup.{json,md} to --out (default: benchmarks/results/<date>-command-startup/).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import command_runs as cr  # noqa: E402  (after the path above)
import common  # noqa: E402
import numpy as np  # noqa: E402
import reports  # noqa: E402

NAME = "command-startup"
KEYS, NOISE = "abcdefgh", "stuvwxyz"


def keyed(n: int, seed: int) -> list[dict]:
  """tests/test_finetune.py's records: noise and a key, then a pattern the key alone decides."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    noise, k = "".join(NOISE[i] for i in rng.integers(0, len(NOISE), 3)), int(rng.integers(0, 8))
    rows.append({"prompt": noise + KEYS[k] + ":", "completion": KEYS[k].upper() + str(k + 1) * 2})
  return rows


def make_run(scratch: Path, steps: int) -> tuple[Path, Path]:
  """(the trained run's workdir, the held-out records)."""
  for name, n, seed in (("train", 2000, 0), ("held", 48, 1)):
    (scratch / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keyed(n, seed)))
  workdir = scratch / "run"
  res = subprocess.run([sys.executable, "-m", "jaxtrain", "--config=configs/nano.py",
                        "--jax_platforms=cpu", f"--config.workdir={workdir}",
                        f"--config.data.path={scratch / 'train.jsonl'}",
                        "--config.data.prompt_field=prompt", "--config.data.completion_field=completion",
                        f"--config.train.max_steps={steps}", "--config.sample.num_samples=0",
                        "--config.headless=True"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, JAXTRAIN_CACHE=str(scratch / "train-cache")))
  if res.returncode:
    raise SystemExit(f"error: training the run failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
  return workdir, scratch / "held.jsonl"


def timed(tree: cr.Tree, argv: list[str], cache: Path) -> dict:
  """One command of `tree`, spawn to exit: wall and CPU seconds."""
  env = dict(tree.env, JAXTRAIN_CACHE=str(cache), JAX_COMPILATION_CACHE_DIR=str(cache / "xla"))
  t0 = time.perf_counter()
  proc = subprocess.Popen([sys.executable, "-m", *argv, "--jax_platforms=cpu"], cwd=tree.root,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - t0
  err = proc.stderr.read().decode(errors="replace")
  proc.stdout.read()
  if os.waitstatus_to_exitcode(status):
    raise SystemExit(f"error: {tree.label}: {' '.join(argv)} failed:\n{err[-2000:]}")
  return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


def measure(trees: list, commands: dict, args, sampler) -> dict:
  """{tree: {command: {cold: [runs], warm: [runs]}}}, in alternating rounds."""
  out = {t.label: {c: {"cold": [], "warm": []} for c in commands} for t in trees}
  for i in range(args.runs):
    for tree in trees if i % 2 == 0 else trees[::-1]:
      for name, argv in commands.items():
        cache = tree.scratch / f"{name}-{i}"
        for state in ("cold", "warm"):
          sampler.label = f"{tree.label} {name} {state}"
          out[tree.label][name][state].append(timed(tree, argv, cache))
        shutil.rmtree(cache, ignore_errors=True)
    reports.log(f"round {i + 1}/{args.runs}: " + "; ".join(
        f"{t.label} {c} {s} {out[t.label][c][s][-1]['wall_s']:.2f} s" for t in trees
        for c in commands for s in ("cold", "warm")))
  return out


def markdown(report: dict) -> str:
  m = report["machine"]
  rows = []
  for label, by_command in report["results"].items():
    for command, by_state in by_command.items():
      for state, runs in by_state.items():
        wall, cpu = (statistics.median(r[key] for r in runs) for key in ("wall_s", "cpu_s"))
        rows.append([label, command, state, f"{wall:.2f}",
                     ", ".join(f"{r['wall_s']:.2f}" for r in runs), f"{cpu:.2f}"])
  return "\n".join([
      f"# `python -m jaxtrain.sample` and `jaxtrain.eval`, spawn to exit ({report['timestamp']})",
      "", f"- {reports.cpu_line(m)}; python {m['python']}, jax {m['versions']['jax']}",
      "- trees: " + "; ".join(f"{t['label']} = {t['commit']}" for t in report["trees"]),
      f"- {report['runs']} alternating round(s); load: {reports.load_line(report['load'])}", "",
      reports.markdown_table(["tree", "command", "compile cache", "wall s (median)", "runs",
                              "CPU s (median)"], rows), "",
      "sample: `--prompt=\"abc\"`, 256 new tokens; eval: 48 held-out prompt/completion records. "
      "cold: an empty XLA compile cache; warm: the cache the cold command left. CPU s: user and "
      "system seconds of the command's process, every thread.", ""])


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--steps", type=int, default=60, help="training steps of the run")
  p.add_argument("--git-ref", default=None, help="also time this commit, in the same rounds")
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  out_dir = args.out or str(reports.results_dir(NAME))
  loadavg_before = os.getloadavg()
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-command-startup-"))
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  trees = [cr.this_checkout(env, scratch)]
  try:
    if args.git_ref:
      trees.append(cr.add_worktree(args.git_ref, env, scratch))
    workdir, held = make_run(scratch, args.steps)
    commands = {"sample": ["jaxtrain.sample", f"--workdir={workdir}", "--prompt=abc"],
                "eval": ["jaxtrain.eval", f"--workdir={workdir}", f"--data={held}"]}
    with common.LoadSampler(common.ours) as sampler:
      results = measure(trees, commands, args, sampler)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
    if args.git_ref:
      cr.git("worktree", "prune")
  report = {"benchmark": NAME, "timestamp": reports.timestamp(), "runs": args.runs,
            "machine": reports.machine_info(),
            "trees": [{"label": t.label, "commit": t.commit} for t in trees],
            "load": reports.load_record(loadavg_before, sampler, samples=True),
            "results": results}
  md = markdown(report)
  print("\n" + md)
  reports.write(out_dir, "command_startup", report, md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
