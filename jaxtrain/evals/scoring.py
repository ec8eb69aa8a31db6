"""Task scores of a state on held-out records, for `python -m jaxtrain.eval` (`score_run`: a saved
run's checkpoint on a records file) and a training run's `train.eval_tasks` (tasks.py) alike.

Prompt/completion records give the loss and bits per byte of the completions given their prompts
(end-of-text included, as in training) and the exact-match accuracy of greedy completions.
Multiple-choice records (a context, a list of endings, the index of the right one) give the
accuracy of picking the ending with the highest log-likelihood per UTF-8 byte.
"""

import concurrent.futures
import math
import time

import jax
import numpy as np

from jaxtrain.checkpoints import load
from jaxtrain.data import records
from jaxtrain.generation import complete, fit
from jaxtrain.system.errors import UserError

NORMALIZE = {"none": lambda s: s, "strip": str.strip, "lower": lambda s: s.strip().lower()}
# The record fields `split` reads when nothing else is asked for (the eval command's defaults).
FIELDS = {"prompt": "prompt", "completion": "completion", "context": "context",
          "endings": "endings", "label": "label"}


def split(path: str, fields: dict, fix: str = "", limit: int = 0,
          found: list | None = None) -> tuple[list, list]:
  """(prompt/completion pairs, multiple-choice items) of the file's first `limit` records (0:
  all), each with its line; `found`: the file's records where already read. A bad record is one
  line naming the file and the line, ending with `fix` where one is given (else the eval
  command's flag)."""
  pairs, choices = [], []
  found = records.read_jsonl(path) if found is None else found
  for n, r in found[:limit] if limit else found:
    if fields["endings"] in r:
      choices.append((n, *records.multiple_choice(path, n, r, (fields["context"],
                                                               fields["endings"], fields["label"]),
                                                  fix=fix)))
    else:
      pairs.append((n, records.field(path, n, r, fields["prompt"], "--prompt_field", fix=fix),
                    records.field(path, n, r, fields["completion"], "--completion_field",
                                  fix=fix)))
  return pairs, choices


def completion_scores(state, tok, pairs: list, normalize: str, max_new_tokens: int) -> dict:
  """Loss, bpb, exact match and the first five examples of pairs (line, prompt, completion)."""
  eot = np.array([tok.eot_id], np.int32)
  targets = [np.concatenate([np.asarray(tok.encode(c), np.int32), eot]) for _, _, c in pairs]
  n_tokens = sum(len(t) for t in targets)
  n_bytes = sum(len(c.encode("utf-8")) for _, _, c in pairs)
  limit = max_new_tokens or max(len(t) for t in targets)
  make = lambda: complete.complete(state, tok, [p for _, p, _ in pairs], limit,  # noqa: E731
                                   temperature=0.0)
  # The greedy completions and the scores run different programs: on an accelerator each
  # compiles beside the other; on a CPU, XLA's compile of each keeps the cores busy already.
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    making = pool.submit(make) if jax.devices()[0].platform != "cpu" else None
    nats = -complete.score(state, [(complete.context_ids(state, tok, p), t)
                                   for (_, p, _), t in zip(pairs, targets)])
    made = making.result() if making else make()
  norm = NORMALIZE[normalize]
  right = [norm(m) == norm(c) for m, (_, _, c) in zip(made, pairs)]
  return {"loss": float(nats.sum() / n_tokens),
          "bpb": float(nats.sum() / (math.log(2) * n_bytes)) if n_bytes else None,
          "exact_match": float(np.mean(right)), "n_completions": len(pairs),
          "examples": [{"line": n, "prompt": p, "completion": c, "generated": m}
                       for (n, p, c), m in list(zip(pairs, made))[:5]]}


def choice_accuracy(state, tok, choices: list) -> dict:
  """Accuracy of multiple-choice items (line, context, endings, label) by log-likelihood per
  byte of each ending."""
  asks, sizes = [], []
  for _, context, endings, _ in choices:
    ctx = complete.context_ids(state, tok, context)
    for e in endings:
      asks.append((ctx, np.asarray(tok.encode(e), np.int32)))
      sizes.append(max(len(e.encode("utf-8")), 1))
  per_byte = complete.score(state, asks) / np.array(sizes)
  items = np.split(per_byte, np.cumsum([len(endings) for _, _, endings, _ in choices])[:-1])
  right = sum(int(np.argmax(item) == label) for item, (*_, label) in zip(items, choices))
  return {"mc_accuracy": right / len(choices), "n_multiple_choice": len(choices)}


def fitting(state, tok, pairs: list, choices: list) -> tuple[list, list, list[int]]:
  """(the pairs, the multiple-choice items that fit the model's context whole, the lines of the
  records that do not). A record fits when its prompt and completion (end-of-text included), or
  its context and each ending, are scored whole (fit.fits): one cut short would be scored on
  another question than its own."""
  seq_len = state.model_cfg.seq_len
  size = lambda text: len(tok.encode(text))  # noqa: E731
  kept_pairs, kept_choices, too_long = [], [], []
  for record in pairs:
    _, prompt, completion = record
    n = len(complete.context_ids(state, tok, prompt)) + size(completion) + 1
    (kept_pairs if fit.fits(n, seq_len) else too_long).append(record)
  for record in choices:
    _, ctx, endings, _ = record
    n = len(complete.context_ids(state, tok, ctx)) + max(map(size, endings), default=0)
    (kept_choices if fit.fits(n, seq_len) else too_long).append(record)
  return kept_pairs, kept_choices, sorted(r[0] for r in too_long)


def too_long_line(path: str, result: dict, seq_len: int) -> str | None:
  """The line that says which records `scores` left out as longer than the context."""
  lines = result["too_long_lines"]
  if not lines:
    return None
  total = len(lines) + result["n_completions"] + result["n_multiple_choice"]
  return (f"{len(lines)} of {total} records of {path} do not fit the model's context "
          f"(model.seq_len={seq_len}) with their completion or endings ({fit.lines(lines)}): "
          "left out of the scores")


def scores(state, tok, pairs: list, choices: list, normalize: str = "strip",
           max_new_tokens: int = 0) -> dict:
  """The scores of `state` on records already read (`split`); None where there are none. Records
  longer than the model's context are left out, and counted (n_too_long, too_long_lines)."""
  pairs, choices, too_long = fitting(state, tok, pairs, choices)
  result = {"loss": None, "bpb": None, "exact_match": None, "mc_accuracy": None,
            "n_completions": 0, "n_multiple_choice": 0, "normalize": normalize,
            "n_too_long": len(too_long), "too_long_lines": too_long}
  if pairs:
    result.update(completion_scores(state, tok, pairs, normalize, max_new_tokens))
  if choices:
    result.update(choice_accuracy(state, tok, choices))
  return result


def evaluate(state, tok, path: str, fields: dict = FIELDS, normalize: str = "strip",
             max_new_tokens: int = 0) -> dict:
  """The scores of a trained state on the records of `path` (see the module's docstring)."""
  return scores(state, tok, *split(path, fields), normalize, max_new_tokens)


def run_fields(workdir: str, prompt: str = "", completion: str = "", **multiple_choice: str) -> dict:
  """The record fields of a saved run's task file: `prompt` and `completion` where given, else the
  run's data.prompt_field and data.completion_field, else FIELDS'; `multiple_choice` sets context,
  endings and label."""
  return dict(FIELDS, prompt=load.data_field(workdir, "prompt_field", prompt, FIELDS["prompt"]),
              completion=load.data_field(workdir, "completion_field", completion,
                                         FIELDS["completion"]), **multiple_choice)


def score_run(workdir: str, path: str, fields: dict = FIELDS, normalize: str = "strip",
              max_new_tokens: int = 0, step: str = "latest", warn=None) -> tuple[dict, float]:
  """(the scores of a run's checkpoint on the records of `path`, with its step, the workdir and the
  file; the seconds scoring took). `step`: latest, best or a number. A bad record fails before the
  checkpoint is read; `warn` gets the line on records too long for the model's context, and a
  file of nothing else is a UserError."""
  split(path, fields)
  state, tok = load.load(workdir, step)
  t0 = time.time()
  result = evaluate(state, tok, path, fields, normalize, max_new_tokens)
  seq_len = state.model_cfg.seq_len
  if result["n_too_long"] and not result["n_completions"] + result["n_multiple_choice"]:
    raise UserError(f"no record of {path} fits the model's context (model.seq_len={seq_len}) with "
                    "its completion or endings; pass shorter records, or score a run trained with "
                    "a longer model.seq_len")
  if warn is not None and (line := too_long_line(path, result, seq_len)):
    warn(f"warning: {line}")
  result.update(step=int(state.step), workdir=str(workdir), data=str(path))
  return result, time.time() - t0


def table(result: dict) -> str:
  """The scores on screen: one line a metric, with what it measures."""
  def show(key: str, what: str) -> str:
    v = result[key]
    return f"{key:<12} {'-' if v is None else f'{v:.4f}':>8}  {what}"

  return "\n".join([
      show("loss", f"nats per completion token ({result['n_completions']} prompt/completion "
           "records)"),
      show("bpb", "bits per byte of the completions"),
      show("exact_match", f"greedy completions equal to the reference (normalize="
           f"{result['normalize']})"),
      show("mc_accuracy", f"best ending by log-likelihood per byte ({result['n_multiple_choice']} "
           "multiple-choice records)")])
