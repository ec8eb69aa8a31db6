"""`python -m jaxtrain.sweep`: the grid, its names and checks; a 2x1 sweep interrupted and
resumed; a run that fails."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxtrain.system import machine
from jaxtrain.system.errors import UserError
from jaxtrain.tools import launcher, runs, sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny_file(corpus_file, tmp_path) -> Path:
  """A config file of the tiny model on the test corpus."""
  path = tmp_path / "tiny.py"
  path.write_text("from jaxtrain.testing import tiny_config\n\n\ndef get_config():\n"
                  f"  return tiny_config(**{{'data.path': {str(corpus_file)!r}}})\n")
  return path


def _sweep(*args: str, **kwargs):
  return subprocess.Popen([sys.executable, "-m", "jaxtrain.sweep", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


def test_grid_names_each_run_by_its_values(tiny_file, tmp_path):
  args = sweep.parse([f"--config={tiny_file}", "--sweep=optim.lr=1e-3,3e-3",
                      "--sweep=model.n_layers=1,2", "--sweep=train.skip_nonfinite=true",
                      f"--root={tmp_path}", "--config.train.max_steps=7", "--jax_platforms=cpu"])
  points = sweep.grid(args)
  assert [p.name for p in points] == [
      "lr=1e-3_n_layers=1_skip_nonfinite=True", "lr=1e-3_n_layers=2_skip_nonfinite=True",
      "lr=3e-3_n_layers=1_skip_nonfinite=True", "lr=3e-3_n_layers=2_skip_nonfinite=True"]
  assert all(p.max_steps == 7 for p in points)
  cmd = launcher.command(args, points[1])
  assert cmd[-6:] == ["--config.optim.lr=1e-3", "--config.model.n_layers=2",
                      "--config.train.skip_nonfinite=True",
                      f"--config.workdir={tmp_path / points[1].name}", "--config.headless=True",
                      "--jax_platforms=cpu"]
  assert "--config.train.max_steps=7" in cmd


@pytest.mark.parametrize("argv, message", [
    (["--sweep=optim.lr=1e-3"], "--config is missing"),
    (["--config=F", "--sweep=optim.lr=1e-3", "--root=r", "--parallel=0"], "--parallel=0"),
    (["--config=F", "--sweep=optim.lrate=1", "--root=r"], "optim.lrate is not a config field"),
    (["--config=F", "--sweep=optim.lr=", "--root=r"], "write --sweep=field=v1,v2"),
    (["--config=F", "--sweep=workdir=a,b", "--root=r"], "drop it"),
    (["--config=F", "--root=r", "--oops"], "unexpected argument --oops"),
    (["--config=F", "--sweep=optim.lr=1e-3", "--root=r", "--progress_every_s=0"],
     "--progress_every_s=0: must be a number of seconds > 0"),
])
def test_bad_arguments_say_what_to_do(argv, message, tiny_file):
  argv = [a.replace("=F", f"={tiny_file}") for a in argv]
  with pytest.raises(UserError, match=message.replace("-", "\\-").replace(".", "\\.")):
    sweep.grid(sweep.parse(argv))


@pytest.mark.slow
def test_bad_values_stop_the_sweep_before_any_run(tiny_file, tmp_path):
  with pytest.raises(UserError, match="'fast' is not a number"):
    sweep.grid(sweep.parse([f"--config={tiny_file}", "--sweep=optim.lr=1e-3,fast",
                            f"--root={tmp_path}"]))
  with pytest.raises(UserError, match="model.d_model"):  # validated as the run would be
    sweep.grid(sweep.parse([f"--config={tiny_file}", "--sweep=model.n_heads=3",
                            f"--root={tmp_path}"]))


def test_cores_are_split_between_concurrent_runs(monkeypatch):
  monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
  assert launcher.core_slots(2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert launcher.core_slots(3) == [[0, 1], [2, 3], [4, 5]]
  assert launcher.core_slots(16)[9] == [1]  # more runs than cores: they share
  assert launcher.core_slots(1) == [list(range(8))]


def _wait_for_a_train_line(metrics: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and proc.poll() is None:
    if metrics.exists() and '"loss"' in metrics.read_text():
      return
    time.sleep(0.05)
  raise AssertionError(f"no train line in {metrics}; sweep exit {proc.poll()}")


def test_progress_says_step_loss_speed_and_eta(tmp_path):
  point = launcher.Point("lr=1", [("optim.lr", "1")], tmp_path / "run", tmp_path / "run.log", 100)
  assert launcher.progress(point) is None  # no run yet: nothing to say
  point.workdir.mkdir()
  (point.workdir / "run.json").write_text("{}")
  assert launcher.progress(point) is None  # no step trained yet
  metrics = point.workdir / "metrics.jsonl"

  def train_to(last: int) -> None:
    metrics.write_text("".join(json.dumps({"step": s, "loss": 3.0 - s / 100,
                                           "tokens_per_sec": 2000.0}) + "\n"
                               for s in range(10, last + 1, 10)))

  train_to(40)
  assert launcher.progress(point) == (40, "step 40/100, loss 2.6000, 2.00k tok/s")
  # 20 steps in 10 s of wall time: 40 more take 20 s.
  assert launcher.progress(point, first=(40, 1000.0), now=1010.0) == (
      40, "step 40/100, loss 2.6000, 2.00k tok/s")  # no step since: no rate yet
  train_to(60)
  assert launcher.progress(point, first=(40, 1000.0), now=1010.0)[1].endswith(", ETA 20.0s")

  printed = []
  s = launcher.Sweep(launcher.Args("c.py", [("optim.lr", ["1"])], tmp_path), [point], printed.append)
  s.running[0] = (point, None, time.time() - 65)
  s._progress()
  s._progress()  # the same step again: no new line
  assert printed == ["[1/1] lr=1: step 60/100, loss 2.4000, 2.00k tok/s (1m05s so far)"]
  train_to(70)
  s._progress()  # the step moved: the rate is measured from here (start-up left out)
  assert printed[-1] == "[1/1] lr=1: step 70/100, loss 2.3000, 2.00k tok/s (1m05s so far)"
  s.first_seen["lr=1"] = (70, time.time() - 10)
  train_to(80)
  s._progress()
  assert re.fullmatch(r"\[1/1\] lr=1: step 80/100, loss 2\.2000, 2\.00k tok/s, ETA (19\.\d|20\.\d)s "
                      r"\(1m05s so far\)", printed[-1]), printed



def test_a_run_stopped_by_a_signal_before_it_has_a_workdir_is_reported(tmp_path):
  point = launcher.Point("lr=1", [("optim.lr", "1")], tmp_path / "run", tmp_path / "run.log", 100)
  printed = []
  s = launcher.Sweep(launcher.Args("c.py", [("optim.lr", ["1"])], tmp_path), [point], printed.append)
  s.running[0], s.signal = (point, None, time.time() - 3), "SIGTERM"
  s._finish(0, -15)
  assert s.stopped == ["lr=1"]
  assert re.fullmatch(r"\[1/1\] lr=1: stopped before its first step after \d+\.\ds; it resumes when "
                      r"the sweep runs again", printed[0]), printed

@pytest.mark.slow
def test_a_sweep_interrupted_and_run_again_continues(tiny_file, tmp_path):
  root = tmp_path / "sweep"
  argv = [f"--config={tiny_file}", "--sweep=optim.lr=1e-3,3e-3", "--sweep=model.n_layers=1",
          f"--root={root}", "--config.train.max_steps=600", "--config.train.eval_every=300",
          "--config.train.checkpoint_every=300", "--config.sample.num_samples=0"]
  first, second = root / "lr=1e-3_n_layers=1", root / "lr=3e-3_n_layers=1"
  proc = _sweep(*argv)
  _wait_for_a_train_line(first / "metrics.jsonl", proc)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 143, out
  assert "[1/2] lr=1e-3_n_layers=1: stopped at step" in out
  assert "run the same command again to continue" in out
  stopped = runs.read(first)
  assert stopped.state == "stopped" and 0 < stopped.step < 600
  assert not second.exists()  # no new run starts once the sweep is stopping

  proc = _sweep(*argv, "--progress_every_s=0.5")
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out
  assert "sweep: ran 2, skipped 0, failed 0" in out
  shown = re.findall(r"^\[2/2\] lr=3e-3_n_layers=1: step (\d+)/600, loss \d\.\d{4}, .* tok/s(, ETA "
                     r"\S+)? \(.* so far\)$", out, re.MULTILINE)
  assert shown, out  # the second run's progress while it ran
  assert not re.search(r"^ +\S+: (starting|step)", out, re.MULTILINE), out  # no stray lines
  log = (root / "logs" / f"{first.name}.log").read_text()
  assert f"resumed from checkpoint {first / 'checkpoints' / str(stopped.step)}" in log
  for workdir in (first, second):
    info = runs.read(workdir)
    assert info.finished and info.step == 600
    steps = [r["step"] for r in info.train]
    assert steps == sorted(set(steps))  # the resumed run's lines continue without repeats
  table = out[out.index("run "):]
  assert first.name in table and second.name in table and "best: " in table
  assert (root / "compare.md").exists() and (root / "loss_vs_step.png").exists()

  proc = _sweep(*argv)  # a third call: nothing left to do
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0 and "sweep: ran 0, skipped 2, failed 0" in out, out


@pytest.mark.slow
def test_a_failed_run_is_reported_and_the_status_is_non_zero(tiny_file, tmp_path):
  proc = _sweep(f"--config={tiny_file}", "--sweep=optim.lr=1e-3", f"--root={tmp_path / 's'}",
                f"--config.data.path={tmp_path / 'missing.txt'}")
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 1, out
  assert "[1/1] lr=1e-3: FAILED (exit status 2)" in out and "missing.txt" in out
  assert "failed 1" in out
  assert not (tmp_path / "s" / "compare.md").exists()  # the run never started: nothing to compare


def test_seeds_repeat_each_point_and_a_budget_compiles_every_variant_first(tiny_file, tmp_path,
                                                                          monkeypatch, capsys):
  argv = [f"--config={tiny_file}", "--sweep=model.mlp=swiglu,gelu", "--seeds=2",
          f"--root={tmp_path}", "--config.train.time_budget=30s", "--config.seed=5"]
  points = sweep.grid(sweep.parse(argv))
  assert [p.name for p in points] == ["mlp=swiglu_seed=5", "mlp=swiglu_seed=6",
                                      "mlp=gelu_seed=5", "mlp=gelu_seed=6"]
  assert all(p.budget and p.shape_known for p in points)
  ran = []
  monkeypatch.setattr(launcher.Sweep, "run", lambda self: ran.append(self.points))
  sweep.compile_ahead(sweep.parse(argv), points)
  (ahead,) = ran  # one compile a variant: the seeds of a point share its programs
  assert [(p.name, p.workdir, p.max_steps) for p in ahead] == [
      ("mlp=swiglu_seed=5", tmp_path / ".compile" / "mlp=swiglu_seed=5", 1),
      ("mlp=gelu_seed=5", tmp_path / ".compile" / "mlp=gelu_seed=5", 1)]
  cmd = launcher.command(sweep.parse(argv), ahead[0])
  assert cmd[cmd.index("--config.headless=True") + 1:] == ["--config.train.time_budget=",
                                                           "--config.train.max_steps=1"]
  assert "outside their budgets" in capsys.readouterr().out
  ran.clear()
  assert sweep.compile_ahead(sweep.parse([*argv, "--nocompile_ahead"]), points) is None and not ran
  with pytest.raises(UserError, match="--seeds=2: must be an integer >= 1, and not with --sweep=seed"):
    sweep.parse([*argv, "--sweep=seed=1,2"])


def test_a_budgeted_runs_progress_shows_the_steps_it_planned(tmp_path):
  point = launcher.Point("mlp=gelu", [("model.mlp", "gelu")], tmp_path / "run", tmp_path / "r.log",
                         1000, budget=True)  # the recipe's 1000 steps; the budget plans 487
  point.workdir.mkdir()
  (point.workdir / "run.json").write_text("{}")
  (point.workdir / "metrics.jsonl").write_text(json.dumps({"step": 40, "loss": 2.5}) + "\n")
  (point.workdir / "status.json").write_text(json.dumps({"state": "running", "step": 40,
                                                         "max_steps": 487}))
  assert launcher.progress(point) == (40, "step 40/487, loss 2.5000")
  assert not launcher.done(point)
  (point.workdir / "status.json").write_text(json.dumps({"state": "finished", "step": 487,
                                                         "max_steps": 487}))
  assert launcher.done(point)  # finished at its own end, short of the recipe's


def test_a_sweep_over_an_extensions_names_and_options_is_checked_before_any_run(tiny_file,
                                                                               tmp_path):
  window = str(ROOT / "examples" / "extend" / "window.py")
  points = sweep.grid(sweep.parse([
      f"--config={tiny_file}", f"--config.extend={window}", f"--root={tmp_path / 'sweep'}",
      "--sweep=model.attention_variant=causal,window", "--sweep=ext.window.size=8,16"]))
  assert [p.name for p in points] == [
      "attention_variant=causal_size=8", "attention_variant=causal_size=16",
      "attention_variant=window_size=8", "attention_variant=window_size=16"]
  with pytest.raises(UserError, match=r"^config\.model\.attention_variant: 'windwo' names no "
                     r"attention here \(built-in: causal; registered: (.*, )?window \("):
    sweep.grid(sweep.parse([f"--config={tiny_file}", f"--config.extend={window}",
                            f"--root={tmp_path / 'sweep'}",
                            "--sweep=model.attention_variant=window,windwo"]))
  assert not (tmp_path / "sweep").exists()  # nothing started
