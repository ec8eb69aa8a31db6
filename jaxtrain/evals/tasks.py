"""Task scores at every evaluation of a training run (`train.eval_tasks`): the numbers of
`python -m jaxtrain.eval` (scoring.py) on held-out records, as task/<name>/<metric> (<name>: the
file's stem; defaults.TASK_METRICS, those its records give) in the evaluation record, where
metrics.jsonl, TensorBoard, W&B, compare and early stopping see them as they see val_loss.

The files are read and checked at setup, before anything is compiled; each evaluation scores their
first `train.eval_tasks_limit` records with the current params. Scoring reads neither the training
data's iterator nor the run's random keys: a resumed run stays bit for bit the same.
"""

import dataclasses
import time

import jax
import ml_collections

from jaxtrain.config import defaults, lists
from jaxtrain.data import records
from jaxtrain.evals import scoring
from jaxtrain.system import runtime
from jaxtrain.system.errors import UserError


@dataclasses.dataclass(frozen=True)
class Task:
  name: str  # the file's stem: its metrics are task/<name>/...
  path: str
  pairs: list  # (line, prompt, completion)
  choices: list  # (line, context, endings, label)
  in_file: int  # records in the file, of which the first eval_tasks_limit are scored


def load(cfg: ml_collections.ConfigDict) -> list[Task]:
  """The records of every `train.eval_tasks` file (its first `eval_tasks_limit`), read with the
  run's prompt and completion fields; a bad record is one line naming the file and the line."""
  names = dict(scoring.FIELDS, prompt=cfg.data.prompt_field or "prompt",
               completion=cfg.data.completion_field or "completion")
  fix = (f"fix that line: train.eval_tasks records hold {names['prompt']!r} and "
         f"{names['completion']!r} (the run's data.prompt_field and data.completion_field), or "
         f"{names['context']!r}, {names['endings']!r} and {names['label']!r} (multiple choice)")
  tasks = []
  for name, path in lists.eval_task_files(cfg.train.eval_tasks):
    try:
      found = records.read_jsonl(path)
      pairs, choices = scoring.split(path, names, fix, cfg.train.eval_tasks_limit, found)
    except UserError as e:
      raise UserError(f"config.train.eval_tasks: {e}") from None
    tasks.append(Task(name, path, pairs, choices, len(found)))
  _check_metric(cfg.train, tasks)
  return tasks


def describe(tasks: list[Task], limit: int, say) -> None:
  """One line: what each evaluation scores."""
  def one(t: Task) -> str:
    kinds = [f"{len(t.pairs)} prompt/completion"] * bool(t.pairs) + \
        [f"{len(t.choices)} multiple-choice"] * bool(t.choices)
    cut = len(t.pairs) + len(t.choices) < t.in_file
    return f"{t.name} ({', '.join(kinds)}" + (f": the first of {t.in_file} records, "
                                              f"train.eval_tasks_limit={limit})" if cut else ")")

  if tasks:
    say("eval tasks, scored at every evaluation: " + ", ".join(map(one, tasks)))


def _check_metric(train: ml_collections.ConfigDict, tasks: list[Task]) -> None:
  """A task metric for early stopping must be one its file's records give."""
  parts = train.early_stop_metric.split("/")
  task = next((t for t in tasks if t.name == parts[1]), None) \
      if len(parts) == 3 and parts[0] == "task" else None
  if task is None:  # val_loss or val_bpb (validate.py refuses a task that is not a file's)
    return
  mc = parts[2] == "mc_accuracy"
  if not (task.choices if mc else task.pairs):
    have = "prompt/completion" if task.pairs else "multiple-choice"
    raise UserError(f"config.train.early_stop_metric: {train.early_stop_metric} needs "
                    f"{'multiple-choice' if mc else 'prompt/completion'} records, and the first "
                    f"{len(task.pairs) + len(task.choices)} records of {task.path} are all {have}; "
                    f"pass --config.train.early_stop_metric=task/{task.name}/"
                    f"{'exact_match' if mc else 'mc_accuracy'} (or val_loss)")


def _on_one_device(state):
  """The state with its params whole on this process's first device, where generation runs (a
  collective where params are spread over processes)."""
  if len(jax.devices()) == 1:
    return state
  params = runtime.host_copy(state.params)
  return state.replace(params=jax.device_put(params, jax.local_devices()[0]))


class Stopped(Exception):
  """An evaluation given up part way because the run is stopping (a signal): it has no record."""


def score(tasks: list[Task], state, tok, say=print, stopping=lambda: False) -> dict:
  """{task/<name>/<metric>: value} of `state` on every task, and one line a task through `say`.
  Every process takes part; process 0 scores (the others get {}). `stopping()` is asked before
  each task; True raises `Stopped`."""
  state = _on_one_device(state)
  if jax.process_index() != 0:
    return {}
  record = {}
  for task in tasks:
    if stopping():
      raise Stopped
    t0 = time.time()
    s = scoring.scores(state, tok, task.pairs, task.choices)
    record.update({f"task/{task.name}/{k}": s[k] for k in defaults.TASK_METRICS if s[k] is not None})
    say(line(int(state.step), task, time.time() - t0, s, state.model_cfg.seq_len))
  return record


def line(step: int, task: Task, seconds: float, s: dict, seq_len: int) -> str:
  """`eval step N task held: exact_match 0.9375 of 48 | loss 0.0123 | 0.0234 bits/byte (0.8s)`,
  and the records left out as longer than the model's context (`s`: scoring.scores' result)."""
  shown = {"exact_match": f"exact_match {{:.4f}} of {s['n_completions']}",
           "mc_accuracy": f"mc_accuracy {{:.4f}} of {s['n_multiple_choice']}",
           "loss": "loss {:.4f}", "bpb": "{:.4f} bits/byte"}
  parts = [form.format(s[k]) for k, form in shown.items() if s[k] is not None]
  left_out = scoring.too_long_line(task.path, s, seq_len)
  return (f"eval step {step} task {task.name}: {' | '.join(parts) or 'nothing scored'} "
          f"({seconds:.1f}s)" + (f"; {left_out}" if left_out else ""))
