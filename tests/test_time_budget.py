"""`train.time_budget`: a run trains for a wall time, ends near it, and resumes exactly."""

import json
import subprocess
import sys
import time

import killharness as kh
import pytest
from conftest import ROOT

import jaxtrain as jt
from jaxtrain.config import validate as validation
from jaxtrain.loop import budget
from jaxtrain.loop.hooks import Hook
from jaxtrain.system import fmt
from jaxtrain.system.errors import ConfigError
from jaxtrain.testing import assert_trees_equal


def test_durations_parse_and_bad_ones_are_named(tiny):
  assert [fmt.parse_duration(x) for x in ("90", "90s", "10m", "1h30m", "1.5h", " 2M ")] == \
      [90, 90, 600, 5400, 5400, 120]
  for bad in ("", "0", "-1", "1e9", "nan", "ten minutes", "5x", "m"):
    assert fmt.parse_duration(bad) is None, bad
  for bad in ("10 minutes", "0s", "31d"):
    tiny.train.time_budget = bad
    with pytest.raises(ConfigError, match="train.time_budget"):
      validation.validate(tiny)


def test_the_steps_that_fit_count_evaluations_and_what_is_spent(tiny):
  t = tiny.train  # eval every 10 steps, 2 batches: 0.35 * 2 / 10 = 7% on top of each step
  assert budget.fit_steps(100, 10, 5, 0.1, t) == int((100 - 10 - 5 - budget.END_S) / 0.107)
  assert budget.fit_steps(10, 30, 5, 0.1, t) == 1  # spent already: one step, not none


class _StopAt(Hook):
  def __init__(self, step: int):
    self.step, self.now = step, 0

  def on_log(self, step, record):
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
  steps = json.loads((tmp_path / "run" / "config.json").read_text())["train"]["max_steps"]
  assert f"done: step {steps} " in res.stdout and steps > 10
  assert 0.85 * 45 <= wall <= 1.15 * 45, (wall, res.stdout[-1500:])
