"""Records read whole from a small .jsonl file, for sampling and evaluation: prompts, prompt and
completion pairs, multiple-choice items. A record that lacks a field, or holds the wrong kind of
value, is one line naming the file, the line and the flag that fixes it (or the caller's own fix:
a training run's `train.eval_tasks` has no such flags).
"""

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import ml_collections

from jaxtrain.system.errors import UserError


def is_records(data: ml_collections.ConfigDict) -> bool:
  """Whether `data` is prompt/completion records (only completions in the loss)."""
  return bool(data.prompt_field and data.completion_field)


def read_jsonl(path: str) -> list[tuple[int, dict]]:
  """(line number, record) for each non-blank line of `path`."""
  p = Path(path).expanduser()
  try:
    lines = p.read_text(encoding="utf-8").splitlines()
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"cannot read {p} ({getattr(e, 'strerror', None) or e}); pass a UTF-8 .jsonl "
                    "file with one JSON object per line") from None
  records = list(json_lines(lines, p, "fix that line"))
  if not records:
    raise UserError(f"{p} holds no records; pass a .jsonl file with one JSON object per line")
  return records


def json_lines(lines: Iterable[str], path: Path, fix: str) -> Iterator[tuple[int, dict]]:
  """(line number, record) for each non-blank line; a UserError ending in `fix` at the first
  that is not a JSON object."""
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      # json's own messages may end in "at" ("Unterminated string starting at"): one "at".
      where = f"{e.msg.removesuffix(' at')} at column {e.colno}"
      raise UserError(f"{path} line {number} is not JSON ({where}); {fix}") from None
    if not isinstance(record, dict):
      raise UserError(f"{path} line {number} is not a JSON object; {fix}")
    yield number, record


def field(path: str, number: int, record: dict, name: str, flag: str, kind: type = str,
          fix: str = ""):
  """`record[name]`, which must be a `kind`; else one line naming the file, line and flag (or
  ending with `fix`, where one is given)."""
  if name not in record:
    raise UserError(f"{path} line {number} has no field {name!r} (it has: "
                    f"{', '.join(record) or 'no fields'}); {fix or f'pass {flag}=<the field>'}")
  value = record[name]
  if not isinstance(value, kind) or isinstance(value, bool):
    raise UserError(f"{path} line {number}: field {name!r} is {type(value).__name__}, not "
                    f"{kind.__name__}; {fix or f'pass {flag}=<a field of {kind.__name__}s>'}")
  return value


def prompts(path: str, prompt_field: str) -> list[tuple[int, str]]:
  """(line number, prompt) of each record."""
  return [(n, field(path, n, r, prompt_field, "--prompt_field")) for n, r in read_jsonl(path)]


def multiple_choice(path: str, number: int, record: dict, names: tuple[str, str, str],
                    fix: str = ""):
  """(context, endings, label) of a multiple-choice record."""
  context = field(path, number, record, names[0], "--context_field", fix=fix)
  endings = field(path, number, record, names[1], "--endings_field", list, fix=fix)
  label = field(path, number, record, names[2], "--label_field", int, fix=fix)
  if len(endings) < 2 or not all(isinstance(e, str) for e in endings):
    raise UserError(f"{path} line {number}: {names[1]!r} must be a list of at least two strings")
  if not 0 <= label < len(endings):
    raise UserError(f"{path} line {number}: {names[2]!r} is {label}, not the index of one of its "
                    f"{len(endings)} endings (0 .. {len(endings) - 1})")
  return context, endings, label
