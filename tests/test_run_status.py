"""status.json tells how far a run got and whether it still runs: the last step it logged or
evaluated (also after a failure), and a run killed without a word (SIGKILL, out of memory) told
apart from one still running, at its next start and in compare."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import killharness as kh
import pytest

import jaxtrain as jt
from jaxtrain.system import lock
from jaxtrain.tools import runs


class _FailAt(jt.Hook):
  def __init__(self, step: int):
    self.step = step

  def on_log(self, step: int, record: dict) -> None:
    if step == self.step:
      raise RuntimeError("the tracker's server went away")


@pytest.mark.slow
def test_a_failed_run_records_the_last_step_it_reached(tiny):
  tiny.sample.num_samples = 0
  with pytest.raises(RuntimeError, match="server went away"):
    jt.run(tiny, show_progress=False, hooks=[_FailAt(15)])
  status = json.loads((Path(tiny.workdir) / "status.json").read_text())
  assert status["state"] == "failed" and status["step"] == 15, status
  assert status["pid"] == os.getpid() and status["host"] == socket.gethostname()


@pytest.mark.slow
def test_status_holds_the_wall_time_of_every_leg_start_up_included(tiny):
  tiny.sample.num_samples, tiny.train.max_steps = 0, 4
  walls = []
  for max_steps in (4, 6):  # a run, then its resumed leg
    tiny.train.max_steps = max_steps
    t = time.time()
    result = jt.run(tiny, show_progress=False)
    walls.append((result.wall_s, time.time() - t))
  status = json.loads((Path(tiny.workdir) / "status.json").read_text())
  (first, first_call), (second, second_call) = walls
  assert first + second <= status["wall_s"] <= first_call + second_call
  trained = [r["elapsed_s"] for r in map(json.loads, open(Path(tiny.workdir) / "metrics.jsonl"))]
  assert max(trained) < status["wall_s"]  # its start-ups, compiles and ends are in it


def _status(path, pid: int, started: float) -> dict:
  return {"state": "running", "step": 30, "pid": pid, "host": socket.gethostname(),
          "started": started}


@pytest.mark.slow
def test_a_running_status_counts_as_running_while_its_process_lives(tmp_path):
  # A file system without locks (the run said "cannot lock"): the PID on this host decides.
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    time.sleep(0.2)
    assert lock.run_alive(tmp_path, _status(tmp_path, child.pid, time.time()))
    # The same PID given to a process that began after the status was written: not the run.
    assert not lock.run_alive(tmp_path, _status(tmp_path, child.pid, time.time() - 3600))
  finally:
    child.kill()
    child.wait()
  assert not lock.run_alive(tmp_path, _status(tmp_path, child.pid, time.time()))
  other = dict(_status(tmp_path, os.getpid(), time.time()), host="another-host")
  assert not lock.run_alive(tmp_path, other)  # its host's kernel would hold the lock
  held = lock.FileLock(tmp_path / lock.WORKDIR_LOCK)
  assert held.acquire()
  try:
    assert lock.run_alive(tmp_path, other)  # the lock is held: the run runs, wherever it is
  finally:
    held.release()


def _step(workdir: Path) -> int:
  try:
    return json.loads((workdir / "status.json").read_text()).get("step", 0)
  except (OSError, ValueError):
    return 0


@pytest.mark.slow
def test_a_run_killed_without_a_word_is_reported_at_its_next_start(corpus_file, tmp_path):
  workdir = tmp_path / "run"
  args = [a for a in kh.cli_args(workdir, corpus_file, 1000) if "checkpoint_every" not in a]
  args.append("--config.train.checkpoint_every=1000")  # no new best saves either: see below
  run = kh.Run([*args, "--config.train.eval_every=1000"])
  try:
    deadline = time.time() + 120
    while time.time() < deadline and _step(workdir) < 12:  # once a second at most
      time.sleep(0.01)
    run.proc.send_signal(signal.SIGKILL)  # as the out-of-memory killer does
    assert run.wait(30) == -signal.SIGKILL
  finally:
    if run.proc.poll() is None:
      run.proc.kill()
  status = json.loads((workdir / "status.json").read_text())
  assert status["state"] == "running" and status["step"] >= 12, status
  assert status["pid"] == run.proc.pid
  assert runs.read(workdir).state == "killed"  # compare's reading: its process is gone

  again = kh.complete([*[a for a in args if "max_steps" not in a], "--config.train.max_steps=3"])
  reached = status["step"]
  assert (f"note: the previous start of this run (PID {run.proc.pid} on host "
          f"{socket.gethostname()}, started ") in again.text()
  assert f"was killed at step {reached} without a word (SIGKILL, or out of memory)" in again.text()
  assert json.loads((workdir / "status.json").read_text())["state"] == "finished"
