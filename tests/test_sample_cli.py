"""After training: early stopping, `python -m jaxtrain.sample` and `python -m jaxtrain.export` on
the run it leaves (also with --step=best, and `jt.load_state(workdir, step="best")`), `init_from`
starting a new run from it, and their one-line refusals of bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, run_cli
from test_cli import TINY
from test_export import make_run

import jaxtrain as jt
from jaxtrain.checkpoints import load, store
from jaxtrain.system.errors import UserError
from jaxtrain.testing import tiny_config


def module(name: str, *args: str, stdin: str | None = None):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  return subprocess.run([sys.executable, "-m", name, "--jax_platforms=cpu", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300, input=stdin)


def one_line_error(proc, *words: str) -> None:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert lines and lines[-1].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
  for word in words:
    assert word in lines[-1], lines[-1]


@pytest.mark.slow
def test_early_stop_then_sample_export_and_fine_tune(corpus_file, tmp_path):
  run = tmp_path / "run"
  # lrs of 1e-30 leave the params as they are: the val loss never improves after the first eval.
  common = ["--config=configs/nano.py", "--jax_platforms=cpu", *TINY,
            f"--config.data.path={corpus_file}", "--config.data.tokenizer=char",
            "--config.headless=True", "--config.train.eval_every=2", "--config.train.eval_steps=1",
            "--config.train.checkpoint_every=2", "--config.sample.num_samples=0"]
  proc = run_cli(*common, f"--config.workdir={run}",
                 "--config.train.max_steps=40", "--config.train.early_stop_patience=2",
                 "--config.optim.lr=1e-30", "--config.optim.matrix_lr=1e-30")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "stopped at step 6: early stop: no new best val loss in 2 evaluations" in proc.stdout
  assert "best, " in proc.stdout and "at step 2" in proc.stdout

  proc = module("jaxtrain.sample", f"--workdir={run}", "--prompt=The", "--max_new_tokens=20",
                "--num_samples=2", "--temperature=0", "--step=best")
  assert proc.returncode == 0, proc.stderr
  best = load.best_step(run)  # the val losses tie (lr 1e-30): the earliest step kept
  assert f"step {best} of" in proc.stderr
  samples = proc.stdout.split("--- sample ")[1:]
  assert len(samples) == 2 and all(s.split("\n", 1)[1].startswith("The") for s in samples)
  assert samples[0].split("\n", 1)[1] == samples[1].split("\n", 1)[1]  # greedy: the same
  proc = module("jaxtrain.sample", f"--workdir={run}", "--interactive", "--max_new_tokens=5",
                stdin="Th\nZ\u00e9\n\n")
  assert proc.returncode == 0 and proc.stdout.startswith("prompt> Th"), proc.stdout + proc.stderr
  assert "is not in this run's vocabulary" in proc.stderr  # said, then asked again
  one_line_error(module("jaxtrain.sample", f"--workdir={run}", "--prompt=\u00e9"), "vocabulary")

  proc = module("jaxtrain.export", f"--workdir={run}", f"--out={tmp_path / 'hf'}", "--step=best")
  assert proc.returncode == 0, proc.stderr
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["jaxtrain"]["step"] == best

  proc = run_cli(*common, f"--config.workdir={tmp_path / 'tuned'}", "--config.train.max_steps=2",
                 f"--config.init_from={run}")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert f"init_from: params from step 6 of {run}" in proc.stdout
  assert "starting a new run at step 0" in proc.stdout


@pytest.mark.slow
def test_bad_workdirs_are_one_line_and_exit_2(tmp_path):
  one_line_error(module("jaxtrain.sample", f"--workdir={tmp_path / 'none'}"), "does not exist")
  one_line_error(module("jaxtrain.export", f"--workdir={tmp_path}", f"--out={tmp_path / 'o'}"),
                 "is not a jaxtrain run")
  (tmp_path / "run.json").write_text("{}")
  (tmp_path / "tokenizer.json").write_text('{"name": "byte"}')
  one_line_error(module("jaxtrain.sample", f"--workdir={tmp_path}"), "no checkpoint")
  one_line_error(module("jaxtrain.sample", f"--workdir={tmp_path}", "--step=last"), "--step")


@pytest.mark.slow
def test_step_best_is_the_kept_checkpoint_with_the_lowest_val_loss(tmp_path):
  tmp_path = tmp_path / "run"
  state = make_run(tmp_path, tiny_config())  # saves step 0
  ckpts = store.Checkpoints(str(tmp_path), keep=5)
  for step in (2, 4, 6):
    ckpts.save(state.replace(step=state.step + step), meta={"config": tiny_config().to_dict()})
  ckpts.close()
  records = [{"step": 2, "val_loss": 1.5}, {"step": 4, "loss": 0.1}, {"step": 4, "val_loss": 1.2},
             {"step": 6, "val_loss": 1.3}, {"step": 8, "val_loss": 0.5}]  # 8: no checkpoint
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"st')
  assert load.best_step(tmp_path) == 4
  assert load.resolve_step(tmp_path, "best") == 4 and load.resolve_step(tmp_path, "6") == 6
  assert load.resolve_step(tmp_path, "latest") is None
  (tmp_path / "metrics.jsonl").unlink()
  with pytest.raises(UserError, match="no checkpoint .* has a validation loss"):
    load.best_step(tmp_path)


def test_load_state_takes_best_and_latest_as_the_command_line_does(tmp_path):
  tmp_path = tmp_path / "run"
  state = make_run(tmp_path, tiny_config())  # saves step 0
  ckpts = store.Checkpoints(str(tmp_path), keep=5)
  for step in (2, 4):
    ckpts.save(state.replace(step=state.step + step), meta={"config": tiny_config().to_dict()})
  ckpts.close()
  records = [{"step": 2, "val_loss": 1.1}, {"step": 4, "val_loss": 1.3}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert int(jt.load_state(str(tmp_path), step="best").step) == 2
  assert int(jt.load_state(str(tmp_path), step="latest").step) == 4
  assert int(jt.load_state(str(tmp_path)).step) == 4
  assert int(jt.load_state(str(tmp_path), step="0").step) == 0
  assert int(jt.load_state(str(tmp_path), step=np.int64(2)).step) == 2
  with pytest.raises(UserError, match="not latest, best or a step number"):
    jt.load_state(str(tmp_path), step="newest")
  with pytest.raises(UserError, match="names no checkpoint"):
    jt.load_state(str(tmp_path), step=2.0)


@pytest.mark.slow
def test_a_missing_init_from_is_one_line_before_any_data_is_read(corpus_file, tmp_path):
  missing = tmp_path / "no_such_run"
  proc = run_cli("--config=configs/nano.py", "--jax_platforms=cpu", *TINY,
                 f"--config.data.path={corpus_file}", f"--config.workdir={tmp_path / 'tuned'}",
                 f"--config.init_from={missing}")
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert proc.stderr.strip().splitlines() == [
      f"error: init_from: {missing} does not exist; pass --config.init_from=<a run's workdir or an "
      "exported model directory>"]
  assert proc.stdout == "" and not (tmp_path / "tuned").exists()  # no data line, no workdir


@pytest.mark.slow
def test_a_resumed_fine_tune_does_not_need_its_source_any_more(tmp_path):
  from jaxtrain.checkpoints import init_from

  cfg = tiny_config(**{"workdir": str(tmp_path / "tuned"), "init_from": str(tmp_path / "gone")})
  with pytest.raises(UserError, match=r"^init_from: .*/gone does not exist; "):
    init_from.resolve(cfg)
  make_run(tmp_path / "tuned", cfg)  # its first leg saved a checkpoint; the source was removed
  assert init_from.resolve(cfg)[0].model.to_dict() == cfg.model.to_dict()
