"""A real Slurm: examples/slurm/train.sbatch run by a one-node cluster (local-cluster.sh) with two
tasks, to the end, and through `scancel --signal=TERM` and a resubmission.

Skipped, with the reason, where Slurm and munge are not installed (apt-get install slurm-wlm munge)
or the cluster cannot start (it needs root). One process per task, each splitting its CPU into
devices as the command line does; they join through jax.distributed's reading of Slurm's
environment.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "slurm"
STEPS = 60


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  """The environment of a started one-node cluster; stopped after the module."""
  missing = [c for c in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(c) is None]
  if missing:
    pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): apt-get install -y "
                "slurm-wlm munge")
  if os.geteuid() != 0:
    pytest.skip("a local Slurm needs root (slurmd starts tasks as their user)")
  directory = tmp_path_factory.mktemp("slurm")
  env = dict(os.environ, JAXTRAIN_SLURM_DIR=str(directory),
             JAXTRAIN_SLURMCTLD_PORT=str(_free_port()), JAXTRAIN_SLURMD_PORT=str(_free_port()))
  script = str(EXAMPLE / "local-cluster.sh")
  started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=600)
  if started.returncode != 0:
    subprocess.run([script, "stop"], env=env, timeout=600)
    pytest.skip(f"the local Slurm did not start: {started.stderr.strip()[-500:]}")
  env.update(SLURM_CONF=str(directory / "slurm.conf"), JAXTRAIN_PYTHON=sys.executable,
             PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
             PYTHONUNBUFFERED="1")
  yield env
  subprocess.run([script, "stop"], env=env, timeout=600)
  print("\n" + subprocess.run(["sacct", "-c", "--format=JobID,JobName,NNodes,NodeList,State,"
                               "ExitCode,Start,End"], env=env, capture_output=True,
                              text=True).stdout)


def job_args(workdir: Path, data_path: Path) -> list[str]:
  # The docs' command: nothing of the devices given (each task splits its CPU as the CLI does).
  return ["--config=configs/nano.py", "--jax_platforms=cpu", f"--config.workdir={workdir}",
          f"--config.data.path={data_path}",
          f"--config.train.max_steps={STEPS}", "--config.model.n_layers=2",
          "--config.model.d_model=32", "--config.model.n_heads=4", "--config.model.seq_len=32",
          "--config.train.batch_size=8", "--config.train.checkpoint_every=10",
          "--config.train.eval_every=30", "--config.train.eval_steps=2",
          "--config.train.log_every=10", "--config.sample.num_samples=0", "--config.headless=True"]


def sbatch(env: dict, out: Path, args: list[str], wait: bool) -> str:
  """Submits the example as 2 tasks on the one node; its job id."""
  cmd = ["sbatch", "--parsable", "--ntasks-per-node=2", "--time=10", f"--output={out}",
         *(["--wait"] if wait else []), str(EXAMPLE / "train.sbatch"), *args]
  done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, (done.stdout + done.stderr + (out.read_text() if out.exists()
                                                                else ""))[-3000:]
  return done.stdout.strip().split(";")[0]


def job_state(env: dict, job: str) -> str:
  return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True,
                        text=True).stdout.strip()


def positions(workdir: Path, step: int) -> list[int]:
  """Each process's data iterator position saved in checkpoint `step`: the micro-batches it read."""
  files = sorted((workdir / "checkpoints" / str(step) / "data").glob("process_*-of-2.json"))
  return [json.loads(f.read_text())["next_index"] for f in files]


def final_arrays(workdir: Path):
  from jaxtrain.checkpoints import load

  return jax.device_get(load.load_state(str(workdir)).arrays())


def test_two_tasks_train_together_and_resume_after_scancel(slurm, corpus_file, tmp_path):
  # One job to the end.
  whole = tmp_path / "whole"
  sbatch(slurm, tmp_path / "whole.out", job_args(whole, corpus_file), wait=True)
  text = (tmp_path / "whole.out").read_text()
  assert f"done: step {STEPS}" in text, text[-3000:]
  assert "2 task(s)" in text, text[-3000:]
  devices = int(re.search(r"\| cpu x(\d+) ", text).group(1))  # both tasks' devices in one mesh
  assert devices % 2 == 0, text[-3000:]
  assert positions(whole, STEPS) == [STEPS, STEPS], text[-3000:]  # both tasks read every step

  # The same job stopped by scancel once its first checkpoint is written, then submitted again.
  cut = tmp_path / "cut"
  job = sbatch(slurm, tmp_path / "cut.out", job_args(cut, corpus_file), wait=False)
  deadline = time.time() + 300
  while not (cut / "checkpoints" / "10").is_dir() and job_state(slurm, job) and \
      time.time() < deadline:
    time.sleep(0.05)
  subprocess.run(["scancel", "--signal=TERM", job], env=slurm, check=True, timeout=600)
  while job_state(slurm, job) and time.time() < deadline:
    time.sleep(0.2)
  text = (tmp_path / "cut.out").read_text()
  stopped = [line for line in text.splitlines() if line.startswith("SIGTERM: stopped at step")]
  assert stopped, text[-3000:]
  step = int(stopped[0].split()[4].rstrip(";"))
  assert 10 <= step < STEPS, stopped
  assert positions(cut, step) == [step, step]

  sbatch(slurm, tmp_path / "cut.out", job_args(cut, corpus_file), wait=True)
  text = (tmp_path / "cut.out").read_text()
  assert f"at step {step}" in text and f"done: step {STEPS}" in text, text[-3000:]
  a, b = final_arrays(whole), final_arrays(cut)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
