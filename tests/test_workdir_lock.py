"""One run per workdir, and tokenizing that is interrupted (SIGKILL, Ctrl-C, a full disk): real
`python -m jaxtrain` processes, stopped the way a user or a scheduler stops them."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import killharness as kh
import numpy as np
import pytest
from conftest import ROOT, run_cli

import jaxtrain as jt
from jaxtrain.system import lock, paths
from jaxtrain.system.errors import UserError


def _checkpoints(workdir: Path) -> list[int]:
  ckpts = workdir / "checkpoints"
  return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []


@pytest.mark.slow
def test_a_second_run_into_a_live_workdir_exits_2_and_changes_nothing(corpus_file, tmp_path):
  workdir = tmp_path / "run"
  args = kh.cli_args(workdir, corpus_file, 100_000)
  first = kh.Proc(args)
  try:
    first.wait_for(first.first_step)
    marks = {name: (workdir / name).stat().st_mtime_ns
             for name in ("config.json", paths.RUN_FILE, "tokenizer.json")}
    second = run_cli(*args, timeout=600)
    assert second.returncode == 2, (second.stdout, second.stderr)
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: workdir {workdir} is in use by another "
                                                   f"run (PID {first.proc.pid} on host "), lines
    assert "--config.workdir=<another directory>" in lines[0]
    assert "jaxtrain" not in second.stdout  # it stopped before its header line
    assert first.proc.poll() is None  # the first run goes on
    steps_now = len(first.out)
    first.wait_for(lambda: len(first.out) > steps_now + 2)
    assert {name: (workdir / name).stat().st_mtime_ns for name in marks} == marks
  finally:
    first.proc.send_signal(signal.SIGTERM)
  assert first.finish() == 143, first.err  # stopped by SIGTERM, with a checkpoint
  assert any(x.startswith("SIGTERM: stopped at step") for x in first.out)
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in records if "loss" in r]
  assert steps == sorted(set(steps))  # one writer: no step twice
  assert not (workdir / lock.WORKDIR_LOCK).exists()


@pytest.mark.slow
def test_a_killed_run_leaves_no_stale_lock(corpus_file, tmp_path):
  workdir = tmp_path / "run"
  first = kh.Proc(kh.cli_args(workdir, corpus_file, 1000))
  try:
    first.wait_for(lambda: len(_checkpoints(workdir)) >= 1)
  finally:
    first.proc.send_signal(signal.SIGKILL)
  first.finish()
  lock_file = workdir / lock.WORKDIR_LOCK
  assert json.loads(lock_file.read_text())["pid"] == first.proc.pid  # its file stays behind,
  assert not lock.is_held(lock_file)  # but the kernel dropped the lock with the process
  latest = _checkpoints(workdir)[-1]
  again = kh.complete(kh.cli_args(workdir, corpus_file, latest + 3), timeout=600)
  assert f"resumed from checkpoint {workdir / 'checkpoints' / str(latest)} at step {latest}" \
      in again.text()
  assert not lock_file.exists()


@pytest.mark.slow
def test_a_held_lock_refuses_an_in_process_run_before_it_writes(tiny, tmp_path):
  workdir = Path(tiny.workdir)
  workdir.mkdir()
  held = lock.FileLock(workdir / lock.WORKDIR_LOCK)
  assert held.acquire()
  try:
    assert not lock.FileLock(workdir / lock.WORKDIR_LOCK).acquire()  # also within one process
    with pytest.raises(UserError, match=rf"is in use by another run \(PID {os.getpid()} on host "):
      jt.run(tiny, show_progress=False)
    assert [p.name for p in workdir.iterdir()] == [lock.WORKDIR_LOCK]  # nothing written
    # A run that is writing its first files (no run.json yet) is named as such, too.
    (workdir / "config.json").write_text("{}")
    with pytest.raises(UserError, match="is in use by another run"):
      paths.check_workdir(str(workdir))
  finally:
    held.release()
  assert not (workdir / lock.WORKDIR_LOCK).exists()
  (workdir / "config.json").unlink()
  (workdir / "logs").mkdir()
  (workdir / lock.WORKDIR_LOCK).write_text("")  # left by a killed run
  assert paths.check_workdir(str(workdir)) == workdir  # still an empty directory


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
  """~40 MB of text: about 1.5 s to tokenize with the char tokenizer (two passes)."""
  words = np.array("the quick brown fox jumps over a lazy dog while seven wise kings".split())
  block = " ".join(words[np.random.default_rng(0).integers(0, len(words), 200_000)]) + "\n"
  path = tmp_path_factory.mktemp("big") / "big.txt"
  path.write_text(block * 40)
  return path


def _tokenizing_args(tmp_path: Path, corpus: Path, max_steps: int = 2) -> list[str]:
  return [*kh.cli_args(tmp_path / "run", corpus, max_steps), "--config.data.tokenizer=char",
          f"--config.data.cache_dir={tmp_path / 'cache'}"]


def _writing_tokens(tmp_path: Path):
  tokens = tmp_path / "cache" / "tokens"
  return lambda: tokens.is_dir() and any(".bin.tmp" in p.name for p in tokens.iterdir())


def _cache_files(tmp_path: Path) -> list[str]:
  return sorted(p.name.split(".", 1)[1] for p in (tmp_path / "cache" / "tokens").iterdir())


@pytest.mark.slow
def test_tokenizing_killed_midway_leaves_no_trusted_cache(big_corpus, tmp_path):
  args = _tokenizing_args(tmp_path, big_corpus)
  first = kh.Proc(args)
  try:
    first.wait_for(_writing_tokens(tmp_path))
  finally:
    first.proc.send_signal(signal.SIGKILL)
  first.finish()
  assert "json" not in _cache_files(tmp_path)  # only the unfinished temporary file
  again = kh.complete(args, timeout=600)
  assert "data: tokenizing 1 file(s)" in again.text() and "done: step 2" in again.text()
  assert _cache_files(tmp_path) == ["bin", "json"]  # the dead writer's temporary file is gone


@pytest.mark.slow
def test_ctrl_c_during_tokenizing_exits_130_with_one_line(big_corpus, tmp_path):
  first = kh.Proc(_tokenizing_args(tmp_path, big_corpus))
  first.wait_for(_writing_tokens(tmp_path))
  first.proc.send_signal(signal.SIGSTOP)  # held mid-tokenizing, however busy the machine is
  try:
    assert _writing_tokens(tmp_path)(), "tokenizing ended before the process could be stopped"
    first.proc.send_signal(signal.SIGINT)  # lands anywhere, JAX's gc callback included
  finally:
    first.proc.send_signal(signal.SIGCONT)
  assert first.finish() == 130
  assert first.err == ["SIGINT while preparing the run: stopped; nothing was saved; a restart begins afresh"]
  assert _cache_files(tmp_path) == []
  assert not (tmp_path / "run" / lock.WORKDIR_LOCK).exists()


@pytest.mark.slow
def test_a_full_disk_during_tokenizing_is_one_line_and_leaves_no_cache(big_corpus, tmp_path):
  # The OS refuses to grow any file past 4 MiB (EFBIG), as a full disk refuses with ENOSPC.
  limit = 4 << 20
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"))
  launcher = ("import os, resource, sys; "
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
              "os.execv(sys.executable, [sys.executable, '-m', 'jaxtrain', *sys.argv[1:]])")
  result = subprocess.run([sys.executable, "-c", launcher, *_tokenizing_args(tmp_path, big_corpus)],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f"error: writing the token cache in {tmp_path / 'cache' / 'tokens'} "
                             "failed (File too large; it needs about ")
  assert lines[0].endswith("free space there or pass --config.data.cache_dir=<a directory with "
                           "room>")
  assert _cache_files(tmp_path) == []
  assert not (tmp_path / "run").exists()  # the run wrote nothing, so it left no directory


@pytest.mark.slow
def test_runs_in_one_process_take_turns(tiny):
  # Each run releases the workdir when it ends, so the next one in this process may resume it.
  tiny.sample.num_samples = 0
  tiny.train.max_steps = 2
  assert jt.run(tiny, show_progress=False).step == 2
  tiny.train.max_steps = 3
  assert jt.run(tiny, show_progress=False).step == 3
  assert not (Path(tiny.workdir) / lock.WORKDIR_LOCK).exists()
