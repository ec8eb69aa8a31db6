"""The console scripts an install puts on PATH: `jaxtrain` runs what `python -m jaxtrain` runs,
`jaxtrain-sample` what `python -m jaxtrain.sample` runs, and so on for every command; and `tool`,
what the two-line modules at the package's top run (`python -m jaxtrain.sample`: tools/sample.py).

Each runs its module as `python -m` does (as `__main__`), so both spellings parse the same flags
and behave alike. Nothing heavy is imported here: `jaxtrain` may restart its process under another
allocator before jax is imported (jaxtrain/system/allocator.py).
"""

import importlib
import runpy
from collections.abc import Callable

from jaxtrain.system import exiting


def tool(module: str, before_jax: bool = False) -> None:
  """Runs `module`'s main as a command: output into a pipe whose reader left ends it quietly;
  `before_jax`: the exit handler installed before jax is imported (the command then ends without
  XLA's teardown)."""
  if before_jax:
    exiting.install()
  exiting.quiet_broken_pipe()
  importlib.import_module(module).main()


def _run(module: str) -> None:
  runpy.run_module(module, run_name="__main__", alter_sys=True)


def _command(module: str) -> Callable[[], None]:
  return lambda: _run(module)


train = _command("jaxtrain")
sample = _command("jaxtrain.sample")
export = _command("jaxtrain.export")
chat = _command("jaxtrain.chat")
eval = _command("jaxtrain.eval")  # named as its command, jaxtrain.eval
compare = _command("jaxtrain.compare")
sweep = _command("jaxtrain.sweep")
lm_eval = _command("jaxtrain.lm_eval")
serve = _command("jaxtrain.serve")
