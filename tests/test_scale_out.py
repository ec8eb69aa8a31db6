"""Many devices and many processes: the same numbers as one device, and checkpoints that move.

Virtual CPU devices (`--jax_num_cpu_devices`) stand in for GPUs; two processes on 127.0.0.1
talk through gloo, as a CPU cluster does. Every process is bounded in time and killed if left.
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys

import jax
import killharness as kh
import numpy as np
import pytest
from conftest import ROOT

TOL = 1e-5


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def args_for(workdir, corpus, max_steps: int, devices: int | str, *extra: str) -> list[str]:
  """`devices`: a count for --jax_num_cpu_devices, or a flag of its own that gives them."""
  given = f"--jax_num_cpu_devices={devices}" if isinstance(devices, int) else devices
  return [*kh.cli_args(workdir, corpus, max_steps), given, "--config.optim.decay_steps=12",
          "--config.train.batch_size=8", *extra]


def launch(args: list[str], processes: int = 1, timeout: float = 300) -> list[str]:
  """Runs jaxtrain as `processes` processes of one job; returns each one's output."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  extra = [[]]
  if processes > 1:
    address = f"127.0.0.1:{free_port()}"
    extra = [[f"--config.distributed.coordinator_address={address}",
              f"--config.distributed.num_processes={processes}",
              f"--config.distributed.process_id={i}"] for i in range(processes)]
  procs = [subprocess.Popen([sys.executable, "-m", "jaxtrain", *args, *e], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for e in extra]
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, text in zip(procs, outputs):
    assert p.returncode == 0, text[-3000:]
  return outputs


def max_diff(a, b) -> float:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
def test_data_parallel_and_fsdp_match_a_single_device():
  out = subprocess.run([sys.executable, str(ROOT / "tests" / "multidevice_steps.py"), "4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
  report = json.loads(out.strip().splitlines()[-1])
  assert report["devices"] == 4
  for mesh in ("data=4,fsdp=1", "data=1,fsdp=4", "data=2,fsdp=2"):
    assert report[mesh]["max_abs_diff"] < TOL, (mesh, report[mesh])
  assert report["data=4,fsdp=1"]["param_specs"] == ["P()"]  # replicated
  # A small data-parallel step on CPU all-reduces all its gradients (and the loss) at once.
  assert report["data=4,fsdp=1"]["all_reduces"] == 1, report["data=4,fsdp=1"]
  assert "P('fsdp', None)" in report["data=1,fsdp=4"]["param_specs"]
  # Each device draws its own part of split params: init moves nothing between devices.
  assert all(report[mesh]["init_collectives"] == 0 for mesh in ("data=4,fsdp=1", "data=1,fsdp=4",
                                                                "data=2,fsdp=2")), report


@pytest.mark.slow
def test_two_processes_match_one_process_with_four_devices(corpus_file, tmp_path):
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=2"]
  one = launch(args_for(tmp_path / "one", corpus_file, 8, 4, *mesh))[0]
  # Each process's devices given in the config (mesh.cpu_devices); test_checkpoints_move_between_
  # topologies gives them with --jax_num_cpu_devices, the documented command not at all.
  two = launch(args_for(tmp_path / "two", corpus_file, 8, "--config.mesh.cpu_devices=2", *mesh),
               processes=2)
  assert "cpu x4 (mesh data=2 fsdp=2)" in one and "cpu x4 (mesh data=2 fsdp=2)" in two[0]
  assert "step      8/8" in two[0] and "step " not in two[1]  # process 0 alone reports
  assert sorted(p.name for p in (tmp_path / "two" / "checkpoints" / "8" / "data").iterdir()
                if p.suffix == ".json") == ["process_0-of-2.json", "process_1-of-2.json"]
  a, _ = kh.final_state(tmp_path / "one")
  b, _ = kh.final_state(tmp_path / "two")
  assert max_diff(a, b) < TOL
  la, lb = kh.losses(tmp_path / "one"), kh.losses(tmp_path / "two")
  assert la.keys() == lb.keys() and max(abs(la[k] - lb[k]) for k in la) < TOL


@pytest.mark.slow
def test_checkpoints_move_between_topologies(corpus_file, tmp_path):
  """Saved on 4 devices (FSDP) -> resumed on 1; saved on 1 -> resumed on 2 processes -> on 1."""
  reference = tmp_path / "ref"
  launch(args_for(reference, corpus_file, 12, 1))
  ref, ref_position = kh.final_state(reference)

  moved = tmp_path / "moved"
  launch(args_for(moved, corpus_file, 4, 4, "--config.mesh.fsdp=4"))
  out = launch(args_for(moved, corpus_file, 8, 1))[0]
  assert "resumed from checkpoint" in out and "at step 4" in out and "cpu x1" in out
  out = launch(args_for(moved, corpus_file, 10, 2, "--config.mesh.fsdp=2"), processes=2)[0]
  assert "at step 8" in out and "cpu x4" in out
  out = launch(args_for(moved, corpus_file, 12, 1))[0]  # back to one process: data state moves too
  assert "at step 10" in out
  arrays, position = kh.final_state(moved)
  assert position == ref_position
  assert max_diff(arrays, ref) < TOL


def documented_command(page: str) -> str:
  """The multi-process command of a docs page's "Without Slurm" form, as written there."""
  from test_docs import bash_commands

  return next(c for c in bash_commands((ROOT / "docs" / page).read_text())
              if "--config.distributed.process_id=0" in c)


def as_processes(command: str, workdir, corpus, max_steps: int) -> list[list[str]]:
  """Each process's argv of the documented `command` on this machine: process 0 listens on
  127.0.0.1, the workdir and data are the test's, the model tiny; nothing of the devices is added
  (the default CPU split)."""
  port = free_port()
  command = re.sub(r"coordinator_address=\S+", f"coordinator_address=127.0.0.1:{port}", command)
  command = re.sub(r"--config\.workdir=\S+", f"--config.workdir={workdir}", command)
  args = shlex.split(command)[3:]  # after `python -m jaxtrain`
  assert not any("cpu_devices" in a for a in args), args
  tiny = ["--config.model.n_layers=1", "--config.model.d_model=32", "--config.model.n_heads=2",
          "--config.model.seq_len=32", "--config.train.batch_size=8", "--config.train.log_every=1",
          "--config.train.eval_every=30", "--config.train.eval_steps=1", "--config.sample.num_samples=0",
          "--config.train.checkpoint_every=6", "--config.optim.warmup_steps=2",
          f"--config.data.path={corpus}", f"--config.train.max_steps={max_steps}",
          "--config.headless=True"]
  base = [a for a in args if "process_id" not in a] + tiny
  return [[*base, f"--config.distributed.process_id={i}"] for i in range(2)]


@pytest.mark.slow
def test_the_documented_two_process_command_trains_and_resumes_bit_exactly(corpus_file, tmp_path):
  """The docs' command for hosts without Slurm, two processes on one machine, with the default CPU
  split: each process feeds its half of the batch on its own devices, and a job killed at step ~20
  and started again ends bit for bit where the whole job ended."""
  commands = {documented_command(page) for page in ("clusters.md", "many-devices.md")}
  assert len(commands) == 1, commands  # the two pages give the same command: one run tests both
  command = commands.pop()
  whole = [kh.Proc(a) for a in as_processes(command, tmp_path / "whole", corpus_file, 30)]
  codes = [p.finish(300) for p in whole]
  assert codes == [0, 0], [p.err[-5:] for p in whole]
  header = next(line for line in whole[0].out if line.startswith("jaxtrain "))
  n = int(re.search(r"cpu x(\d+)", header).group(1))
  assert n % 2 == 0 and n >= 2, header  # both processes' devices in one mesh
  assert any(line.startswith("done: step 30") for line in whole[0].out), whole[0].out[-5:]

  cut = tmp_path / "cut"
  argv = as_processes(command, cut, corpus_file, 30)
  first = [kh.Proc(a) for a in argv]
  try:
    first[0].wait_for(lambda: (cut / "checkpoints" / "18" / "data").is_dir(), timeout=300)
  finally:
    for p in first:
      p.proc.send_signal(signal.SIGKILL)
      p.finish(30)
  again = [kh.Proc(a) for a in as_processes(command, cut, corpus_file, 30)]
  assert [p.finish(300) for p in again] == [0, 0], [p.err[-5:] for p in again]
  assert any(line.startswith("resumed from checkpoint") for line in again[0].out), again[0].out
  a, position_a = kh.final_state(tmp_path / "whole")
  b, position_b = kh.final_state(cut)
  assert kh.trees_equal(a, b) and position_a == position_b
