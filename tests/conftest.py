"""Test setup: CPU only (unless JAXTRAIN_TEST_GPU=1), compiles made for tests, and one XLA compile
cache and token cache shared by the whole session.

Subprocess tests and pytest-xdist's workers inherit the same caches through the environment, so a
shape compiled once is never compiled again, in this process or another.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_CACHE = Path(os.environ.get("JAXTRAIN_TEST_CACHE") or Path(tempfile.gettempdir()) / "jaxtrain-test-cache")
# JAXTRAIN_TEST_GPU=1 leaves JAX its default (GPU) backend, for `pytest -m gpu tests/test_gpu.py`
# on a GPU machine; every other test expects the CPU.
if os.environ.get("JAXTRAIN_TEST_GPU") != "1":
  os.environ["JAX_PLATFORMS"] = "cpu"
  # Compiles at LLVM's lowest optimization level (XLA's own passes, and so each program's
  # fusions, stay as they are): the tests' tiny programs compile in ~40% less CPU time and run a
  # few steps each. Subprocesses inherit it; JAX_DISABLE_MOST_OPTIMIZATIONS=0 turns it off.
  os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE / "xla"))
# Two pytest-xdist workers and the processes the tests start share that cache: with a size limit
# jax takes a file lock around each read and write of it, so that none reads an entry another is
# still writing.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(16 << 30))
os.environ["JAXTRAIN_CACHE"] = str(_CACHE)

import jax  # noqa: E402  (after the environment above)

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_addoption(parser):
  parser.addoption("--all", action="store_true", default=False,
                   help="every tier: the slow one too (tests that train, spawn processes or compile for "
                        "seconds); CI runs it")


def _fast_tier_only(config) -> bool:
  """The default run leaves the slow tier out; --all, a marker expression (-m chooses for itself)
  or a test named by its id (FILE::NAME) runs what was asked."""
  return not (config.getoption("--all") or config.getoption("markexpr")
              or any("::" in str(arg) for arg in config.args))


def pytest_collection_modifyitems(config, items):
  if _fast_tier_only(config):
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
      config.hook.pytest_deselected(items=slow)
      items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.hookimpl(trylast=True)  # after the durations: the line before the counts
def pytest_terminal_summary(terminalreporter, config):
  if _fast_tier_only(config) and not hasattr(config, "workerinput"):
    terminalreporter.write_line("the fast tier ran; the tests marked slow (they train, spawn "
                                "processes or compile for seconds) were left out: `python -m pytest "
                                "--all` runs every test, as CI does; `-m slow` only those")


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
  """~60 KB of English-like text made from a fixed seed: enough for tiny models to learn."""
  words = ("the quick brown fox jumps over a lazy dog while seven wise kings count golden "
           "coins and sing about rivers mountains and the endless sea").split()
  rng = __import__("numpy").random.default_rng(1234)
  lines = []
  for _ in range(1200):
    n = int(rng.integers(5, 12))
    lines.append(" ".join(words[i] for i in rng.integers(0, len(words), n)).capitalize() + ".")
  path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


@pytest.fixture
def tiny(corpus_file, tmp_path):
  """A tiny config on the test corpus, writing into this test's own directory."""
  from jaxtrain.testing import tiny_config

  return tiny_config(**{"workdir": str(tmp_path / "run"), "data.path": str(corpus_file),
                        "headless": True})


def with_root_on_path(env: dict | None = None) -> dict:
  """`env` (default: this process's) with the repository root first on PYTHONPATH and the
  caller's entries kept after it (a package brought in through PYTHONPATH stays importable)."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  return env


def run_cli(*args: str, timeout: float = 300, env: dict | None = None):
  """`python -m jaxtrain ARGS` in a subprocess, bounded in time; returns CompletedProcess."""
  import subprocess

  full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
  return subprocess.run([sys.executable, "-m", "jaxtrain", *args], cwd=ROOT, env=full_env,
                        capture_output=True, text=True, timeout=timeout)


def not_public(code: str) -> list[str]:
  """What Python `code` takes of jaxtrain besides its public names (`jaxtrain.__all__`, reached
  as `import jaxtrain [as jt]` then `jt.NAME`, or `from jaxtrain import NAME`): jaxtrain's
  modules it imports, and the names it reads that are not public. IPython's `%` and `!` lines
  are left out."""
  import ast

  import jaxtrain

  public = {*jaxtrain.__all__, "__version__", "__file__", "__doc__"}
  lines = [line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))]
  tree = ast.parse("\n".join(lines))
  aliases, found = set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [f"import {a.name}" for a in node.names if a.name.startswith("jaxtrain.")]
      aliases |= {a.asname or a.name for a in node.names if a.name == "jaxtrain"}
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jaxtrain":
      found += [f"from {node.module} import {a.name}" for a in node.names
                if node.module != "jaxtrain" or a.name not in public]
  found += [f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and node.attr not in public]
  return found
