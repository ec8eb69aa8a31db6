"""`train.eval_tasks`: task scores (loss, bpb, exact match, multiple-choice accuracy) at every
evaluation of a training run, in metrics.jsonl, TensorBoard, compare and early stopping, on the
synthetic keyed task of test_finetune.py (three random letters and a key, then a pattern the key
alone decides)."""

import contextlib
import io
import json
from pathlib import Path

import pytest
from conftest import run_cli
from tensorboard.backend.event_processing import event_accumulator
from test_compare import _make_run
from test_finetune import FIELDS, KEYS, keyed, pattern, task_config, write_jsonl

import jaxtrain as jt
from jaxtrain.config import validate
from jaxtrain.evals import tasks
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.tools import compare
from jaxtrain.trackers import early_stop, tensorboard_log

METRIC = "task/held/exact_match"


def evals(workdir) -> list[dict]:
  return [r for r in map(json.loads, open(Path(workdir) / "metrics.jsonl")) if "val_loss" in r]


def choices(rows: list[dict]) -> list[dict]:
  """Multiple-choice records: the right pattern for the key, another key's, and a cut one."""
  return [{"context": r["prompt"], "endings": [pattern((KEYS.index(r["prompt"][3]) + 1) % 8),
                                               r["completion"], pattern(0)[:2]], "label": 1}
          for r in rows]


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
  """A run scored on two task files at every evaluation, stopping early on exact match."""
  root = tmp_path_factory.mktemp("scored")
  train = write_jsonl(root / "train.jsonl", keyed(2000, seed=0))
  held = write_jsonl(root / "held.jsonl", keyed(48, seed=1))
  mc = write_jsonl(root / "mc.jsonl", choices(keyed(16, seed=2)))
  cfg = task_config(train, root / "run", **FIELDS, **{
      "train.max_steps": 120, "train.eval_every": 10, "train.eval_tasks": f"{held},{mc}",
      "train.early_stop_patience": 2, "train.early_stop_metric": METRIC})
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    result = jt.run(cfg)
  return {"root": root, "cfg": cfg, "result": result, "out": out.getvalue(),
          "evals": evals(cfg.workdir)}


@pytest.mark.slow
def test_every_evaluation_has_the_task_scores_and_exact_match_rises(scored):
  rows = scored["evals"]
  assert [r["step"] for r in rows] == list(range(10, scored["result"].step + 1, 10))
  for r in rows:
    assert {"task/held/loss", "task/held/bpb", METRIC, "task/mc/mc_accuracy"} <= r.keys()
    assert "task/mc/loss" not in r and "task/held/mc_accuracy" not in r  # no such records
  first, last = rows[0], rows[-1]
  assert first[METRIC] < 0.5 <= 0.9 <= max(r[METRIC] for r in rows), [r[METRIC] for r in rows]
  assert last["task/held/loss"] < 0.3 * first["task/held/loss"]
  assert last["task/mc/mc_accuracy"] >= 0.75
  assert "eval tasks, scored at every evaluation: held (48 prompt/completion), mc (16 " \
      "multiple-choice)\n" in scored["out"]
  for step in (10, rows[-1]["step"]):  # one console line a task, after the eval line
    eval_line = scored["out"].index(f"eval step {step}: val loss on completions")
    held = scored["out"].index(f"eval step {step} task held: exact_match ", eval_line)
    assert scored["out"].index(f"eval step {step} task mc: mc_accuracy ", held) > held


@pytest.mark.slow
def test_early_stopping_on_a_task_metric_stops_when_it_stops_rising(scored):
  steps = [r[METRIC] for r in scored["evals"]]
  assert scored["result"].step < 120
  best_before = max(steps[:-2])
  assert max(steps[-2:]) <= best_before and best_before == max(steps)  # 2 evaluations, no better
  assert f"early stop: no new best {METRIC} in 2 evaluations" in scored["out"]


def test_accuracies_are_better_higher_and_losses_lower():
  def stops(metric, values):
    hook = early_stop.EarlyStop(2, metric)
    for step, v in enumerate(values):
      hook.on_eval(step, {metric: v})
    return hook.stop_reason() is not None

  rising, falling = [0.1, 0.5, 0.6, 0.7], [0.7, 0.6, 0.5, 0.1]
  assert not stops(METRIC, rising) and stops(METRIC, falling)
  assert not stops("task/mc/mc_accuracy", rising)
  assert stops("task/held/loss", rising) and not stops("task/held/loss", falling)
  hook = early_stop.EarlyStop(1, METRIC)  # a record without it (another process's) counts not
  hook.on_eval(1, {METRIC: 0.5})
  hook.on_eval(2, {"val_loss": 1.0})
  assert hook.stop_reason() is None


@pytest.mark.slow
def test_tensorboard_and_wandb_get_the_task_scores(scored):
  acc = event_accumulator.EventAccumulator(str(scored["cfg"].workdir),
                                           size_guidance={"scalars": 0}).Reload()
  steps = [r["step"] for r in scored["evals"]]
  for tag in (METRIC, "task/held/loss", "task/mc/mc_accuracy", "val/loss"):
    assert [e.step for e in acc.Scalars(tag)] == steps, tag
  assert [e.value for e in acc.Scalars(METRIC)] == pytest.approx([r[METRIC] for r in scored["evals"]])
  assert tensorboard_log.scalars("val", scored["evals"][-1])[METRIC] == scored["evals"][-1][METRIC]  # W&B's


@pytest.mark.slow
def test_compare_shows_task_accuracies_and_ranks_by_one(scored, tmp_path):
  printed = []
  compare.compare([str(scored["cfg"].workdir)], print_fn=printed.append, width=400)
  header, _, row = printed[0].splitlines()[:3]
  assert header.split()[-2:] == ["held/exact_match", "mc/mc_accuracy"]
  assert row.split()[-2] == f"{scored['evals'][-1][METRIC]:.4f}"
  # Hand-made runs: the lower val loss and the higher accuracy are not the same run's.
  for name, val, em in (("a", [2.0, 1.0], [0.2, 0.5]), ("b", [2.0, 1.5], [0.3, 0.9])):
    _make_run(tmp_path / name, 1e-3, 2, val)
    metrics = tmp_path / name / "metrics.jsonl"
    lines = [r for r in map(json.loads, metrics.read_text().splitlines()[:-1])]
    for r in (r for r in lines if "val_loss" in r):
      r[METRIC] = em.pop(0)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
  runs = [str(tmp_path / "a"), str(tmp_path / "b")]
  printed = []
  assert [i.path.name for i in compare.compare(runs, print_fn=printed.append)] == ["a", "b"]
  printed = []
  assert [i.path.name for i in compare.compare(runs, print_fn=printed.append, by=METRIC)] == \
      ["b", "a"]
  # (then the two, which differ in nothing, as repeats: the spread across them)
  assert (f"best: b (best {METRIC} 0.9000); ranked by {METRIC} (chosen with --by; "
          "higher is better)") in printed, printed
  with pytest.raises(UserError, match=r"--by=task/x/exact_match: no run has that metric .*"
                                      r"task/held/exact_match"):
    compare.compare(runs, by="task/x/exact_match")


@pytest.mark.slow
def test_task_files_are_checked_before_anything_runs(tmp_path):
  held = write_jsonl(tmp_path / "held.jsonl", keyed(4, seed=1))
  other = tmp_path / "other"
  other.mkdir()
  twin = write_jsonl(other / "held.jsonl", keyed(4, seed=1))
  cases = [({"train.eval_tasks": str(tmp_path / "missing.jsonl")}, "train.eval_tasks",
            "missing.jsonl' is not a file"),
           ({"train.eval_tasks": f"{held},{twin}"}, "train.eval_tasks", "two files are named 'held'"),
           ({"train.eval_tasks": str(held), "train.early_stop_metric": "task/held/accuracy"},
            "train.early_stop_metric", "names: held")]
  for overrides, field, message in cases:
    with pytest.raises(ConfigError, match=message) as e:
      validate.validate(task_config(held, tmp_path / "w", **FIELDS, **overrides))
    assert e.value.field == field
  bad = write_jsonl(tmp_path / "bad.jsonl", [*keyed(2, seed=1), {"prompt": "stuv:"}])
  workdir = tmp_path / "run"
  cfg = task_config(held, workdir, **FIELDS, **{"train.eval_tasks": f"{held},{bad}"})
  with pytest.raises(UserError, match=r"^config.train.eval_tasks: \S*bad.jsonl line 3 has no field "
                                      r"'completion' .*; fix that line"):
    jt.run(cfg)
  assert not workdir.exists()  # refused before the run made its directory
  cfg = task_config(held, workdir, **FIELDS, **{"train.eval_tasks": str(held),
                                                "train.early_stop_patience": 2,
                                                "train.early_stop_metric": "task/held/mc_accuracy"})
  with pytest.raises(UserError, match="needs multiple-choice records"):
    jt.run(cfg)


def test_the_first_records_are_read_with_the_runs_fields(tmp_path):
  rows = [{"q": r["prompt"], "a": r["completion"]} for r in keyed(6, seed=1)]
  mixed = write_jsonl(tmp_path / "mixed.jsonl", [*choices(keyed(2, seed=2)), *rows])
  plain = write_jsonl(tmp_path / "plain.jsonl", keyed(3, seed=3))
  cfg = task_config(mixed, tmp_path / "w", **{"data.prompt_field": "q", "data.completion_field": "a",
                                              "train.eval_tasks": str(mixed),
                                              "train.eval_tasks_limit": 5})
  (task,) = tasks.load(cfg)
  assert [n for n, *_ in task.choices] == [1, 2] and [n for n, *_ in task.pairs] == [3, 4, 5]
  assert task.pairs[0][1:] == (rows[0]["q"], rows[0]["a"]) and task.in_file == 8
  said = []
  tasks.describe([task], 5, said.append)
  assert said == ["eval tasks, scored at every evaluation: mixed (3 prompt/completion, 2 "
                  "multiple-choice: the first of 8 records, train.eval_tasks_limit=5)"]
  # A run on plain text reads prompt and completion; a limit of 0 reads every record.
  cfg = task_config(plain, tmp_path / "w", **{"train.eval_tasks": str(plain),
                                              "train.eval_tasks_limit": 0})
  assert len(tasks.load(cfg)[0].pairs) == 3
  cfg.data.prompt_field, cfg.data.completion_field = "q", "a"
  with pytest.raises(UserError, match=r"plain.jsonl line 1 has no field 'q' .*the run's "
                                      r"data.prompt_field"):
    tasks.load(cfg)


@pytest.mark.slow
def test_a_bad_record_is_one_line_from_the_command_line(tmp_path):
  train = write_jsonl(tmp_path / "train.jsonl", keyed(200, seed=0))
  bad = write_jsonl(tmp_path / "bad.jsonl", [{"context": "stuv:", "endings": ["A11"], "label": 0}])
  proc = run_cli("--config=configs/finetune_task.py", f"--config.data.path={train}",
                 f"--config.workdir={tmp_path / 'run'}", f"--config.train.eval_tasks={bad}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
  assert lines[0].startswith(f"error: config.train.eval_tasks: {bad} line 1: 'endings' must be "
                             "a list of at least two strings"), lines[0]


@pytest.mark.slow
def test_resume_is_bit_for_bit_with_task_scores(tiny, tmp_path):
  from test_resume import _check_resume

  tiny.data.path = str(write_jsonl(tmp_path / "r.jsonl", keyed(600, seed=0)))
  tiny.data.prompt_field, tiny.data.completion_field = "prompt", "completion"
  held = write_jsonl(tmp_path / "held.jsonl", keyed(8, seed=1))
  mc = write_jsonl(tmp_path / "mc.jsonl", choices(keyed(4, seed=2)))
  tiny.train.eval_tasks = f"{held},{mc}"
  _check_resume(tiny, tmp_path, n=3)
  whole, legs = evals(tmp_path / "whole"), evals(tmp_path / "legs")
  assert [r["step"] for r in whole] == [3, 6]
  keys = ("task/held/loss", METRIC, "task/mc/mc_accuracy")
  assert [[r[k] for k in keys] for r in whole] == [[r[k] for k in keys] for r in legs]
