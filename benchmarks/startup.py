"""Time from command to first step: `python -m jaxtrain` until its first optimizer step is done.

Cold: empty XLA and lowered-program caches (the token cache is warm: tokenizing is a first-run
cost of its own, reported separately). Warm: both caches from the previous run. Median of --runs each,
run alternately, with the machine's load recorded.

    python benchmarks/startup.py --config=configs/nano.py --runs=5
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
from jaxtrain.allocator import describe  # noqa: E402

FIRST_STEP = "compiled and ran the first step"


def time_to_first_step(config: str, workdir: Path, env: dict, extra: list[str]) -> dict:
  """Seconds from process start to the first-step line, and the phases the run printed."""
  args = [sys.executable, "-m", "jaxtrain", f"--config={config}", "--jax_platforms=cpu",
          f"--config.workdir={workdir}", "--config.train.max_steps=1", "--config.headless=True",
          "--config.sample.num_samples=0", *extra]
  t0 = time.perf_counter()
  proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  first_step, lines = None, []
  for line in proc.stdout:
    lines.append(line.rstrip())
    if first_step is None and line.startswith(FIRST_STEP):
      first_step = time.perf_counter() - t0
  proc.wait()
  if proc.returncode != 0 or first_step is None:
    raise RuntimeError("jaxtrain failed:\n" + "\n".join(lines[-20:]))
  step_s = float(re.search(r"first step in ([\d.]+)s", "\n".join(lines)).group(1))
  return {"to_first_step_s": first_step, "first_step_s": step_s, "total_s": time.perf_counter() - t0}


def _ours() -> list[int]:
  """This process and the jaxtrain run it started (their CPU time is not background load)."""
  pid = os.getpid()
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [pid, *map(int, f.read().split())]
  except OSError:
    return [pid]


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/nano.py")
  p.add_argument("--runs", type=int, default=5)
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  p.add_argument("extra", nargs="*", help="more --config.* overrides")
  a = p.parse_args()
  # Not applied here: each run sets up its allocator by re-executing itself, as a user's does.
  allocator = describe(common.environ_with(common.jaxtrain_environment()))
  loadavg_before = os.getloadavg()
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-startup-"))
  extra = [*a.extra, f"--config.data.cache_dir={scratch / 'tokens'}"]  # shared by every run
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)

  def caches(name: str) -> dict:  # fresh XLA and lowered-program (jaxtrain.aot) caches
    return dict(env, JAXTRAIN_CACHE=str(scratch / name), JAX_COMPILATION_CACHE_DIR=str(scratch / name / "xla"))


  # A first run fills the token cache (and reports what a brand-new machine pays for that).
  fresh = time_to_first_step(a.config, scratch / "w0", caches("first"), extra)
  print(f"first run ever (tokenize + compile): {fresh['to_first_step_s']:.2f} s to the first step")
  cold, warm = [], []
  with common.LoadSampler(_ours) as sampler:
    for i in range(a.runs):
      env_i = caches(f"cache{i}")
      cold.append(time_to_first_step(a.config, scratch / f"c{i}", env_i, extra))
      warm.append(time_to_first_step(a.config, scratch / f"h{i}", env_i, extra))
      print(f"run {i + 1}/{a.runs}: cold {cold[-1]['to_first_step_s']:.2f} s, warm "
            f"{warm[-1]['to_first_step_s']:.2f} s", flush=True)
  load = sampler.summary()
  shutil.rmtree(scratch, ignore_errors=True)

  med = lambda rows, k: float(np.median([r[k] for r in rows]))
  report = {
      "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
      "config": a.config, "extra": a.extra, "machine": common.machine_info(), "allocator": allocator,
      "load": {"loadavg_before": loadavg_before, "loadavg_after": os.getloadavg(), "sampler": load},
      "first_run_ever_s": fresh["to_first_step_s"],
      "cold": {"median_to_first_step_s": med(cold, "to_first_step_s"), "runs": cold},
      "warm": {"median_to_first_step_s": med(warm, "to_first_step_s"), "runs": warm},
  }
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "startup.json").write_text(json.dumps(report, indent=2))
  md = "\n".join([
      f"# Time to first step: {a.config}", "",
      f"- {report['timestamp']}; {report['machine']['cpu_model']}, "
      f"{report['machine']['cores_available']} cores; each run re-executes itself once to set "
      f"up its allocator ({allocator}), and that is timed too",
      f"- load: {common.load_line(report['load'])}", "",
      "| compile caches (XLA + lowered programs) | median s to first step | runs (s) |",
      "|---|---|---|",
      f"| empty (cold) | {report['cold']['median_to_first_step_s']:.2f} | "
      + ", ".join(f"{r['to_first_step_s']:.2f}" for r in cold) + " |",
      f"| warm | {report['warm']['median_to_first_step_s']:.2f} | "
      + ", ".join(f"{r['to_first_step_s']:.2f}" for r in warm) + " |", "",
      f"A brand-new machine also tokenizes the corpus once: {fresh['to_first_step_s']:.2f} s to "
      "the first step on the first run ever.", ""])
  (out / "startup.md").write_text(md)
  print("\n" + md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
