"""SIGKILL a real `python -m jaxtrain` at seeded random moments, resume it, compare bit for bit.

Moments are either a random time after the first step (with grad_accum=3, usually in the middle
of an accumulation cycle) or the instant orbax's temporary directory for a checkpoint appears
(in the middle of writing it). Each trial: kill once, run again to the end, and compare params,
optimizer state, step, RNG, data position and every logged loss with an uninterrupted run.

    python tests/killharness.py --trials 20 --seed 0     # prints a markdown table
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TMP_MARK = ".orbax-checkpoint-tmp"


def cli_args(workdir: Path, data_path: Path, max_steps: int) -> list[str]:
  return ["--config=configs/nano.py", "--jax_platforms=cpu", f"--config.workdir={workdir}",
          f"--config.data.path={data_path}", f"--config.train.max_steps={max_steps}",
          "--config.model.n_layers=2", "--config.model.d_model=32", "--config.model.n_heads=4",
          "--config.model.seq_len=32", "--config.model.dropout=0.1", "--config.train.batch_size=8",
          "--config.train.grad_accum=3", "--config.train.checkpoint_every=3",
          "--config.train.eval_every=6", "--config.train.eval_steps=2", "--config.train.log_every=1",
          "--config.train.keep_checkpoints=2", "--config.sample.num_samples=0",
          "--config.headless=True"]


class Run:
  """`python -m jaxtrain ARGS` with its stdout collected line by line."""

  def __init__(self, args: list[str]):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    self.proc = subprocess.Popen([sys.executable, "-m", "jaxtrain", *args], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    self.lines: list[str] = []
    self.started = threading.Event()  # the first step has run
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      self.lines.append(line.rstrip("\n"))
      if line.startswith("compiled and ran the first step"):
        self.started.set()
    self.started.set()

  def wait(self, timeout: float = 300) -> int:
    try:
      return self.proc.wait(timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
        self.proc.wait()

  def text(self) -> str:
    return "\n".join(self.lines)


class Proc:
  """`python -m jaxtrain ARGS` with stdout and stderr collected line by line."""

  def __init__(self, args: list[str], module: str = "jaxtrain", env: dict | None = None):
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    self.proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.out: list[str] = []
    self.err: list[str] = []
    self._readers = [threading.Thread(target=self._read, args=(s, lines), daemon=True)
                     for s, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
    for t in self._readers:
      t.start()

  @staticmethod
  def _read(stream, lines: list[str]) -> None:
    for line in stream:
      lines.append(line.rstrip("\n"))

  def wait_for(self, predicate, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not predicate():
      assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.out[-5:]} {self.err}"
      assert time.time() < deadline, f"timed out: {self.out[-5:]} {self.err}"
      time.sleep(0.002)

  def finish(self, timeout: float = 600) -> int:
    try:
      code = self.proc.wait(timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
        self.proc.wait()
    for t in self._readers:
      t.join(5)
    return code

  def first_step(self) -> bool:
    return any(x.startswith("compiled and ran the first step") for x in self.out)


def complete(args: list[str], timeout: float = 300) -> Run:
  run = Run(args)
  code = run.wait(timeout)
  if code != 0:
    raise RuntimeError(f"jaxtrain exited {code}:\n{run.text()[-3000:]}")
  return run


def kill_once(args: list[str], ckpt_dir: Path, moment: tuple[str, float]) -> dict:
  """Starts a run and SIGKILLs it at `moment`: ("time", seconds) or ("write", delay)."""
  run = Run(args)
  try:
    if not run.started.wait(120) or run.proc.poll() is not None:
      return {"killed": False, "note": "ended before the first step"}
    kind, value = moment
    if kind == "time":
      time.sleep(value)
    else:  # the instant a checkpoint write is under way
      deadline = time.time() + 60
      while time.time() < deadline and run.proc.poll() is None:
        if ckpt_dir.is_dir() and any(TMP_MARK in p.name for p in ckpt_dir.iterdir()):
          break
        time.sleep(0.0005)
      time.sleep(value)
    if run.proc.poll() is not None:
      return {"killed": False, "note": "finished before the kill"}
    run.proc.send_signal(signal.SIGKILL)
    run.wait(30)
  finally:
    if run.proc.poll() is None:
      run.proc.kill()
  steps = [int(line.split()[1].split("/")[0]) for line in run.lines if line.startswith("step ")]
  partial = ckpt_dir.is_dir() and any(TMP_MARK in p.name for p in ckpt_dir.iterdir())
  return {"killed": True, "last_logged_step": steps[-1] if steps else 0, "mid_write": partial}


def losses(workdir: Path) -> dict:
  out = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    r = json.loads(line)
    out[(r["step"], "val" if "val_loss" in r else "train")] = r.get("loss", r.get("val_loss"))
  return out


def final_state(workdir: Path) -> tuple[dict, dict]:
  """Arrays and data position of the last checkpoint, read in a fresh process."""
  code = ("import sys, pickle, jax; from jaxtrain.checkpoints.load import load_state; "
          "s = load_state(sys.argv[1]); "
          "sys.stdout.buffer.write(pickle.dumps(jax.device_get(s.arrays())))")
  blob = subprocess.run([sys.executable, "-c", code, str(workdir)], cwd=ROOT, capture_output=True,
                        check=True, timeout=600).stdout
  import pickle

  arrays = pickle.loads(blob)
  last = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  position = json.loads(next((workdir / "checkpoints" / str(last) / "data").glob("*.json"))
                        .read_text())
  return arrays, position


def trees_equal(a, b) -> bool:
  import jax

  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return (jax.tree.structure(a) == jax.tree.structure(b)
          and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)))


def draw_moments(n: int, seed: int, max_time: float) -> list[tuple[str, float]]:
  rng = random.Random(seed)
  return [("write", rng.uniform(0, 0.02)) if i % 2 else ("time", rng.uniform(0, max_time))
          for i in range(n)]


def trial(base: Path, name: str, data_path: Path, max_steps: int, moment, reference) -> dict:
  workdir = base / name
  args = cli_args(workdir, data_path, max_steps)
  row = {"trial": name, "moment": f"{moment[0]} +{moment[1]:.3f}s"}
  row.update(kill_once(args, workdir / "checkpoints", moment))
  resumed = complete(args)
  line = next((x for x in resumed.lines if x.startswith("resumed from")), "")
  found = re.search(r" at step (\d+)", line)
  row["resumed_from"] = int(found.group(1)) if found else 0
  arrays, position = final_state(workdir)
  ref_arrays, ref_position, ref_losses = reference
  row["equal"] = (trees_equal(arrays, ref_arrays) and position == ref_position
                  and losses(workdir) == ref_losses)
  shutil.rmtree(workdir, ignore_errors=True)
  return row


def reference_run(base: Path, data_path: Path, max_steps: int):
  workdir = base / "reference"
  complete(cli_args(workdir, data_path, max_steps))
  arrays, position = final_state(workdir)
  return arrays, position, losses(workdir)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--max-steps", type=int, default=30)
  parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/tinyshakespeare.txt")
  parser.add_argument("--dir", type=Path, default=Path("/tmp/jaxtrain-killharness"))
  a = parser.parse_args()
  shutil.rmtree(a.dir, ignore_errors=True)
  reference = reference_run(a.dir, a.data, a.max_steps)
  print("| trial | kill moment | last logged step | mid checkpoint write | resumed from "
        "| bit-for-bit equal |")
  print("|---|---|---|---|---|---|")
  rows = []
  for i, moment in enumerate(draw_moments(a.trials, a.seed, max_time=1.5)):
    row = trial(a.dir, f"t{i}", a.data, a.max_steps, moment, reference)
    rows.append(row)
    print(f"| {i} | {row['moment']} | {row.get('last_logged_step', '-')} | "
          f"{'yes' if row.get('mid_write') else 'no'} | {row['resumed_from']} | "
          f"{'yes' if row['equal'] else 'NO'} |", flush=True)
  killed = [r for r in rows if r.get("killed")]
  print(f"\n{sum(r['equal'] for r in killed)}/{len(killed)} killed runs resumed bit-for-bit equal "
        f"({sum(bool(r.get('mid_write')) for r in killed)} killed mid checkpoint write)")


if __name__ == "__main__":
  main()
