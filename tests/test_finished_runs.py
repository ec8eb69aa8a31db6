"""A finished run stays finished, and a signal at any moment ends a run in one line.

A restart that has nothing to train changes no file of the run; output into a closed pipe stops a
run as Ctrl-C does (checkpoint, exit 141), never as a failure; SIGTERM before the first step or
while sampling says what is on disk and exits with a defined status.
"""

import hashlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import killharness as kh
import pytest
from conftest import ROOT

from jaxtrain.loop import ending
from jaxtrain.loop.workdir import LEGS_FILE
from jaxtrain.system import signals


def _files(workdir: Path) -> dict[str, str]:
  return {str(p.relative_to(workdir)): hashlib.md5(p.read_bytes()).hexdigest()
          for p in sorted(workdir.rglob("*")) if p.is_file()}


def _cli(*args: str, **kwargs) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "jaxtrain", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


@pytest.fixture(scope="module")
def finished(corpus_file, tmp_path_factory) -> list[str]:
  workdir = tmp_path_factory.mktemp("finished") / "run"
  args = [*kh.cli_args(workdir, corpus_file, 6), "--config.sample.num_samples=1",
          "--config.sample.max_new_tokens=4"]
  done = subprocess.run([sys.executable, "-m", "jaxtrain", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  return args


@pytest.mark.slow
def test_a_restart_with_nothing_to_train_changes_no_file(finished):
  workdir = Path(finished[2].split("=", 1)[1])
  before = _files(workdir)
  other = subprocess.run([sys.executable, "-m", "jaxtrain", *finished,
                          "--config.optim.matrix_lr=0.01"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
  assert other.returncode == 0, other.stderr[-2000:]
  assert "nothing to train, and nothing in" in other.stdout and "to resume" not in other.stdout
  # Into a pipe closed at once (`| head -1`): the same, with no traceback.
  piped = _cli(*finished)
  piped.stdout.readline()
  piped.stdout.close()
  assert piped.wait(300) == 0
  err = piped.stderr.read()
  assert "Traceback" not in err and "BrokenPipe" not in err, err
  assert _files(workdir) == before
  assert json.loads((workdir / "status.json").read_text())["state"] == "finished"


@pytest.mark.slow
def test_a_new_leg_with_other_settings_records_them(finished, tmp_path):
  workdir = Path(finished[2].split("=", 1)[1])
  more = [a for a in finished if not a.startswith("--config.train.max_steps")]
  leg = subprocess.run([sys.executable, "-m", "jaxtrain", *more, "--config.train.max_steps=7",
                        "--config.optim.matrix_lr=0.01"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert leg.returncode == 0, leg.stderr[-2000:]
  legs = [json.loads(line) for line in (workdir / LEGS_FILE).read_text().splitlines()]
  assert [(x["start_step"], x["max_steps"]) for x in legs] == [(0, 6), (6, 7)]
  assert any("optim.matrix_lr" in c for c in legs[1]["changes"])
  assert json.loads((workdir / "config.json").read_text())["optim"]["matrix_lr"] == 0.01


@pytest.mark.slow
def test_closed_stdout_stops_training_like_ctrl_c(corpus_file, tmp_path):
  workdir = tmp_path / "piped"
  args = kh.cli_args(workdir, corpus_file, 500)
  proc = _cli(*args)
  for line in proc.stdout:  # `| head`: the reader leaves once training is under way
    if line.startswith("compiled and ran the first step"):
      break
  proc.stdout.close()
  assert proc.wait(300) == signals.EXIT_CODES["SIGPIPE"]
  err = proc.stderr.read()
  assert "Traceback" not in err and "BrokenPipe" not in err, err
  status = json.loads((workdir / "status.json").read_text())
  assert status["state"] == "stopped" and status["stopped_by"] == "SIGPIPE"
  assert (workdir / "checkpoints" / str(status["step"]) / "state").is_dir()


@pytest.mark.slow
def test_sigterm_before_the_first_step_is_one_line(corpus_file, tmp_path):
  workdir = tmp_path / "early"
  proc = _cli(*kh.cli_args(workdir, corpus_file, 6))
  for line in proc.stdout:
    if line.startswith("model:"):  # set up, now compiling
      proc.send_signal(signal.SIGTERM)
      break
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 143, (out, err)
  assert "Traceback" not in out + err, err
  # Where the signal lands after the `model:` line is the machine's speed: still setting up, or
  # compiling the first step. Either way the line says nothing is on disk.
  [line] = err.strip().splitlines()
  assert re.fullmatch(r"SIGTERM while (preparing the run|compiling): stopped; nothing was saved; "
                      r"a restart begins afresh", line), err
  assert "to resume:" not in out, out  # nothing was saved: there is nothing to resume


def test_the_line_for_an_interrupt_while_sampling_says_training_finished(tmp_path, capsys):
  t0 = time.time()
  result = ending.interrupted(signals.Terminated(), "sampling", tmp_path, t0)
  line = capsys.readouterr().err.strip()
  assert line.startswith("SIGTERM while sampling: stopped; training had finished")
  assert result.stopped_by == "SIGTERM" and result.exit_code == 143  # the samples are missing
  result = ending.interrupted(KeyboardInterrupt(), "preparing the run", tmp_path, t0)
  assert "SIGINT while preparing the run" in capsys.readouterr().err
  assert result.exit_code == 130
