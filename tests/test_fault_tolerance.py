"""Kill it anywhere, lose nothing: SIGKILL, SIGTERM, SIGINT, non-finite loss, changed config, bad input.

Every run here is a real `python -m jaxtrain` subprocess, bounded in time.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import killharness as kh
import pytest
from conftest import ROOT, run_cli

MAX_STEPS = 60  # long enough that a signal sent just after the first step lands mid-run


@pytest.fixture(scope="module")
def reference(corpus_file, tmp_path_factory):
  """The uninterrupted run every interrupted one must end equal to."""
  return kh.reference_run(tmp_path_factory.mktemp("ref"), corpus_file, MAX_STEPS)


def assert_equals_reference(workdir: Path, reference) -> None:
  arrays, position = kh.final_state(workdir)
  ref_arrays, ref_position, ref_losses = reference
  assert kh.trees_equal(arrays, ref_arrays), "final params/optimizer/step/rng differ"
  assert position == ref_position
  assert kh.losses(workdir) == ref_losses, "logged losses differ"


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bit_for_bit(corpus_file, tmp_path, reference):
  workdir = tmp_path / "killed"
  args = kh.cli_args(workdir, corpus_file, MAX_STEPS)
  kills = []
  for moment in kh.draw_moments(4, seed=7, max_time=1.0):  # two timed, two mid-write
    kills.append(kh.kill_once(args, workdir / "checkpoints", moment))
  assert sum(k.get("killed", False) for k in kills) >= 3, kills
  assert any(k.get("mid_write") for k in kills), kills  # at least one save was cut short
  saved = any(p.name.isdigit() for p in (workdir / "checkpoints").iterdir())
  final = kh.complete(args)
  assert ("resumed from checkpoint" in final.text()) == saved
  assert not any(kh.TMP_MARK in p.name for p in (workdir / "checkpoints").iterdir())
  assert_equals_reference(workdir, reference)


def _start(args: list[str]) -> kh.Run:
  run = kh.Run(args)
  assert run.started.wait(120), run.text()
  return run


@pytest.mark.slow
def test_sigterm_saves_prints_how_to_resume_and_exits_143(corpus_file, tmp_path, reference):
  workdir = tmp_path / "term"
  args = kh.cli_args(workdir, corpus_file, MAX_STEPS)
  run = _start(args)
  time.sleep(0.05)
  run.proc.send_signal(signal.SIGTERM)
  assert run.wait(60) == 143, run.text()  # 128 + SIGTERM: stopped before its end, not done
  text = run.text()
  assert "SIGTERM: stopped at step" in text and "to resume: python -m jaxtrain" in text
  assert "\nsummary: " in text and "\ntime: " in text  # the story of the leg too
  stopped = int(text.split("SIGTERM: stopped at step ")[1].split(";")[0])
  if stopped < MAX_STEPS:  # a checkpoint of exactly that step, complete
    assert (workdir / "checkpoints" / str(stopped) / "state").is_dir()
  kh.complete(args)
  assert_equals_reference(workdir, reference)


@pytest.mark.slow
def test_repeated_ctrl_c_while_saving_leaves_a_whole_checkpoint(corpus_file, tmp_path, reference):
  workdir = tmp_path / "int"
  args = kh.cli_args(workdir, corpus_file, MAX_STEPS)
  run = _start(args)
  time.sleep(0.05)
  for _ in range(20):  # the first asks to stop; the rest land while the checkpoint is written
    if run.proc.poll() is not None:
      break
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.01)
  assert run.wait(60) == 130, run.text()
  assert "SIGINT: stopped at step" in run.text() and "Traceback" not in run.text()
  kh.complete(args)
  assert_equals_reference(workdir, reference)


def _one_line_error(result, exit_code: int = 2) -> str:
  assert result.returncode == exit_code, (result.returncode, result.stdout[-1500:], result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  assert "Traceback" not in result.stdout + result.stderr
  return lines[0]


@pytest.mark.slow
def test_nonfinite_loss_stops_names_the_step_and_keeps_the_last_checkpoint(corpus_file, tmp_path):
  workdir = tmp_path / "nan"
  args = kh.cli_args(workdir, corpus_file, 6)
  kh.complete(args)
  saved = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  # Resume with an absurd learning rate (lr is a harmless change): the weights blow up.
  args = [a for a in args if "max_steps" not in a and "checkpoint_every" not in a]
  result = run_cli(*args, "--config.train.max_steps=20", "--config.train.checkpoint_every=1000",
                   "--config.optim.lr=1e35", "--config.optim.warmup_steps=0")
  line = _one_line_error(result, exit_code=3)
  assert " at step " in line and "learning rate" in line and "last good checkpoint" in line
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == saved


@pytest.fixture(scope="module")
def finished_run(corpus_file, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("done") / "run"
  args = kh.cli_args(workdir, corpus_file, 6)
  kh.complete(args)
  return workdir, args


@pytest.mark.slow
def test_resume_with_a_shape_changing_config_lists_each_field(finished_run):
  workdir, args = finished_run
  before = (workdir / "config.json").read_text()
  result = run_cli(*args, "--config.model.d_model=64", "--config.model.n_layers=3")
  line = _one_line_error(result)
  assert "model.d_model: 32 -> 64" in line and "model.n_layers: 2 -> 3" in line
  assert (workdir / "config.json").read_text() == before  # nothing overwritten


@pytest.mark.slow
def test_resume_with_harmless_changes_is_allowed_and_logged(corpus_file, tmp_path):
  workdir = tmp_path / "harmless"
  args = kh.cli_args(workdir, corpus_file, 6)
  kh.complete(args)
  args = [a for a in args if "max_steps" not in a and "eval_every" not in a]
  result = run_cli(*args, "--config.train.max_steps=9", "--config.train.eval_every=3")
  assert result.returncode == 0, result.stderr
  assert "config changes since the checkpoint: train.eval_every: 6 -> 3; train.max_steps: 6 -> 9" \
      in result.stdout


@pytest.mark.slow
def test_resume_on_different_data_needs_opt_in(finished_run, tmp_path):
  workdir, args = finished_run
  other = tmp_path / "other.txt"
  other.write_text("a completely different text " * 400)
  args = [a for a in args if "data.path" not in a]
  line = _one_line_error(run_cli(*args, f"--config.data.path={other}"))
  assert "the data differs" in line and "data.allow_changed=True" in line
  ok = run_cli(*args, f"--config.data.path={other}", "--config.data.allow_changed=True")
  assert ok.returncode == 0 and "resuming on different data" in ok.stdout, ok.stderr


# --- bad input: one line, exit status 2, nothing deleted or overwritten -------------------------

def _tiny_args(workdir: Path, data: Path | str) -> list[str]:
  return kh.cli_args(workdir, Path(data), 4)


@pytest.mark.slow
def test_missing_data(tmp_path):
  line = _one_line_error(run_cli(*_tiny_args(tmp_path / "run", tmp_path / "nope.txt")))
  assert "data.path" in line and "matches no file" in line
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_empty_data(tmp_path):
  (tmp_path / "empty.txt").write_text("")
  line = _one_line_error(run_cli(*_tiny_args(tmp_path / "run", tmp_path / "empty.txt")))
  assert "holds no text" in line
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_binary_data(tmp_path):
  (tmp_path / "weights.pt").write_bytes(bytes(range(256)) * 100)
  line = _one_line_error(run_cli(*_tiny_args(tmp_path / "run", tmp_path / "weights.pt")))
  assert "looks binary" in line and "UTF-8 text" in line
  # A .bin file is read as token ids (nanoGPT's format): without a vocabulary, one line says so.
  (tmp_path / "model.bin").write_bytes(bytes(range(256)) * 100)
  line = _one_line_error(run_cli(*_tiny_args(tmp_path / "run", tmp_path / "model.bin")))
  assert "flat token files (model.bin) do not say how many ids" in line


@pytest.mark.slow
def test_non_utf8_data_is_replaced_and_reported(tmp_path):
  (tmp_path / "latin1.txt").write_bytes("Un café très noir, s'il vous plaît. ".encode("latin-1") * 200)
  result = run_cli(*_tiny_args(tmp_path / "run", tmp_path / "latin1.txt"))
  assert result.returncode == 0, result.stderr
  assert "byte(s) that are not UTF-8 with U+FFFD" in result.stdout


@pytest.mark.slow
def test_corpus_shorter_than_one_window(tmp_path):
  (tmp_path / "short.txt").write_text("too short for a window of 33 tokens " * 3)
  line = _one_line_error(run_cli(*_tiny_args(tmp_path / "run", tmp_path / "short.txt")))
  assert "shorter than one window" in line and "seq_len" in line


@pytest.mark.slow
def test_unwritable_workdir(corpus_file, tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("keep me")
  line = _one_line_error(run_cli(*_tiny_args(blocker / "run", corpus_file)))
  assert "not writable" in line and "--config.workdir" in line
  assert blocker.read_text() == "keep me"


@pytest.mark.slow
def test_workdir_that_is_not_a_jaxtrain_run(corpus_file, tmp_path):
  workdir = tmp_path / "photos"
  workdir.mkdir()
  (workdir / "holiday.jpg").write_bytes(b"\xff\xd8 precious")
  line = _one_line_error(run_cli(*_tiny_args(workdir, corpus_file)))
  assert "not a jaxtrain run" in line and "holiday.jpg" in line
  assert sorted(p.name for p in workdir.iterdir()) == ["holiday.jpg"]
  assert (workdir / "holiday.jpg").read_bytes() == b"\xff\xd8 precious"


@pytest.mark.slow
def test_unknown_config_field(corpus_file, tmp_path):
  line = _one_line_error(run_cli(*_tiny_args(tmp_path / "run", corpus_file),
                                 "--config.train.max_stpes=5"))
  assert "--config.train.max_stpes is not a config field; did you mean --config.train.max_steps" in line


@pytest.mark.slow
def test_cuda_platform_without_a_gpu_backend(corpus_file, tmp_path):
  pytest.importorskip("jax")
  import importlib.util

  if importlib.util.find_spec("jax_cuda12_plugin") or importlib.util.find_spec("jax_cuda13_plugin"):
    pytest.skip("this machine's jax has a CUDA plugin")
  for flag in ("cuda", "gpu"):
    args = [a for a in _tiny_args(tmp_path / "run", corpus_file) if "jax_platforms" not in a]
    line = _one_line_error(run_cli(*args, f"--jax_platforms={flag}"))
    assert "no working CUDA backend" in line and "pip install" in line


def _run_with_file_size_limit(args: list[str], limit: int, cache: Path) -> subprocess.CompletedProcess:
  # Its own compile cache: jax writes cache entries in place, and a capped one stays truncated.
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=str(cache))
  # The limit is set by a small launcher that then execs jaxtrain: a preexec_fn would fork this
  # multithreaded (jax) process.
  launcher = ("import os, resource, sys; "
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
              "os.execv(sys.executable, [sys.executable, '-m', 'jaxtrain', *sys.argv[1:]])")
  return subprocess.run([sys.executable, "-c", launcher, *args], cwd=ROOT, env=env, text=True,
                        capture_output=True, timeout=300)


@pytest.mark.slow
def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(corpus_file, tmp_path):
  # A real write error from the OS inside orbax's save: files are capped at 32 KiB (EFBIG).
  workdir = tmp_path / "run"
  args = kh.cli_args(workdir, corpus_file, 3)
  kh.complete(args)  # step 3 saved normally
  args = [a for a in args if "max_steps" not in a]
  result = _run_with_file_size_limit([*args, "--config.train.max_steps=12"], 32 * 1024,
                                     tmp_path / "xla")
  line = _one_line_error(result)
  assert "writing a checkpoint" in line and "failed (File too large" in line
  assert "resume from the intact checkpoint of step 3" in line
  state = kh.final_state(workdir)[1]
  assert state == {"next_index": 9}  # step 3 x grad_accum 3: the old checkpoint still loads
  again = kh.complete(kh.cli_args(workdir, corpus_file, 6))
  assert "resumed from checkpoint" in again.text() and "at step 3" in again.text()


@pytest.mark.slow
def test_out_of_disk_space(corpus_file, tmp_path):
  mount = tmp_path / "small_disk"
  mount.mkdir()
  made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mount)],
                        capture_output=True)
  if made.returncode != 0:
    pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.decode().strip()[:80]})")
  try:
    args = [a for a in kh.cli_args(mount / "run", corpus_file, 20) if "d_model" not in a]
    line = _one_line_error(run_cli(*args, "--config.model.d_model=96"))
    assert "not enough disk space for the checkpoint" in line and "free some space" in line
  finally:
    subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_signal_during_a_routine_save_still_stops_the_run():
  from jaxtrain.system import signals

  with signals.GracefulStop() as stop:
    stop.saving = True  # a periodic checkpoint is being written when Ctrl-C comes
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs on this (the main) thread
    assert stop.requested == "SIGINT" and stop.exit_code == 130
    stop.saving = False
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    assert stop.requested == "SIGINT"  # the first signal decides how the run ends
  assert signal.getsignal(signal.SIGINT) is not stop._handle  # handlers are put back


def test_a_stop_by_any_signal_exits_with_128_plus_its_number():
  # A script runs `train && export`: a run a signal stopped before its end must not read as done.
  from jaxtrain.system import signals

  for name in ("SIGINT", "SIGPIPE", "SIGTERM"):
    assert signals.EXIT_CODES[name] == 128 + signal.Signals[name].value
  with signals.GracefulStop() as stop:
    assert stop.exit_code == 0  # no signal: a hook or the last step ended the run
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    assert stop.requested == "SIGTERM" and stop.exit_code == 143


def test_a_signal_python_drops_in_a_gc_callback_is_raised_again(capfd):
  # Python drops an exception raised in a gc callback (JAX registers one) with a traceback on
  # stderr: a Ctrl-C landing there would be lost and the run would go on.
  import gc

  from jaxtrain.system import signals

  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  hook = sys.unraisablehook
  callback = lambda phase, info: phase == "start" and os.kill(os.getpid(), signal.SIGINT)  # noqa: E731
  try:
    signals.raise_on_signals()
    gc.callbacks.append(callback)
    gc.collect()  # the KeyboardInterrupt is raised inside the callback, and dropped
    gc.callbacks.remove(callback)
    assert "KeyboardInterrupt" not in capfd.readouterr().err  # no traceback for a user's Ctrl-C
    with pytest.raises(KeyboardInterrupt):
      signals.check()
    signals.handled()
    signals.check()  # handled: quiet
  finally:
    if callback in gc.callbacks:
      gc.callbacks.remove(callback)
    signals.handled()
    sys.unraisablehook = hook
    for s, h in handlers.items():
      signal.signal(s, h)
