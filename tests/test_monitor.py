"""The loop's small stateful parts, driven directly, and hooks that end real runs."""

import json
import math
import os
import time

import pytest

import jaxtrain as jt
from jaxtrain.checkpoints.lifecycle import BestVal
from jaxtrain.loop.step_metrics import NonFiniteGuard
from jaxtrain.measure.speed import Throughput
from jaxtrain.system.errors import NonFiniteLoss


def test_throughput_times_only_training_and_gives_mfu_and_eta():
  peaks = []
  meter = Throughput(tokens_per_step=1000, flops_per_token=6.0,
                     peak=lambda achieved: peaks.append(achieved) or 12000.0)
  assert not meter.started and meter.read(1, 5.0) is None
  meter.start(step=1, now=10.0)
  speed = meter.read(step=11, now=15.0)  # 10 steps in 5 s
  assert speed.sec_per_step == 0.5 and speed.tokens_per_sec == 2000.0
  assert speed.flops_per_sec == 12000.0 and speed.mfu == 1.0 and speed.eta_s(100 - 11) == 89 * 0.5
  meter.skip_time(now=115.0)  # 100 s of evaluation and saving: not training time
  speed = meter.read(step=21, now=116.0)
  assert speed.sec_per_step == 0.1 and speed.eta_s(100 - 21) == pytest.approx(79 * 0.1)
  assert meter.read(step=21, now=200.0) is speed  # no new step: the last reading
  assert peaks == [12000.0]  # the peak is measured once, told what the steps ran at


def test_throughput_without_a_peak_has_no_mfu():
  meter = Throughput(100, 6.0)
  meter.start(0, 0.0)
  assert meter.read(2, 1.0).mfu is None


def _micro(loss: float, grad_norm: float, skipped: int = 0, scale: float = 1.0) -> list[dict]:
  return [{"loss": loss, "grad_norm": grad_norm, "skipped": skipped, "loss_scale": scale}]


def test_nonfinite_guard_stops_drops_or_counts():
  guard = NonFiniteGuard(skip_nonfinite=False, loss_scaling=False)
  assert guard.check(1, _micro(2.0, 1.0) + _micro(4.0, 3.0)) == (3.0, 2.0, None)
  with pytest.raises(NonFiniteLoss, match="loss nan at step 2: stopped") as e:
    guard.check(2, _micro(math.nan, 1.0))
  assert e.value.exit_code == 3

  skipping = NonFiniteGuard(skip_nonfinite=True, loss_scaling=False, max_in_a_row=3)
  _, _, note = skipping.check(5, _micro(1.0, math.inf, skipped=1))
  assert note == "step 5: gradient norm inf, update dropped (1 dropped so far)"
  skipping.check(6, _micro(1.0, 1.0))  # a good step resets the count
  skipping.check(7, _micro(math.nan, 1.0, skipped=2))
  skipping.check(8, _micro(math.nan, 1.0, skipped=3))
  with pytest.raises(NonFiniteLoss, match="3 steps in a row up to step 9"):
    skipping.check(9, _micro(math.nan, 1.0, skipped=4))


def test_loss_scaling_overflow_is_dropped_but_a_nan_loss_is_not():
  guard = NonFiniteGuard(skip_nonfinite=False, loss_scaling=True)
  _, _, note = guard.check(3, _micro(2.0, math.inf, scale=16384.0))
  assert note == "step 3: gradients overflowed; step dropped, loss scale now 16384"
  with pytest.raises(NonFiniteLoss):
    guard.check(4, _micro(math.nan, math.inf))


def test_best_val_tracks_the_lowest_and_evaluations_since():
  best = BestVal()
  assert best.value is None
  assert best.update(3.0) and not best.update(3.5) and not best.update(3.0)
  assert best.value == 3.0 and best.since == 2
  assert best.update(2.0) and best.since == 0
  assert BestVal(1.5).value == 1.5


class _StopAfterEvals(jt.Hook):
  """What an early-stopping feature looks like from outside the loop."""

  def __init__(self, n: int):
    self.n, self.logged, self.evals = n, [], []

  def on_log(self, step: int, record: dict) -> None:
    self.logged.append(step)

  def on_eval(self, step: int, record: dict) -> None:
    self.evals.append((step, record["val_loss"]))

  def stop_reason(self) -> str | None:
    return f"{self.n} evaluations done" if len(self.evals) >= self.n else None


class _StopAtCall(jt.Hook):
  """Stops on a step that is neither logged nor evaluated (as a time budget would)."""

  def __init__(self, n: int):
    self.calls, self.n = 0, n

  def stop_reason(self) -> str | None:
    self.calls += 1
    return "out of time" if self.calls >= self.n else None


def _logged_steps(workdir: str) -> list[int]:
  return [json.loads(line)["step"] for line in open(f"{workdir}/metrics.jsonl")
          if "loss" in json.loads(line)]


@pytest.mark.slow
def test_a_hook_sees_the_records_and_ends_the_run_right_after_them(tiny):
  tiny.sample.num_samples = 0
  tiny.train.max_steps = 100  # eval and checkpoint every 10, log every 5
  hook = _StopAfterEvals(1)
  result = jt.run(tiny, show_progress=False, hooks=[hook])
  assert result.step == 10 and result.exit_code == 0 and result.stopped_by is None
  assert hook.evals[0][0] == 10 and hook.logged == [5, 10]
  assert jt.Checkpoints(tiny.workdir, read_only=True).latest_step() == 10


@pytest.mark.slow
def test_a_hook_stop_on_any_step_saves_and_logs_that_step(tiny):
  tiny.sample.num_samples = 0
  tiny.train.max_steps = 100
  result = jt.run(tiny, show_progress=False, hooks=[_StopAtCall(13)])
  assert result.step == 13 and result.exit_code == 0
  assert jt.Checkpoints(tiny.workdir, read_only=True).latest_step() == 13
  assert _logged_steps(tiny.workdir) == [5, 10, 13]
  result = jt.run(tiny, show_progress=False, hooks=[_StopAtCall(4)])  # resumes at 13
  assert result.step == 17 and _logged_steps(tiny.workdir) == [5, 10, 13, 15, 17]


def test_the_library_log_keeps_library_messages_out_of_the_terminal(tmp_path, capsys):
  import logging
  import sys
  import threading
  import warnings

  from absl import logging as absl_logging

  from jaxtrain.system.console import LibraryLog

  hooks = (sys.unraisablehook, threading.excepthook)
  with LibraryLog(tmp_path / "logs" / "process_0.log") as log:
    absl_logging.error("orbax says: write failed")
    warnings.warn("a compile-cache entry could not be written", stacklevel=1)
    thread = threading.Thread(target=lambda: 1 / 0, name="saver")
    thread.start()
    thread.join()
  assert (sys.unraisablehook, threading.excepthook) == hooks  # put back
  text = log.path.read_text()
  assert "orbax says: write failed" in text and "compile-cache entry" in text
  assert "ZeroDivisionError" in text and "saver" in text
  assert log.errors == 2  # the absl error and the thread's exception
  captured = capsys.readouterr()
  assert "orbax says" not in captured.err and "ZeroDivisionError" not in captured.err
  logging.getLogger("after").warning("back to normal")  # the handlers are restored


def _cache(tmp_path, monkeypatch):
  """This test's own cache dir, in a process that has measured nothing yet."""
  from jaxtrain.system import measured

  monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path))
  monkeypatch.delenv(measured.AGAIN, raising=False)
  monkeypatch.setattr(measured, "_here", {})
  return tmp_path / measured.FILE


def _age(file, value, load: float, age_s: float) -> None:
  """Each record of `file` set to `value`, measured `age_s` ago with `load` of the cores busy."""
  cached = json.loads(file.read_text())
  for entry in cached.values():
    entry.update(value=value, load=load, time=time.time() - age_s)
  file.write_text(json.dumps(cached))


def test_a_figure_measured_on_busy_cores_is_measured_again_a_quiet_one_is_reused(tmp_path,
                                                                                 monkeypatch):
  # A figure taken while other processes kept the cores busy (the load it was stored with) would
  # misstate every later run: the next process measures again. JAXTRAIN_MEASURE_AGAIN=1 does it
  # for every figure.
  from jaxtrain.system import measured

  file = _cache(tmp_path, monkeypatch)
  calls = []
  measure = lambda _: calls.append(1) or len(calls)  # noqa: E731
  assert measured.measured("probe", ["x"], measure).value == 1
  assert measured.measured("probe", ["x"], measure).value == 1  # this process's: kept
  _age(file, 0, load=0.9, age_s=60)  # taken while 90% of the cores were busy
  monkeypatch.setattr(measured, "_here", {})  # another process
  again = measured.measured("probe", ["x"], measure)
  assert again.value == 2 and again.here and calls == [1, 1]
  (entry,) = json.loads(file.read_text()).values()
  assert entry["value"] == 2 and "load" in entry and entry["time"] > time.time() - 60
  _age(file, 0, load=0.05, age_s=7200)  # quiet
  monkeypatch.setattr(measured, "_here", {})
  reused = measured.measured("probe", ["x"], measure)
  assert reused.value == 0 and not reused.here and len(calls) == 2
  assert reused.said() == "2h00m ago, reused from the cache"
  busy = measured.Measured(1.0, time.time(), 0.9, here=True)
  assert busy.said() == ("just now, while other processes kept 90% of the cores busy (the next run "
                         "measures again)")
  monkeypatch.setenv(measured.AGAIN, "1")
  monkeypatch.setattr(measured, "_here", {})
  assert measured.measured("probe", ["x"], measure).value == 3  # measured again, though quiet
  assert measured.measured("probe", ["x"], measure).value == 3  # once a process


def test_a_cached_peak_below_what_a_run_reached_is_measured_again(tmp_path, monkeypatch):
  # A peak measured while the machine was busy would make every run's MFU read over 100%.
  from jaxtrain.measure import estimate

  file = _cache(tmp_path, monkeypatch)
  estimate.matmul_peak(n=256, repeats=1)
  _age(file, 1e3, load=0.0, age_s=0)
  monkeypatch.setattr("jaxtrain.system.measured._here", {})
  assert estimate.matmul_peak(n=256, repeats=1).value == 1e3  # fresh and quiet: reused
  peak = estimate.matmul_peak(n=256, repeats=1, at_least=1e6).value
  assert peak > 1e6  # measured: any CPU multiplies faster than a MFLOP/s
  assert [e["value"] for e in json.loads(file.read_text()).values()] == [peak]


def test_a_cached_peak_is_measured_again_when_what_it_depends_on_changes(tmp_path, monkeypatch):
  # A peak measured under other XLA flags, another jax or a week ago would misstate every MFU.
  import jax

  from jaxtrain.measure import estimate

  file = _cache(tmp_path, monkeypatch)
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  estimate.matmul_peak(n=256, repeats=1)
  (name,) = json.loads(file.read_text())
  assert f"-jax{jax.__version__}-" in name and f"of{os.cpu_count()}-" in name
  _age(file, 1e3, load=0.0, age_s=60)
  monkeypatch.setattr("jaxtrain.system.measured._here", {})
  assert estimate.matmul_peak(n=256, repeats=1).value == 1e3
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
  assert estimate.matmul_peak(n=256, repeats=1).value > 1e6  # another key: measured
  monkeypatch.delenv("XLA_FLAGS")
  _age(file, 1e3, load=0.0, age_s=8 * 24 * 3600)
  monkeypatch.setattr("jaxtrain.system.measured._here", {})
  assert estimate.matmul_peak(n=256, repeats=1).value > 1e6  # too old: measured again


def test_the_speed_line_says_whether_the_peak_was_reused_or_measured(tmp_path, monkeypatch):
  import jax

  from jaxtrain.measure import estimate

  file = _cache(tmp_path, monkeypatch)
  estimate.matmul_peak("bfloat16", n=2048, repeats=1)  # measured by this process
  _, said = estimate.peak_flops(jax.devices()[:1], "bfloat16")
  assert ", bfloat16 matmul measured on this cpu just now" in said, said
  _age(file, 2e12, load=0.1, age_s=7200)
  monkeypatch.setattr("jaxtrain.system.measured._here", {})
  _, said = estimate.peak_flops(jax.devices()[:1], "bfloat16")
  assert said == "2000.00GFLOP/s x 1, bfloat16 matmul measured on this cpu 2h00m ago, reused from the cache"
