"""A run that tells its story: the latest val loss beside the loss as it trains, the learning rate
under the loss curves, one summary at the end (best val and its step, tokens seen, where the time
went), and `--dry_run`: the plan of a run without running it."""

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
from conftest import ROOT, run_cli

import jaxtrain as jt
from jaxtrain.loop import preview, resolution
from jaxtrain.system.console import Console
from jaxtrain.system.errors import UserError
from jaxtrain.trackers import metrics_jsonl


def test_the_progress_line_shows_the_latest_val_loss_beside_the_loss(capsys):
  out = Console(headless=True)
  out.progress(5, 100, 2.5, 1e-3, 1000.0, 3.0, 60.0, "rss 1.00 GiB")
  out.progress(15, 100, 2.25, 1e-3, 1000.0, 4.0, 50.0, "rss 1.00 GiB", val=2.375)
  before, after = capsys.readouterr().out.splitlines()
  assert before.startswith("step      5/100 | loss 2.5000 | lr 1.00e-03 |")  # no eval yet
  assert after.startswith("step     15/100 | loss 2.2500 | val 2.3750 | lr 1.00e-03 |")


def test_the_loss_plot_has_the_learning_rate_below_the_losses(tmp_path):
  records = [{"step": s, "loss": 3.0 - s / 100, "lr": min(s, 20) * 1e-4} for s in range(5, 105, 5)]
  records += [{"step": s, "val_loss": 3.1 - s / 100} for s in (50, 100)]
  fig = metrics_jsonl.figure(records, "run")
  losses, lrs = fig.axes
  assert [line.get_label() for line in losses.get_lines()] == ["train", "validation"]
  assert list(lrs.get_lines()[0].get_ydata()) == [r["lr"] for r in records if "lr" in r]
  assert lrs.get_ylabel() == "learning rate" and lrs.get_xlabel() == "optimizer step"
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  png = metrics_jsonl.plot_losses(path, tmp_path / "loss.png")
  assert matplotlib.image.imread(png).shape[0] > 500  # two panels, one over the other


TINY = ["--config=configs/nano.py", "--jax_platforms=cpu", "--config.model.n_layers=2",
        "--config.model.d_model=32", "--config.model.n_heads=4", "--config.model.seq_len=32",
        "--config.train.batch_size=8", "--config.train.eval_steps=2", "--config.train.max_steps=20",
        "--config.train.eval_every=10", "--config.train.checkpoint_every=10",
        "--config.sample.num_samples=0", "--config.headless=True"]


@pytest.mark.slow
def test_a_dry_run_shows_the_config_memory_and_plan_and_writes_nothing(corpus_file, tmp_path):
  workdir = tmp_path / "run"
  args = [*TINY, f"--config.data.path={corpus_file}", f"--config.workdir={workdir}"]
  result = run_cli(*args, "--dry_run", timeout=600)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert out.startswith("config, resolved (* differs from the default):\n")
  assert "  model: " in out and re.search(r"\sd_model=32\*\s", out) and re.search(r"\smax_steps=20\*\s", out)
  assert "\nmemory per device: ~" in out and "\nmodel: " in out
  assert "\nplan: 20 steps x 256 tokens = 5.12k tokens (" in out
  assert "\nevaluations: 2 (every 10 steps and at step 20), each on 2 batches of 8 x 32 tokens" in out
  assert "\ncheckpoints: 2 (every 10 steps and at step 20)" in out
  assert out.endswith(f"dry run: nothing was compiled or trained, and nothing was written in "
                      f"{workdir}\n")
  assert not workdir.exists() and result.stderr == ""

  # A run's workdir: where a run would resume, and only the steps left; nothing in it changed.
  trained = run_cli(*args, "--config.train.max_steps=10")
  assert trained.returncode == 0, trained.stderr[-2000:]
  before = sorted((p, p.stat().st_mtime_ns) for p in workdir.rglob("*"))
  result = run_cli(*args, "--dry_run", "--config.train.time_budget=2m", timeout=600)
  assert result.returncode == 0, result.stderr
  assert f"resume: a run would resume from the checkpoint of step 10 in {workdir}" in result.stdout
  assert "plan: train.time_budget=2m: the steps are decided at run time" in result.stdout
  assert sorted((p, p.stat().st_mtime_ns) for p in workdir.rglob("*")) == before


@contextlib.contextmanager
def _memory_cgroup(limit: int):
  """A memory cgroup below this process's, with `limit`; skipped where none can be made."""
  from jaxtrain.system import machine

  for version, directory, _ in machine._cgroup_dirs(Path("/")):
    child = directory / f"jaxtrain-test-{os.getpid()}"
    try:
      child.mkdir()
    except OSError:
      continue
    try:
      (child / machine._FILES[version][0]).write_text(str(limit))
    except OSError:
      child.rmdir()
      continue
    try:
      yield child
    finally:
      child.rmdir()
    return
  pytest.skip("no memory cgroup can be made here (needs root and a writable cgroup file system)")


@pytest.mark.slow
def test_the_memory_estimate_names_the_containers_limit(corpus_file, tmp_path):
  # A run under a 3 GiB limit on a host with much more RAM was killed (137) with no warning.
  big = ["--config.model.d_model=512", "--config.model.n_heads=8", "--config.model.seq_len=1024",
         "--config.model.n_layers=8", "--config.train.batch_size=64"]
  with _memory_cgroup(3 << 30) as group:
    # The shell joins the group, then becomes the run (no fork in this process, which runs JAX).
    result = subprocess.run(
        ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), sys.executable,
         "-m", "jaxtrain", *TINY, f"--config.data.path={corpus_file}",
         f"--config.workdir={tmp_path / 'run'}", *big, "--dry_run"], cwd=ROOT, text=True,
        capture_output=True, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
  assert result.returncode == 0, result.stderr
  line = next(x for x in result.stdout.splitlines() if x.startswith("memory per device"))
  assert re.search(r"; [\d.]+ (GiB|MiB) free of the 3\.00 GiB container memory limit \(cgroup "
                   r"v[12] memory\.(max|limit_in_bytes)\)$", line), line
  warning = next(x for x in result.stdout.splitlines() if x.startswith("WARNING"))
  assert "container memory limit" in warning and "be killed (exit status 137)" in warning


@pytest.mark.slow
def test_a_check_in_the_resolution_refuses_the_run_and_the_dry_run_alike(tiny, monkeypatch):
  """Both resolve a run the one way (loop/resolution.py): a check added there fires in both, and
  the run's claim on its workdir leaves nothing behind."""
  def describe_or_refuse(out, cfg, corpus, built):
    if built.model_cfg.d_model < 64:
      raise UserError(f"model.d_model={built.model_cfg.d_model}: refused by a new check")
    return describe(out, cfg, corpus, built)

  describe = resolution.describe
  monkeypatch.setattr(resolution, "describe", describe_or_refuse)
  for attempt in (preview.dry_run, lambda cfg: jt.run(cfg, show_progress=False)):
    with pytest.raises(UserError, match="model.d_model=32: refused by a new check"):
      attempt(tiny)
    assert not Path(tiny.workdir).exists()
