"""The package's shape: folders import one way, modules import without cycles, stay small enough
to read, use public JAX APIs only, and pass the linter; `benchmarks/` is held to the same size
rules."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxtrain"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80
# Lowest first: a folder imports only folders before it (and itself). The package's top-level
# modules (the loop, the commands, the public surface) may import every folder.
FOLDERS = ["system", "config", "core", "data", "checkpoints", "generation", "measure", "evals",
           "trackers", "loop", "tools"]


def _name(path: Path) -> str:
  """'jaxtrain.core.model' for jaxtrain/core/model.py, 'jaxtrain.core' for its __init__."""
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, tuple[Path, ast.Module]]:
  return {_name(p): (p, ast.parse(p.read_text(encoding="utf-8"), str(p)))
          for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.Module, known: set[str]) -> set[str]:
  """The package's modules that `tree` imports anywhere, in functions too."""
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
        and node.module.startswith("jaxtrain"):
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        found.add(sub if sub in known else node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("jaxtrain.")}
  return found & known


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(tree, set(modules)) - {name, "jaxtrain"}
          for name, (_, tree) in modules.items()}


def _folder(module: str) -> str | None:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else None


def test_every_folder_is_ranked_and_says_what_it_holds_and_may_import():
  folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
  assert folders == sorted(FOLDERS)
  for name in FOLDERS:
    doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
    assert doc and "May import:" in doc, f"jaxtrain/{name}/__init__.py: say what it may import"


def test_folders_import_only_lower_folders():
  wrong = []
  for module, deps in _graph().items():
    mine = _folder(module)
    if mine is None:
      continue  # the top level may import every folder
    for dep in deps:
      theirs = _folder(dep)
      if theirs is None:
        wrong.append(f"{module} imports {dep}: the package's top level sits above every folder")
      elif FOLDERS.index(theirs) > FOLDERS.index(mine):
        wrong.append(f"{module} imports {dep}: {theirs}/ is above {mine}/")
  assert not wrong, wrong


def test_no_import_cycles():
  graph = _graph()
  done, path = set(), []

  def visit(name: str) -> None:
    if name in path:
      cycle = path[path.index(name):] + [name]
      pytest.fail(f"import cycle: {' -> '.join(cycle)}")
    if name in done:
      return
    path.append(name)
    for dep in sorted(graph[name]):
      if not name.startswith(dep + "."):  # a module imports its own package's __init__
        visit(dep)
    path.pop()
    done.add(name)

  for name in sorted(graph):
    visit(name)


@pytest.mark.parametrize("where", ["jaxtrain", "benchmarks"])
def test_modules_and_functions_are_short(where):
  long = []
  for path in sorted((ROOT / where).glob("**/*.py")):
    if "results" in path.parts:
      continue
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    if len(text.splitlines()) > MAX_MODULE_LINES:
      long.append(f"{rel}: {len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text, str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES:
          long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
  assert not long, long


def test_public_jax_apis_only_and_no_module_stand_ins():
  found = []
  for name, (_, tree) in _modules().items():
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax._src"):
        found.append(f"{name}:{node.lineno} from {node.module}")
      elif isinstance(node, ast.Import):
        found += [f"{name}:{node.lineno} import {a.name}" for a in node.names
                  if a.name.startswith("jax._src")]
      elif isinstance(node, ast.Attribute) and node.attr == "_src":
        found.append(f"{name}:{node.lineno} ._src")
      elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for t in targets:
          if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules":
            found.append(f"{name}:{node.lineno} writes sys.modules")
  assert not found, found


def test_ruff_check_is_clean():
  ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
  assert ruff, "ruff is not installed: pip install -e '.[test]' installs it"
  out = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
