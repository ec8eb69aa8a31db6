"""The defaults' field names as the schema every config is held to: unknown names found (in a
loaded file, a ConfigDict, an override), the nearest real names suggested, and a config file that
fails to load described in one line (the file, the line, the message)."""

import difflib
import os
import traceback

import ml_collections


def _initials(name: str) -> str:
  return "".join(word[0] for word in name.split("_") if word)


def _score(name: str, known: str) -> float:
  """How likely `known` is the field meant by `name` (0: not at all). The last component counts
  most: a section typo keeps the field's name, a field typo keeps its section."""
  section, _, leaf = name.rpartition(".")
  known_section, _, known_leaf = known.rpartition(".")
  if leaf == known_leaf:
    score = 3.0  # the right field in the wrong (or a misspelt) section
  elif _initials(leaf) == known_leaf or _initials(known_leaf) == leaf:
    score = 2.5  # learning_rate -> lr
  elif min(len(leaf), len(known_leaf)) >= 3 and (leaf in known_leaf or known_leaf in leaf):
    score = 2.0  # max_step -> max_steps, layers -> n_layers
  else:
    score = difflib.SequenceMatcher(None, leaf, known_leaf).ratio()
    score = score if score >= 0.75 else 0.0
  if score and section != known_section:  # a field of another section: less likely, unless the
    similar = difflib.SequenceMatcher(None, section, known_section).ratio()  # section is misspelt
    score -= 0.1 if similar >= 0.6 else 0.6
  return score


def nearest(name: str, known, n: int = 2) -> list[str]:
  """The names in `known` closest to `name`, best first: the same last component, initials
  (learning_rate: lr), a substring, then spelling; matches within the same section first."""
  scored = sorted(((_score(name, k), k) for k in known), key=lambda s: -s[0])
  scored = [(s, k) for s, k in scored if s > 0]
  if not scored:  # a whole dotted name misspelt (e.g. a section name alone)
    return difflib.get_close_matches(name, sorted(known), n=n)
  best = scored[0][0]
  return [k for s, k in scored[:n] if s >= best - 0.5]


def suggestion(name: str, known, prefix: str = "") -> str:
  close = nearest(name, known)
  if not close:
    return "see jaxtrain/config/defaults.py (or docs/) for every field"
  return f"did you mean {' or '.join(prefix + c for c in close)}?"


def names(defaults: dict, prefix: str = "") -> set[str]:
  """Every field and section name of `defaults`, dotted: {"model", "model.n_layers", ...}."""
  out = set()
  for key, value in defaults.items():
    out.add(prefix + key)
    if isinstance(value, dict):
      out |= names(value, f"{prefix}{key}.")
  return out


def unknown_fields(cfg, defaults: dict) -> list[str]:
  """The names in `cfg` that the defaults do not have: the outermost one of an unknown section,
  and a field where the defaults have a section (or the other way round)."""
  known = names(defaults)
  found = []

  def walk(node, prefix: str, schema) -> None:
    for key, value in node.items():
      name = prefix + str(key)
      if name not in known:
        found.append(name)
      elif isinstance(value, dict | ml_collections.ConfigDict) and isinstance(schema[key], dict):
        walk(value, name + ".", schema[key])
  walk(cfg, "", defaults)
  return found


def message_of(e: BaseException) -> str:
  """An exception's message as one readable line: a KeyError's text without its quotes, and the
  KeyError that ml_collections wraps in an AttributeError unwrapped."""
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]
  text = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
  if isinstance(e, SyntaxError):
    text = e.msg
  return " ".join(str(text).split()) or type(e).__name__


def line_in(e: BaseException, path: str) -> int | None:
  """The line of `path` where `e` was raised (the innermost frame in that file)."""
  if isinstance(e, SyntaxError) and e.filename and os.path.abspath(e.filename) == path:
    return e.lineno
  found = None
  for frame, lineno in traceback.walk_tb(e.__traceback__):
    if os.path.abspath(frame.f_code.co_filename) == path:
      found = lineno
  return found


def locked_key(e: BaseException, defaults: dict) -> str | None:
  """The dotted name a config file asked a locked default ConfigDict for and that it lacks: the
  ConfigDict in ml_collections' innermost frame is matched to its section by its field names."""
  for frame, _ in reversed(list(traceback.walk_tb(e.__traceback__))):
    node = frame.f_locals.get("self")
    key = frame.f_locals.get("key", frame.f_locals.get("attribute"))  # [key] or .attribute
    if isinstance(node, ml_collections.ConfigDict) and isinstance(key, str):
      if key in node:  # raised for another reason (a wrong type)
        return None
      keys = set(node.keys())
      if keys == set(defaults):
        return key
      for section, schema in defaults.items():
        if isinstance(schema, dict) and keys == set(schema):
          return f"{section}.{key}"
      return None
  return None
