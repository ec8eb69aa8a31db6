"""`train.time_budget`: a run trains for a wall time, ends near it, and resumes exactly."""

import json
import shutil
import subprocess
import sys
import time

import killharness as kh
import pytest
from conftest import ROOT

import jaxtrain as jt
from jaxtrain.config import validate
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


def test_the_steps_that_fit_count_evaluations_and_what_is_spent(tiny):
  t = tiny.train  # eval every 10 steps, 2 batches: 0.35 * 2 / 10 = 7% on top of each step
  assert budget.fit_steps(100, 10, 5, 0.1, t) == int((100 - 10 - 5 - budget.END_S) / 0.107)
  assert budget.fit_steps(10, 30, 5, 0.1, t) == 1  # spent already: one step, not none


class _StopAt(Hook):
  """Stops the run at `step` (a log line comes a step late; the step itself is queued at once)."""

  def __init__(self, step: int):
    self.step, self.now = step, 0

  def on_step(self, step, state):
    self.now = step

  def stop_reason(self):
    return "asked by the test" if self.now >= self.step else None


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
  plan = budget.Plan(100.0, [[0, 1000]], spent=lambda: 40.0, close_s=5.0, compile_s=5.0)
  assert budget.new_end(plan, 0, now=10.0) is None  # the leg's first step: the pace starts here
  assert budget.new_end(plan, 200, now=12.0) is None  # before 30% of the steps
  # 300 steps in 3 s: 10 ms a step; 100 - 40 - 5 - 5 = 50 s left: 5000 more steps
  assert budget.new_end(plan, 300, now=13.0) == 300 + 5000
  plan.ends.append([300, 5300])
  assert budget.new_end(plan, 1000, now=20.0) is None  # 70% not reached
  plan.spent = lambda: 90.0 - 0.2  # 0.2 s left for the steps: 0.2 / 0.01 = 20 steps, ends at 3730
  assert budget.new_end(plan, 3710, now=47.1) == 3710 + 20
  assert budget.new_end(plan, 3720, now=47.2) is None  # measured at both points already
  # 50 ms a step, 100 - 55.5 - 5 - 5 = 34.5 s left: 690 more steps, 1% short of 1000
  steady = budget.Plan(100.0, [[0, 1000]], spent=lambda: 55.5, close_s=5.0, compile_s=5.0)
  budget.new_end(steady, 0, now=0.0)
  assert budget.new_end(steady, 300, now=15.0) is None  # within 2%: not worth a compile


def test_a_resume_from_before_a_moved_end_trains_as_the_run_did(tiny, tmp_path, monkeypatch):
  # The end is moved at step 4 (the real one is moved by the measured pace); a second run is
  # stopped at 6 and its checkpoint 6 lost, so it resumes at 3: before the move, which it replays.
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 8)
  monkeypatch.setattr(budget, "new_end",
                      lambda plan, step, now: 12 if plan.spent and step == 4 else None)
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


def test_a_given_max_steps_is_said_to_be_unused(tiny, monkeypatch, capsys):
  monkeypatch.setattr(budget, "fit_steps", lambda *args: 2)
  monkeypatch.setattr(budget, "new_end", lambda plan, step, now: None)
  tiny.train.time_budget, tiny.sample.num_samples = "1h", 0
  assert jt.run(tiny, explicit=("train.max_steps",)).step == 2
  assert "note: train.time_budget=1h sets the steps; the given train.max_steps is not used" in \
      capsys.readouterr().out


@pytest.mark.slow
def test_the_command_ends_near_its_budget(corpus_file, tmp_path):
  args = [a for a in kh.cli_args(tmp_path / "run", corpus_file, 1) if "max_steps" not in a]
  t0 = time.time()
  res = subprocess.run([sys.executable, "-m", "jaxtrain", *args, "--config.train.time_budget=45s",
                        "--config.train.eval_every=100", "--config.train.log_every=10",
                        "--config.train.checkpoint_every=100"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  wall = time.time() - t0
  assert res.returncode == 0, res.stderr[-2000:]
  assert "time budget 45.0s: train.max_steps=" in res.stdout
  assert "note: train.time_budget" not in res.stdout  # no train.max_steps was given
  steps = json.loads((tmp_path / "run" / "config.json").read_text())["train"]["max_steps"]
  assert f"done: step {steps} " in res.stdout and steps > 10
  assert 0.85 * 45 <= wall <= 1.15 * 45, (wall, res.stdout[-1500:])
