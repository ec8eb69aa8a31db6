"""`python -m jaxtrain` as a user runs it: a tiny real run, its outputs, resume, and bad input."""

import json
import sys

import pytest
from conftest import run_cli

from jaxtrain.system import allocator, fmt

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

TINY = ["--config.model.n_layers=2", "--config.model.d_model=32", "--config.model.n_heads=4",
        "--config.model.seq_len=32", "--config.train.batch_size=8", "--config.train.eval_steps=2",
        "--config.train.log_every=5", "--config.sample.max_new_tokens=24", "--config.headless=True"]


@pytest.mark.slow
def test_train_evaluate_checkpoint_sample_then_resume(corpus_file, tmp_path):
  workdir = tmp_path / "run"
  args = ["--config=configs/nano.py", "--jax_platforms=cpu", f"--config.workdir={workdir}",
          f"--config.data.path={corpus_file}", "--config.train.eval_every=10",
          "--config.train.checkpoint_every=10", *TINY]
  first = run_cli(*args, "--config.train.max_steps=20")
  assert first.returncode == 0, first.stderr[-2000:]
  out = first.stdout
  assert "starting a new run at step 0" in out and "eval step 20: val loss" in out
  assert "samples at step 20" in out and "Traceback" not in first.stderr
  # It restarted itself once under mimalloc (jaxtrain/system/allocator.py), and says so.
  if sys.platform == "linux" and allocator.mimalloc_library():
    assert "| mimalloc allocator" in out.splitlines()[0], out.splitlines()[0]

  for name in ("config.json", "run.json", "tokenizer.json", "metrics.jsonl", "samples.txt",
               "loss.png"):
    assert (workdir / name).is_file(), name
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "20"]
  assert json.loads((workdir / "config.json").read_text())["model"]["d_model"] == 32
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train_lines = [r for r in records if "loss" in r]
  eval_lines = [r for r in records if "val_loss" in r]
  assert [r["step"] for r in train_lines] == [5, 10, 15, 20]
  assert all({"step", "loss", "lr", "tokens_per_sec", "elapsed_s"} <= r.keys() for r in train_lines)
  assert [r["step"] for r in eval_lines] == [10, 20]
  assert all({"step", "val_loss", "elapsed_s"} <= r.keys() for r in eval_lines)
  assert train_lines[-1]["loss"] < train_lines[0]["loss"]
  # The story as it goes and at the end: the latest val loss beside the loss, the best val loss
  # and its step, the tokens seen, and where the wall time went (the parts add up to it).
  step15 = next(line for line in out.splitlines() if line.startswith("step     15/20"))
  assert f"| loss {train_lines[2]['loss']:.4f} | val {eval_lines[0]['val_loss']:.4f} |" in step15
  best = min(eval_lines, key=lambda r: r["val_loss"])
  lines = out.splitlines()
  done = next(i for i, line in enumerate(lines) if line.startswith("done: step 20"))
  assert lines[done + 1] == (f"summary: best val loss {best['val_loss']:.4f} at step {best['step']}"
                             " | 5.12k tokens seen (20 steps x 256)")
  time_line = lines[done + 2]
  wall_text = lines[done].split("| wall ")[1].split(" |")[0]
  wall = fmt.parse_duration(wall_text)
  parts = {k: fmt.parse_duration(v) for k, v in
           (p.rsplit(" ", 1) for p in time_line.split(" = ")[1].split(" + "))}
  # Phases in their order; one under 0.05 s is left out, and the eval (compiled while training
  # ran) or the loss plot (drawn beside the samples) can be (only the train part is always said).
  phases = ["start-up", "compile", "train", "eval", "checkpoints", "samples", "loss plot"]
  assert time_line.startswith(f"time: {wall_text} = start-up ") and "train" in parts, time_line
  assert list(parts) == [p for p in phases if p in parts], time_line
  # Each figure is rounded as printed: to 0.1 s under a minute, to whole seconds from one on (a
  # slow or busy machine takes minutes).
  slack = sum(0.05 if v < 60 else 1.0 for v in parts.values()) + (1.0 if wall >= 60 else 0.0)
  assert abs(sum(parts.values()) - wall) < slack, time_line

  # The same run in a new directory, its programs now from XLA's compile cache: same numbers.
  again = run_cli(*[a.replace(str(workdir), str(tmp_path / "again")) for a in args],
                  "--config.train.max_steps=20")
  assert again.returncode == 0, again.stderr[-2000:]
  assert (tmp_path / "again" / "metrics.jsonl").read_text().count('"loss"') == 4

  def losses(d):
    return [json.loads(line).get("loss") for line in (d / "metrics.jsonl").open()]

  assert losses(tmp_path / "again") == losses(workdir)

  second = run_cli(*args, "--config.train.max_steps=30", "--config.sample.num_samples=0")
  assert second.returncode == 0, second.stderr[-2000:]
  assert f"resumed from checkpoint {workdir / 'checkpoints' / '20'} at step 20" in second.stdout
  steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps[-1] == 30 and steps.count(20) == 2  # train and eval lines, none repeated


@pytest.mark.parametrize("flag,message", [
    ("--config.model.d_model=100", "config.model.d_model: 100 is not divisible by model.n_heads=3"),
    ("--config.optim.lr=0", "config.optim.lr: must be > 0"),
    ("--config.model.nlayers=3", "--config.model.nlayers is not a config field; did you mean "
     "--config.model.n_layers"),
    ("--config.train.max_steps=abc", "--config.train.max_steps=abc"),
    ("--config.data.path=/no/such.txt", "config.data.path: '/no/such.txt' matches no file"),
    # A field's name as a flag of its own: the override it means, not absl's JAX flags.
    ("--max_steps=5", "--max_steps is not a flag of python -m jaxtrain; config fields are set as "
     "--config.SECTION.FIELD=VALUE: did you mean --config.train.max_steps=5?"),
    ("--workdir=runs/x", "did you mean --config.workdir=runs/x?"),
])
def test_bad_input_is_one_line_and_exit_2(flag, message, tmp_path):
  result = run_cli("--config=configs/nano.py", "--jax_platforms=cpu",
                   f"--config.workdir={tmp_path / 'run'}", flag, timeout=600)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
  assert not (tmp_path / "run").exists()  # nothing was created
