"""The package's shape: modules import leaf to root, stay small enough to read, use public JAX
APIs only, and pass the linter."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxtrain"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80


def _modules() -> dict[str, ast.Module]:
  return {p.stem: ast.parse(p.read_text(encoding="utf-8"), str(p))
          for p in sorted(PACKAGE.glob("*.py"))}


def _imports(tree: ast.Module, names: set[str]) -> set[str]:
  """The package's modules that `tree` imports anywhere, in functions too."""
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "jaxtrain":
        found |= {a.name for a in node.names if a.name in names}
      elif node.module.startswith("jaxtrain."):
        found.add(node.module.split(".")[1])
    elif isinstance(node, ast.Import):
      found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("jaxtrain.")}
  return found


def test_no_import_cycles():
  modules = _modules()
  graph = {name: _imports(tree, set(modules)) - {name, "__init__"}
           for name, tree in modules.items()}
  done, path = set(), []

  def visit(name: str) -> None:
    if name in path:
      cycle = path[path.index(name):] + [name]
      pytest.fail(f"import cycle: {' -> '.join(cycle)}")
    if name in done:
      return
    path.append(name)
    for dep in sorted(graph[name]):
      visit(dep)
    path.pop()
    done.add(name)

  for name in sorted(graph):
    visit(name)
  assert graph["config"] <= {"errors"}, f"config must stay a leaf: imports {graph['config']}"


def test_modules_and_functions_are_short():
  long = []
  for name, tree in _modules().items():
    lines = len((PACKAGE / f"{name}.py").read_text(encoding="utf-8").splitlines())
    if lines > MAX_MODULE_LINES:
      long.append(f"{name}.py: {lines} lines")
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES:
          long.append(f"{name}.py:{node.lineno} {node.name}: {n} lines")
  assert not long, long


def test_public_jax_apis_only_and_no_module_stand_ins():
  found = []
  for name, tree in _modules().items():
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax._src"):
        found.append(f"{name}.py:{node.lineno} from {node.module}")
      elif isinstance(node, ast.Import):
        found += [f"{name}.py:{node.lineno} import {a.name}" for a in node.names
                  if a.name.startswith("jax._src")]
      elif isinstance(node, ast.Attribute) and node.attr == "_src":
        found.append(f"{name}.py:{node.lineno} ._src")
      elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for t in targets:
          if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules":
            found.append(f"{name}.py:{node.lineno} writes sys.modules")
  assert not found, found


def test_ruff_check_is_clean():
  ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
  assert ruff, "ruff is not installed: pip install -e '.[test]' installs it"
  out = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
