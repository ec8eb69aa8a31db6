"""`train.time_budget`: a run trains for a wall time, ends near it, and resumes exactly."""

import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import killharness as kh
import numpy as np
import pytest
from conftest import ROOT

import jaxtrain as jt
from jaxtrain.config import validate
from jaxtrain.core import optim
from jaxtrain.loop import budget
from jaxtrain.system import fmt
from jaxtrain.system.errors import ConfigError
from jaxtrain.testing import assert_trees_equal
from jaxtrain.trackers.hooks import Hook


def test_durations_parse_and_bad_ones_are_named(tiny):
  assert [fmt.parse_duration(x) for x in ("90", "90s", "10m", "1h30m", "1.5h", " 2M ")] == \
      [90, 90, 600, 5400, 5400, 120]
  for bad in ("", "0", "-1", "1e9", "nan", "ten minutes", "5x", "m"):
    assert fmt.parse_duration(bad) is None, bad
  for bad in ("10 minutes", "0s", "31d"):
    tiny.train.time_budget = bad
    with pytest.raises(ConfigError, match="train.time_budget"):
      validate.validate(tiny)


def test_the_steps_that_fit_count_evaluations_saves_and_the_end(tiny):
  t = tiny.train  # eval and save every 10 steps: 0.5 / 10 + 0.2 / 10 = 0.07 s on each 0.1 s step
  costs = budget.Costs(step_s=0.1, eval_s=0.5, save_s=0.2, last_save_s=0.3, sample_s=1.0)
  assert costs.close_s() == 0.5 + 0.3 + 1.0 + budget.END_S
  assert budget.fit_steps(90, costs, t) == int((90 - costs.close_s()) / 0.17)
  assert budget.fit_steps(2.0, costs, t) == 0  # not even one step: fit says so, and fit's caller


class _StopAt(Hook):
  """Stops the run at `step` (a log line comes a step late; the step itself is queued at once)."""

  def __init__(self, step: int):
    self.step, self.now = step, 0

  def on_step(self, step, state):
    self.now = step

  def stop_reason(self):
    return "asked by the test" if self.now >= self.step else None


@pytest.mark.slow
def test_a_budgeted_run_resumes_to_the_steps_it_chose_bit_for_bit(tiny, tmp_path, monkeypatch):
  # The number the measurement gives depends on the machine's load; what must hold for any
  # number is that it is the run's from then on.
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 8)
  tiny.train.time_budget = "1h"
  tiny.train.log_every = 1
  tiny.sample.num_samples = 0
  first = jt.run(tiny, show_progress=False, hooks=(_StopAt(3),))
  chosen = json.loads((tmp_path / "run" / "config.json").read_text())["train"]["max_steps"]
  assert first.step == 3 and chosen == 8 and tiny.train.max_steps == 20  # the caller's config stays
  done = jt.run(tiny, show_progress=False)
  assert done.step == chosen
  plain = tiny.copy_and_resolve_references()
  plain.train.time_budget, plain.train.max_steps = "", chosen
  plain.workdir = str(tmp_path / "plain")
  jt.run(plain, show_progress=False)
  assert_trees_equal(jt.load_state(tiny.workdir).params, jt.load_state(plain.workdir).params)


def test_the_end_the_pace_gives(tiny):
  plan, pace = budget.Plan(((0, 1000),), 100.0, close_s=10.0, moves=True), budget.Pace()
  end = lambda step, now, spent_s=40.0: budget.new_end(plan, pace, step, now, spent_s)  # noqa: E731
  assert end(0, now=10.0) is None  # the leg's first step: the pace starts here
  assert end(200, now=12.0) is None  # before 30% of the steps
  # 300 steps in 3 s: 10 ms a step; 100 - 40 - 10 = 50 s left: 5000 more steps
  assert end(300, now=13.0) == 300 + 5000
  plan = plan.moved(300, 5300)
  assert end(2000, now=30.0) is None  # 50% of the new end not reached
  # 0.2 s left for the steps: 0.2 / 0.01 = 20 steps, ends at 3730
  assert end(3710, now=47.1, spent_s=90.0 - 0.2) == 3710 + 20
  plan = plan.moved(3710, 3730)
  assert plan.ends == ((0, 1000), (300, 5300), (3710, 3730)) and plan.final == 3730
  # On pace at 70% and at 85% of 3730: 3731 and 3740 are within 2% of it
  assert end(3711, now=47.11, spent_s=89.8) is None and end(3720, now=47.2, spent_s=89.8) is None
  assert pace.checked == 4
  # 50 ms a step, 100 - 55.5 - 10 = 34.5 s left: 690 more steps, 1% short of 1000
  steady, pace = budget.Plan(((0, 1000),), 100.0, close_s=10.0, moves=True), budget.Pace()
  budget.new_end(steady, pace, 0, 0.0, 55.5)
  assert budget.new_end(steady, pace, 300, 15.0, 55.5) is None  # within 2%: the schedule stays
  # A resumed leg follows the recorded ends: its pace never moves them.
  assert budget.new_end(budget.Plan(((0, 1000),), 100.0), budget.Pace(), 300, 1.0, 99.0) is None


def _lrs(schedule: str, ends: list[list[int]], **optim_fields) -> np.ndarray:
  """The learning rate of each step of a run that follows `ends`, as the loop sets them."""
  o = optim.Optimizer(lr=1.0, min_lr_ratio=0.0, warmup_steps=10, decay_steps=0, weight_decay=0.0,
                      clip_norm=0.0, b1=0.9, b2=0.95, eps=1e-8, max_steps=ends[0][1],
                      schedule=schedule, decay_fraction=1.0, **optim_fields)
  return np.array([float(optim.lr_schedule(o, o.max_steps, args=budget.schedule_at(ends, s, o))(s))
                   for s in range(ends[-1][1])])


def test_a_moved_end_decays_the_schedule_from_where_it_is():
  # wsd straight to 0 over steps 10..100; at step 70 the end moves to 80 (or out to 150). The
  # lr goes on from where it was, then straight down to 0 at the new end: each step's drop is the
  # re-fitted line's, lr(70) / 10 (or lr(70) / 80), never more.
  for new_end in (80, 150):
    lrs = _lrs("wsd", [[0, 100], [70, new_end]])
    np.testing.assert_allclose(lrs[:70], _lrs("wsd", [[0, 100]])[:70], rtol=0, atol=0)
    line = lrs[70] / (new_end - 70)
    assert abs(lrs[70] - _lrs("wsd", [[0, 100]])[70]) < 1e-6  # no jump where the end moved
    drops = -np.diff(lrs)
    assert drops.max() <= max(line, 1 / 90) * (1 + 1e-4), (new_end, drops.max(), line)
    np.testing.assert_allclose(lrs[70:], lrs[70] - line * np.arange(new_end - 70), atol=1e-6)
  # A schedule for the new end from the start would be at 0.14 at step 70: 0.33 -> 0.14 at once.
  fresh = _lrs("wsd", [[0, 80]])
  assert fresh[69] - fresh[70] < 0.02 and _lrs("wsd", [[0, 100]])[69] - fresh[70] > 0.15
  # Cosine, moved twice: the rest of the cosine, squeezed; its steepest slope, (pi / 2) / 90 a step,
  # grows by how much the steps left shrank at each move, and no more.
  lrs = _lrs("cosine", [[0, 100], [40, 70], [60, 64]])
  slope = np.pi / 2 / 90 * (60 / 30) * (70 - 60) / (64 - 60) * (100 - 40) / (70 - 40)
  assert -np.diff(lrs).max() <= slope / 2 * (1 + 1e-4)  # (a squeeze also starts past the top)
  assert lrs[-1] < 0.02 and abs(lrs[40] - _lrs("cosine", [[0, 100]])[40]) < 1e-6


@pytest.mark.slow
def test_a_resume_from_before_a_moved_end_trains_as_the_run_did(tiny, tmp_path, monkeypatch):
  # The end is moved at step 4 (the real one is moved by the measured pace); a second run is
  # stopped at 6 and its checkpoint 6 lost, so it resumes at 3: before the move, which it replays.
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 8)
  monkeypatch.setattr(budget, "new_end",
                      lambda plan, pace, step, now, spent_s: 12 if plan.moves and step == 4 else None)
  tiny.train.time_budget, tiny.train.log_every = "1h", 1
  tiny.train.checkpoint_every, tiny.train.eval_every, tiny.train.keep_checkpoints = 3, 3, 10
  tiny.sample.num_samples = 0
  whole = tiny.copy_and_resolve_references()
  whole.workdir = str(tmp_path / "whole")
  assert jt.run(whole, show_progress=False).step == 12
  assert json.loads((tmp_path / "whole" / budget.PLAN_FILE).read_text())["ends"] == [[0, 8], [4, 12]]
  assert json.loads((tmp_path / "whole" / "config.json").read_text())["train"]["max_steps"] == 12
  assert jt.run(tiny, show_progress=False, hooks=(_StopAt(6),)).step == 6
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "6")
  assert jt.run(tiny, show_progress=False).step == 12
  assert_trees_equal(jt.load_state(whole.workdir).params, jt.load_state(tiny.workdir).params)


@pytest.mark.slow
def test_a_given_max_steps_is_said_to_be_unused(tiny, monkeypatch, capsys):
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 2)
  monkeypatch.setattr(budget, "new_end", lambda *args: None)
  tiny.train.time_budget, tiny.sample.num_samples = "1h", 0
  assert jt.run(tiny, explicit=("train.max_steps",)).step == 2
  assert "note: train.time_budget=1h sets the steps; the given train.max_steps is not used" in \
      capsys.readouterr().out


@pytest.mark.slow
def test_a_budget_too_short_for_a_step_says_what_it_needs(tiny, tmp_path, monkeypatch):
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 0)
  tiny.train.time_budget = "20s"
  with pytest.raises(ConfigError, match=r"config.train.time_budget: 20s is too short for this run: "
                     r"it needs at least \d+\.\ds \(.* to start and compile, .* ms a step, .* to "
                     r"evaluate, save and sample at the end\); pass --config.train.time_budget=\d+s"):
    jt.run(tiny, show_progress=False)
  assert not (tmp_path / "run").exists()  # nothing of a run that never started is left


@pytest.mark.slow
def test_the_command_says_up_front_when_starting_up_used_the_budget(tmp_path, corpus_file):
  res = subprocess.run([sys.executable, "-m", "jaxtrain", "--config=configs/shakespeare_char.py",
                        f"--config.data.path={corpus_file}", f"--config.workdir={tmp_path / 'run'}",
                        "--jax_platforms=cpu", "--config.train.time_budget=0.1s"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode == 2, res.stderr[-2000:]
  assert "config.train.time_budget: 0.1s is too short: starting up, before any compile, took" \
      in res.stderr
  assert not (tmp_path / "run").exists()


class _Compiles:
  """The programs compiled (or read from the compile cache) while it listens, with the step the
  run was at and the thread that compiled them."""

  def __init__(self, at: Hook):
    self.at, self.seen = at, []

  def __call__(self, event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      self.seen.append((kwargs.get("fun_name", "?"), self.at.now, threading.current_thread().name))


@pytest.mark.slow
def test_a_budgeted_run_compiles_its_steps_once_before_it_measures(tiny, monkeypatch):
  # The measurement's train step is the run's, whatever end the plan and a moved end give; the
  # eval step and the samples' programs are compiled beside it, none after the first step.
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 8)
  monkeypatch.setattr(budget, "new_end",
                      lambda plan, pace, step, now, spent_s: 12 if plan.moves and step == 4 else None)
  tiny.train.time_budget, tiny.train.eval_every = "1h", 5
  at = _StopAt(10**9)
  compiles = _Compiles(at)
  jax.monitoring.register_event_duration_secs_listener(compiles)
  try:
    assert jt.run(tiny, show_progress=False, hooks=(at,)).step == 12
  finally:
    jax.monitoring.unregister_event_duration_listener(compiles)
  names = [name for name, _, _ in compiles.seen]
  assert names.count("jit(train_step)") == 1, compiles.seen
  late = {name for name, step, _ in compiles.seen if step > 0}
  assert not late & {"jit(train_step)", "jit(eval_step)", "jit(_prefill)", "jit(_decode)"}, late


@pytest.mark.slow
def test_what_the_end_of_a_run_runs_compiles_while_it_trains(tiny):
  # On a CPU, the eval step, the checksums and the samples' programs compile in a thread of their
  # own once the first speed reading is out (warmup.Ahead); the loop's thread compiles none.
  tiny.train.max_steps, tiny.train.log_every, tiny.train.eval_every = 12, 2, 12
  tiny.model.d_model, tiny.model.n_heads = 24, 2  # a shape of its own: none compiled in this process
  at = _StopAt(10**9)
  compiles = _Compiles(at)
  jax.monitoring.register_event_duration_secs_listener(compiles)
  try:
    assert jt.run(tiny, show_progress=False, hooks=(at,)).samples
  finally:
    jax.monitoring.unregister_event_duration_listener(compiles)
  end = {"jit(eval_step)", "jit(_prefill)", "jit(_decode)"}  # a small state's checksums: numpy's
  where = [(name, thread) for name, _, thread in compiles.seen if name in end | {"jit(_survey)"}]
  assert sorted(name for name, _ in where) == sorted(end), compiles.seen  # each once
  assert {thread for _, thread in where} == {"jaxtrain-ahead_0"}, compiles.seen


@pytest.mark.slow
def test_a_budgeted_run_stopped_past_the_unused_max_steps_says_how_to_resume(tmp_path, corpus_file):
  """The budget sets the steps, so a stop past the given train.max_steps still leaves a run to
  resume, and the command says how."""
  run = kh.Run([*kh.cli_args(tmp_path / "run", corpus_file, 2), "--config.train.time_budget=10m"])
  deadline = time.time() + 240
  while not any(line.startswith("step      5/") for line in run.lines):
    assert run.proc.poll() is None and time.time() < deadline, run.text()
    time.sleep(0.05)
  run.proc.send_signal(signal.SIGTERM)
  assert run.wait(120) == 143, run.text()
  stopped = int(run.text().split("SIGTERM: stopped at step ")[1].split(";")[0])
  assert stopped > 2 and "\nto resume: python -m jaxtrain " in run.text(), run.text()
