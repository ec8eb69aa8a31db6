"""The console scripts an install puts on PATH: `jaxtrain` runs what `python -m jaxtrain` runs,
`jaxtrain-sample` what `python -m jaxtrain.sample` runs, and so on for every command.

Each runs its module as `python -m` does (as `__main__`), so both spellings parse the same flags
and behave alike. Nothing heavy is imported here: `jaxtrain` may restart its process under another
allocator before jax is imported (jaxtrain/system/allocator.py).
"""

import runpy


def _run(module: str) -> None:
  runpy.run_module(module, run_name="__main__", alter_sys=True)


def train() -> None:
  _run("jaxtrain")


def sample() -> None:
  _run("jaxtrain.sample")


def export() -> None:
  _run("jaxtrain.export")


def chat() -> None:
  _run("jaxtrain.chat")


def eval() -> None:  # named as its command, jaxtrain.eval
  _run("jaxtrain.eval")


def compare() -> None:
  _run("jaxtrain.compare")


def sweep() -> None:
  _run("jaxtrain.sweep")
