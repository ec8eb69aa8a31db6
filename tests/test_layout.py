"""The package's shape: folders import one way, modules import without cycles and keep their names
on import, stay small enough to read, use public JAX APIs only, and pass the linter; `benchmarks/`
is held to the same size rules. docs/layout.md names every module, and every path
(jaxtrain/loop/feed.py) or dotted name (jaxtrain.loop.feed.DeviceFeed) of the package in the code's
docstrings and comments exists (test_docs.py holds the docs to the same rule)."""

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxtrain"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80
# Lowest first: a folder imports only folders before it (and itself). The package's top-level
# modules (the loop, the commands, the public surface) may import every folder.
FOLDERS = ["system", "config", "core", "data", "checkpoints", "generation", "serving", "measure",
           "evals", "trackers", "loop", "tools"]


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


def test_modules_keep_their_names_on_import():
  """`from jaxtrain.data import documents` reads as `documents.x` everywhere; a `_lib` suffix is the
  one other name, for a module whose name a local takes (`model as model_lib`)."""
  modules = _modules()
  renamed = []
  for name, (_, tree) in modules.items():
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxtrain"):
        pairs = [(f"{node.module}.{a.name}", a.asname) for a in node.names]
      elif isinstance(node, ast.Import):
        pairs = [(a.name, a.asname) for a in node.names]
      else:
        continue
      for module, alias in pairs:
        own = module.rsplit(".", 1)[-1]
        if module in modules and alias and alias not in (own, f"{own}_lib"):
          renamed.append(f"{name}:{node.lineno} {module} as {alias}")
  assert not renamed, renamed


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
  out = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def _layout_rows() -> dict[str, set[str]]:
  """docs/layout.md's tables: {"loop": the names in backticks of its row, ...; "": the files at the
  package's top}."""
  rows: dict[str, set[str]] = {"": set()}
  for line in (ROOT / "docs" / "layout.md").read_text(encoding="utf-8").splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 3 and re.fullmatch(r"`\w+/`", cells[0]):
      rows[cells[0].strip("`/")] = set(re.findall(r"`(\w+)`", cells[2]))
    elif len(cells) == 2 and cells[0].startswith("`"):
      rows[""] |= set(re.findall(r"`([\w.]+\.py)`", cells[0]))
  return rows


def test_layout_md_names_every_module():
  rows = _layout_rows()
  missing = []
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1:
      if rel.name not in rows[""]:
        missing.append(f"{rel} (the table of the package's top)")
    elif rel.name != "__init__.py" and rel.stem not in rows.get(rel.parts[0], set()):
      missing.append(f"{rel} (the row of {rel.parts[0]}/)")
  assert sorted(rows) == sorted(["", *FOLDERS]), f"docs/layout.md's folders: {sorted(rows)}"
  assert not missing, f"docs/layout.md does not name: {missing}"


# A path of the package, a folder too (a URL's or a cache directory's ".../jaxtrain/..." aside).
SLASH_PATH = re.compile(r"(?<![\w/.~-])jaxtrain/[\w/.]*\w/?")
# A module, or a name one defines: jaxtrain.train, jaxtrain.system.runtime.MAX_IN_FLIGHT, jaxtrain.Hook
DOTTED_NAME = re.compile(r"(?<![\w/.-])jaxtrain(?:\.[A-Za-z_]\w*)+")
# The repository's name where it is hosted (a placeholder), and a file of nanoGPT's.
# Not paths of this tree: a repeated name, nanoGPT's config, the recipes' folder inside a wheel
# (setup.py makes it at build time).
NOT_PATHS = {"jaxtrain/jaxtrain", "config/train_shakespeare_char.py", "jaxtrain/recipes/"}
# A module named from its folder: loop/feed.py, checkpoints/store.py.
FOLDER_PATH = re.compile(rf"(?<![\w/.~-])(?:{'|'.join(FOLDERS)})/\w+\.py\b")


def _top_level_names(path: Path) -> set[str]:
  """What a module defines or imports at its top (for the package's __init__, its lazy exports)."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
      if isinstance(node.value, ast.Dict) and path == PACKAGE / "__init__.py":
        names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
  return names


def _exists(dotted: str) -> bool:
  """Whether a dotted name is a module of the package, or a name one defines at its top."""
  folder = PACKAGE
  parts = dotted.split(".")[1:]
  for i, part in enumerate(parts):
    if (folder / part / "__init__.py").exists():
      folder = folder / part
    elif (folder / f"{part}.py").exists():
      rest = parts[i + 1:]
      return not rest or rest[0] in _top_level_names(folder / f"{part}.py")
    else:
      return part.startswith("__") or part in _top_level_names(folder / "__init__.py")
  return True


def missing_names(text: str) -> list[str]:
  """The paths (from the repository or from the package) and dotted names of the package in
  `text` that name nothing that exists."""
  slash = [m for m in SLASH_PATH.findall(text)
           if m not in NOT_PATHS and not (ROOT / m.rstrip("/.")).exists()]
  in_folder = [m for m in FOLDER_PATH.findall(text) if m not in NOT_PATHS and not (PACKAGE / m).exists()]
  return slash + in_folder + [m for m in DOTTED_NAME.findall(text) if not _exists(m)]


def _prose(path: Path) -> str:
  """A module's docstrings and comments."""
  text = path.read_text(encoding="utf-8")
  docs = [ast.get_docstring(n) or "" for n in ast.walk(ast.parse(text))
          if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
  comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
              if t.type == tokenize.COMMENT]
  return "\n".join(docs + comments)


def test_paths_and_names_in_docstrings_and_comments_exist():
  """A module that moved leaves no stale path behind in the code that names it."""
  wrong = []
  for where in ("jaxtrain", "benchmarks", "tests", "configs"):
    for path in sorted((ROOT / where).glob("**/*.py")):
      if "results" not in path.parts:
        wrong += [f"{path.relative_to(ROOT)}: {m}" for m in sorted(set(missing_names(_prose(path))))]
  assert not wrong, wrong
