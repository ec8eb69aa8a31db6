"""A damaged checkpoint is set aside with one warning line, and the run goes on from the newest
intact one, ending bit-for-bit where an undamaged run ends; none intact is one line, exit 2.

Real runs, real files, real orbax: a run saves steps 2 and 4, then the newest is damaged on disk.
"""

import errno
import gc
import json
import re
import shutil
from pathlib import Path

import jax
import killharness as kh
import pytest
from conftest import run_cli

from jaxtrain import testing, train
from jaxtrain.checkpoints import load, recover, store
from jaxtrain.core import programs
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.system import lock
from jaxtrain.system.errors import UserError
from jaxtrain.testing import assert_trees_equal

# After a failed array read, orbax abandons the step's other reads; they end as unraisable errors
# whenever they are collected. A CLI run sends those to workdir/logs/ (the CLI test below checks
# its stderr); in process they are expected noise.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _collect_abandoned_reads():
  """Collected here, the abandoned reads end under this module's filter, not in a later test."""
  yield
  gc.collect()

FIRST, TOTAL = 4, 6  # the damaged run saved steps 2 and 4; the resumed one goes on to 6


def _config(tiny, workdir: Path, max_steps: int):
  cfg = tiny.copy_and_resolve_references()
  cfg.workdir = str(workdir)
  cfg.train.max_steps = max_steps
  cfg.train.grad_accum = 2
  cfg.model.dropout = 0.1
  cfg.optim.decay_steps = 2 * TOTAL  # the schedule must not depend on where a leg stops
  cfg.train.log_every = 1
  cfg.train.eval_every = 2
  cfg.train.checkpoint_every = 2
  cfg.train.keep_checkpoints = 2
  cfg.sample.num_samples = 0
  return cfg


def _final(cfg) -> tuple[dict, dict]:
  corpus = corpus_lib.prepare(cfg.data, show_progress=False)
  p = programs.build(cfg, corpus.tokenizer.vocab_size)
  ckpts = store.Checkpoints(cfg.workdir, cfg.train.keep_checkpoints)
  it = corpus_lib.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, cfg.seed)
  state = testing.restore(ckpts, ckpts.latest_step(), p.abstract, p.shardings, it)
  ckpts.close()
  return jax.device_get(state.arrays()), it.get_state()


@pytest.fixture(scope="module")
def runs(corpus_file, tmp_path_factory):
  """(the undamaged run to TOTAL steps, a run stopped at FIRST steps to copy and damage)."""
  from jaxtrain.testing import tiny_config

  base = tmp_path_factory.mktemp("damaged")
  tiny = tiny_config(**{"data.path": str(corpus_file), "headless": True})
  whole = _config(tiny, base / "whole", TOTAL)
  train.run(whole, show_progress=False)
  first = _config(tiny, base / "first", FIRST)
  train.run(first, show_progress=False)
  return whole, first


def _copy(runs, tmp_path: Path):
  """A copy of the run that stopped at FIRST, configured to go on to TOTAL."""
  _, first = runs
  cfg = first.copy_and_resolve_references()
  cfg.workdir = str(tmp_path / "run")
  cfg.train.max_steps = TOTAL
  shutil.copytree(first.workdir, cfg.workdir)
  return cfg, Path(cfg.workdir) / "checkpoints"


def _array_files(step_dir: Path) -> list[Path]:
  """The ocdbt data files of a step's arrays, largest first."""
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  return sorted(files, key=lambda p: -p.stat().st_size)


def _flip_inside_an_array(path: Path) -> None:
  """Flips bytes in the middle of the file's largest zstd frame: an array that compresses least,
  whose flipped bytes zstd decodes without complaint, whatever order the arrays were written in (a
  file's middle can fall in a frame that compresses well, e.g. zeros, where flipped bytes fail to
  decode: other damage)."""
  raw = path.read_bytes()
  magic = [m.start() for m in re.finditer(re.escape(b"\x28\xb5\x2f\xfd"), raw)]  # each frame's
  starts = (magic or [0]) + [len(raw)]  # no frame (stored uncompressed): the file's middle
  begin, end = max(zip(starts, starts[1:]), key=lambda frame: frame[1] - frame[0])
  _flip(path, (begin + end) // 2 / len(raw))


def _flip(path: Path, at: float) -> None:
  raw = bytearray(path.read_bytes())
  i = int(len(raw) * at)
  raw[i:i + 8] = bytes(b ^ 0xFF for b in raw[i:i + 8])
  path.write_bytes(bytes(raw))


def _cut(path: Path) -> None:
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
  # Mid-stream: zstd decodes it without complaint; only the saved checksums tell.
  "bytes flipped inside array data": lambda d: _flip_inside_an_array(_array_files(d)[0]),
  "bytes flipped in a compressed frame's header": lambda d: _flip(_array_files(d)[0], 0.0),
  "an array data file deleted": lambda d: _array_files(d)[0].unlink(),
  "the run's metadata cut short": lambda d: _cut(d / "meta" / "metadata"),
  "the arrays' metadata cut short": lambda d: _cut(d / "state" / "_METADATA"),
  "the data iterator's state deleted": lambda d: next((d / "data").glob("process_*.json")).unlink(),
  "the run's metadata directory deleted": lambda d: shutil.rmtree(d / "meta"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_set_aside_and_the_run_goes_on_from_the_one_before(
    runs, tmp_path, capsys, damage):
  whole, _ = runs
  cfg, ckpt_dir = _copy(runs, tmp_path)
  DAMAGE[damage](ckpt_dir / str(FIRST))
  capsys.readouterr()
  result = train.run(cfg, show_progress=True)
  out = capsys.readouterr().out.splitlines()
  warnings = [line for line in out if line.startswith("warning:")]
  assert len(warnings) == 1, out
  moved = next(p for p in ckpt_dir.iterdir() if p.name.startswith(f"{FIRST}.damaged-"))
  assert warnings[0].startswith(f"warning: checkpoint {ckpt_dir / str(FIRST)} is damaged (")
  assert warnings[0].endswith(f"); moved it to {moved}; resuming from step 2")
  assert f"resumed from checkpoint {ckpt_dir / '2'} at step 2" in "\n".join(out)
  assert result.step == TOTAL
  # Saving went on past the damaged step; retention kept the latest two and left it alone.
  kept = sorted(p.name for p in (Path(whole.workdir) / "checkpoints").iterdir())
  assert sorted(p.name for p in ckpt_dir.iterdir()) == sorted([*kept, moved.name])
  assert (moved / "state").is_dir()
  a, a_data = _final(whole)
  b, b_data = _final(cfg)
  assert_trees_equal(a, b)
  assert a_data == b_data
  assert kh.losses(Path(whole.workdir)) == kh.losses(Path(cfg.workdir))


@pytest.mark.slow
def test_the_reason_names_the_damage(runs, tmp_path, capsys):
  cfg, ckpt_dir = _copy(runs, tmp_path)
  DAMAGE["bytes flipped inside array data"](ckpt_dir / str(FIRST))
  cfg.train.max_steps = FIRST  # nothing to train: only the restore
  train.run(cfg, show_progress=True)
  line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("warning:"))
  assert "(array data differs from what was saved: checksum of " in line, line


@pytest.mark.slow
def test_with_every_checkpoint_damaged_the_run_stops_and_moves_nothing(runs, tmp_path):
  cfg, ckpt_dir = _copy(runs, tmp_path)
  for step in (2, FIRST):
    DAMAGE["an array data file deleted"](ckpt_dir / str(step))
  with pytest.raises(UserError) as e:
    train.run(cfg, show_progress=False)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"no checkpoint in {ckpt_dir} can be read (step 4: ")
  assert "; step 2: " in message
  assert message.endswith(f"to start afresh, pass a new --config.workdir, or move {ckpt_dir} "
                          "away")
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["2", "4"]


@pytest.mark.slow
def test_load_state_uses_the_newest_intact_checkpoint(runs, tmp_path, capsys):
  cfg, ckpt_dir = _copy(runs, tmp_path)
  expected = load.load_state(cfg.workdir, step=2)
  DAMAGE["bytes flipped inside array data"](ckpt_dir / str(FIRST))
  with pytest.raises(UserError, match=r"checkpoint .*/4 is damaged \(array data differs"):
    load.load_state(cfg.workdir, step=FIRST)  # asked for: no other step instead
  capsys.readouterr()
  state = load.load_state(cfg.workdir)
  assert int(state.step) == 2
  assert_trees_equal(jax.device_get(state.arrays()), jax.device_get(expected.arrays()))
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith(f"warning: checkpoint {ckpt_dir / '4'} is damaged ")
  assert err[0].endswith("; left in place (reading a run changes none of its files; resuming its "
                         "training sets it aside); loading step 2")
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["2", "4"]  # only training moves it
  DAMAGE["the run's metadata cut short"](ckpt_dir / "2")
  with pytest.raises(UserError, match=r"^no checkpoint in .* can be read \(step 4: .*; step 2: "):
    load.load_state(cfg.workdir)


@pytest.mark.slow
def test_cli_with_every_checkpoint_damaged_exits_2_with_one_line(corpus_file, tmp_path):
  workdir = tmp_path / "cli"
  args = kh.cli_args(workdir, corpus_file, 6)
  kh.complete(args)
  ckpt_dir = workdir / "checkpoints"
  steps = sorted(p.name for p in ckpt_dir.iterdir())
  for step in steps:
    _flip(_array_files(ckpt_dir / step)[0], 0.5)
  result = run_cli(*args)
  assert result.returncode == 2, (result.stdout[-1500:], result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: no checkpoint in {ckpt_dir} can be read")
  assert "Traceback" not in result.stdout + result.stderr
  assert "pass a new --config.workdir" in lines[0]
  assert sorted(p.name for p in ckpt_dir.iterdir()) == steps
  assert json.loads((workdir / "run.json").read_text())  # the run's files are untouched


@pytest.mark.slow
def test_two_processes_agree_on_the_checkpoint_when_only_one_cannot_read_it(corpus_file,
                                                                            tmp_path):
  """Process 1 alone finds step 4 damaged (its own data iterator state is gone): both processes
  go back to step 2, and process 0 alone moves step 4 aside."""
  from test_scale_out import args_for, launch

  workdir = tmp_path / "two"
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.train.checkpoint_every=2"]
  launch(args_for(workdir, corpus_file, FIRST, 2, *mesh), processes=2)
  ckpt_dir = workdir / "checkpoints"
  (ckpt_dir / str(FIRST) / "data" / "process_1-of-2.json").unlink()
  out = launch(args_for(workdir, corpus_file, TOTAL, 2, *mesh), processes=2)
  moved = [p for p in ckpt_dir.iterdir() if p.name.startswith(f"{FIRST}.damaged-")]
  assert len(moved) == 1
  assert (f"warning: checkpoint {ckpt_dir / str(FIRST)} is damaged (another process could not "
          f"read its part); moved it to {moved[0]}; resuming from step 2") in out[0].splitlines()
  assert f"resumed from checkpoint {ckpt_dir / '2'} at step 2" in out[0]
  assert f"step      {TOTAL}/{TOTAL}" in out[0] and "warning" not in out[1]


@pytest.mark.slow
def test_a_step_removed_while_being_read_is_skipped_not_moved(runs, tmp_path, capsys,
                                                               monkeypatch):
  cfg, ckpt_dir = _copy(runs, tmp_path)
  read_meta = store.Checkpoints.read_meta

  def removed_first(self, step):
    if step == FIRST:  # listed, then removed (a live run's retention) before it is read
      shutil.rmtree(self.directory / str(step))
    return read_meta(self, step)

  monkeypatch.setattr(store.Checkpoints, "read_meta", removed_first)
  capsys.readouterr()
  assert int(load.load_state(cfg.workdir).step) == 2
  assert capsys.readouterr().err == ""
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["2"]


TRANSIENT = {
    "EIO": OSError(errno.EIO, "Input/output error"),
    "too many open files": OSError(errno.EMFILE, "Too many open files"),
    "tensorstore UNAVAILABLE": Exception("UNAVAILABLE: Error reading local file: timed out"),
    "tensorstore DEADLINE_EXCEEDED": Exception("DEADLINE_EXCEEDED: read took too long"),
}


@pytest.mark.slow
@pytest.mark.parametrize("error", TRANSIENT)
def test_an_error_that_is_not_damage_stops_with_one_line_and_moves_nothing(
    runs, tmp_path, monkeypatch, error):
  cfg, ckpt_dir = _copy(runs, tmp_path)
  read_meta = store.Checkpoints.read_meta

  def failing(self, step):
    if step == FIRST:
      raise TRANSIENT[error]
    return read_meta(self, step)

  monkeypatch.setattr(store.Checkpoints, "read_meta", failing)
  with pytest.raises(UserError) as e:
    load.load_state(cfg.workdir)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"cannot read the checkpoint of step {FIRST} in {ckpt_dir} (")
  assert str(TRANSIENT[error].args[-1]) in message
  assert message.endswith("it may be intact, so nothing was moved: fix the cause, then try again")
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["2", "4"]
  with pytest.raises(UserError, match=r"^cannot read the checkpoint of step 4 "):
    train.run(cfg, show_progress=False)  # resuming: the same rule
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["2", "4"]


@pytest.mark.slow
def test_load_state_moves_nothing_while_a_run_holds_the_workdir(runs, tmp_path, capsys):
  cfg, ckpt_dir = _copy(runs, tmp_path)
  DAMAGE["bytes flipped inside array data"](ckpt_dir / str(FIRST))
  held = lock.FileLock(Path(cfg.workdir) / lock.WORKDIR_LOCK)
  assert held.acquire()
  try:
    capsys.readouterr()
    state = load.load_state(cfg.workdir)
  finally:
    held.release()
  assert int(state.step) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1, err
  assert err[0].startswith(f"warning: checkpoint {ckpt_dir / str(FIRST)} could not be read "
                           "(array data differs from what was saved")
  assert err[0].endswith(f"); left in place, since a run holds {Path(cfg.workdir)}; loading "
                         "step 2")
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["2", "4"]


def test_only_positive_evidence_is_damage(tmp_path):
  step_dir = tmp_path / "4"
  step_dir.mkdir()
  damaged = [recover.Damaged("x"), Exception("DATA_LOSS: Error reading ..."),
             Exception("ZSTD_decompressStream() failed: Data corruption detected"),
             ValueError("Truncated read"), FileNotFoundError(2, "gone", str(step_dir / "meta")),
             Exception(f'NOT_FOUND: Error reading "{step_dir}/state/d/abc"')]
  fatal = [OSError(errno.EIO, "Input/output error"), OSError(errno.ESTALE, "Stale file handle"),
           PermissionError(13, "denied"), MemoryError(), UserError("config"),
           Exception("UNAVAILABLE: connection reset"), RuntimeError("RESOURCE_EXHAUSTED")]
  assert [recover.classify(e, step_dir) for e in damaged] == [recover.DAMAGED] * len(damaged)
  assert [recover.classify(e, step_dir) for e in fatal] == [recover.FATAL] * len(fatal)
  assert recover.classify(FileNotFoundError(2, "gone"), tmp_path / "6") == recover.GONE
