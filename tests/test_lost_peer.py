"""A multi-process run that loses a process: the survivor stops on its own (within
`distributed.timeout_s` on a quiet machine; the test does not time it) with one line that names
the lost process and a checkpoint that is whole, and a restart of every process resumes from
exactly that checkpoint. Two processes on 127.0.0.1, as in test_scale_out.py; every process is
bounded in time and killed if left."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import killharness as kh
import pytest
from conftest import ROOT
from test_scale_out import free_port

TIMEOUT_S = 15  # distributed.timeout_s
LINE = re.compile(r"error: lost contact with process 1 of 2 at step (\d+) \((.+)\); restart every "
                  r"process to resume from the intact checkpoint of step (\d+)")


class Job:
  """Two processes of one run, their stdout and stderr collected line by line."""

  def __init__(self, workdir, corpus, max_steps: int):
    address = f"127.0.0.1:{free_port()}"
    # The CPU split as the command line makes it (nothing of the devices given).
    args = [*kh.cli_args(workdir, corpus, max_steps), "--config.train.grad_accum=1",
            "--config.train.checkpoint_every=2",
            f"--config.distributed.timeout_s={TIMEOUT_S}",
            f"--config.distributed.coordinator_address={address}",
            "--config.distributed.num_processes=2"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    self.procs = [subprocess.Popen([sys.executable, "-m", "jaxtrain", *args,
                                    f"--config.distributed.process_id={i}"], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for i in range(2)]
    self.out, self.err = ([[], []], [[], []])
    self.readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                    for p, out, err in zip(self.procs, self.out, self.err)
                    for stream, lines in ((p.stdout, out), (p.stderr, err))]
    for t in self.readers:
      t.start()

  @staticmethod
  def _read(stream, lines: list[str]) -> None:
    for line in stream:
      lines.append(line.rstrip("\n"))

  def wait(self, i: int, timeout: float) -> int:
    code = self.procs[i].wait(timeout)
    for t in self.readers:
      t.join(5)
    return code

  def kill_all(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def complete_steps(ckpt_dir) -> list[int]:
  return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()) \
      if ckpt_dir.is_dir() else []


@pytest.mark.slow
def test_a_lost_process_stops_the_others_with_one_line_and_a_restart_resumes(corpus_file,
                                                                             tmp_path):
  workdir, ckpt_dir = tmp_path / "run", tmp_path / "run" / "checkpoints"
  job = Job(workdir, corpus_file, max_steps=10_000)
  try:
    deadline = time.time() + 120
    while len(complete_steps(ckpt_dir)) < 2 and time.time() < deadline:
      assert all(p.poll() is None for p in job.procs), job.err
      time.sleep(0.05)
    assert len(complete_steps(ckpt_dir)) >= 2, "no checkpoints within 120 s"
    job.procs[1].send_signal(signal.SIGKILL)
    killed = time.time()
    code = job.wait(0, timeout=600)  # a hang guard only: how soon depends on the machine's load
    took = time.time() - killed
  finally:
    job.kill_all()
  # Exit 4 and the line: jaxtrain's own stop, at once where the broken connection fails a
  # collective, after distributed.timeout_s where a collective waits for the lost process silently
  # (XLA:CPU's over several devices a process); not jax's heartbeat, which aborts 30 s later.
  assert code == 4, (took, job.err[0])
  assert len(job.err[0]) == 1, job.err[0]  # one line, and nothing else on stderr
  found = LINE.fullmatch(job.err[0][0])
  assert found, job.err[0][0]
  assert "disk" not in found.group(2) and "permission" not in job.err[0][0]
  named = int(found.group(3))
  # The newest whole checkpoint at the time of the line (orbax may finish renaming a newer one
  # after it), still there and complete.
  assert named in complete_steps(ckpt_dir)[-2:], (named, complete_steps(ckpt_dir))
  assert all((ckpt_dir / str(named) / part).is_dir() for part in ("state", "meta", "data"))

  restart = Job(workdir, corpus_file, max_steps=named + 1)
  try:
    codes = [restart.wait(i, timeout=600) for i in range(2)]
  finally:
    restart.kill_all()
  assert codes == [0, 0], restart.err
  assert f"resumed from checkpoint {ckpt_dir / str(named)} at step {named}" in \
      "\n".join(restart.out[0])


@pytest.mark.slow
def test_a_sigterm_before_the_loop_stops_every_process_at_its_first_step(corpus_file, tmp_path):
  # Before the loop, SIGTERM is jax's preemption notifier's: it must not be lost.
  workdir = tmp_path / "run"
  job = Job(workdir, corpus_file, max_steps=10_000)
  try:
    deadline = time.time() + 120
    while not any(line.startswith("jaxtrain ") for line in job.out[0]) and time.time() < deadline:
      time.sleep(0.01)
    assert not any(line.startswith("step ") for line in job.out[0]), "the loop began already"
    job.procs[1].send_signal(signal.SIGTERM)
    codes = [job.wait(i, timeout=600) for i in range(2)]
  finally:
    job.kill_all()
  assert codes == [143, 143], job.err  # both stopped by the one SIGTERM, with its status
  stopped = [line for line in job.out[0] if line.startswith("SIGTERM: stopped at step ")]
  assert stopped, job.out[0][-5:]
  step = int(stopped[0].split()[4].rstrip(";"))
  assert step <= 2 and step in complete_steps(workdir / "checkpoints"), (step, stopped)
