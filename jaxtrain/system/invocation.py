"""How the user started this process, so that each command speaks of itself (and of the others)
as they typed it: `jaxtrain`, `jaxtrain-sample`, ... where an install's console script started
it, else `python -m jaxtrain`, `python -m jaxtrain.sample`, ... (from a clone, or a script)."""

import os
import sys

# Each command's module and its console script (pyproject.toml's [project.scripts]).
SCRIPTS = {"jaxtrain": "jaxtrain", "jaxtrain.sample": "jaxtrain-sample",
           "jaxtrain.export": "jaxtrain-export", "jaxtrain.chat": "jaxtrain-chat",
           "jaxtrain.eval": "jaxtrain-eval", "jaxtrain.compare": "jaxtrain-compare",
           "jaxtrain.sweep": "jaxtrain-sweep", "jaxtrain.lm_eval": "jaxtrain-lm_eval",
           "jaxtrain.serve": "jaxtrain-serve"}


def started(argv: list[str] | None = None) -> str | None:
  """What the interpreter ran: "-m <module>", "-c", "-" (stdin) or a script's path; None for an
  interactive interpreter. `argv`: the interpreter's own arguments (sys.orig_argv); a restart
  under another allocator keeps them."""
  argv = getattr(sys, "orig_argv", []) if argv is None else argv
  i = 1
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("-m"):
      return f"-m {arg[2:] or ''.join(argv[i + 1:i + 2])}"
    if arg.startswith("-c") or arg == "-":
      return arg[:2]
    if arg in ("-X", "-W"):
      i += 1
    elif not arg.startswith("-"):
      return arg
    i += 1
  return None


def script(argv: list[str] | None = None) -> str | None:
  """The name of the script the interpreter ran (`jaxtrain-sample`), or None."""
  ran = started(argv)
  return None if ran is None or ran.startswith("-") else os.path.basename(ran)


def command(module: str = "jaxtrain", argv: list[str] | None = None) -> str:
  """`module`'s command as this user runs the commands: its console script where one of
  jaxtrain's started this process, else `python -m module`."""
  if script(argv) in SCRIPTS.values() and module in SCRIPTS:
    return SCRIPTS[module]
  return f"python -m {module}"
