"""The public surface: `import jaxtrain` is cheap, every exported name resolves, and the documented
unit-test example (docs/testing-api.md) passes as written, using nothing but that surface and jax."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxtrain

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "testing-api.md"]
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "grain", "ml_collections", "matplotlib")


def test_import_is_cheap_and_loads_jax_on_first_use():
  probe = (
      "import json, sys\n"
      f"heavy = {HEAVY!r}\n"
      "loaded = lambda: sorted({m.split('.')[0] for m in sys.modules} & set(heavy))\n"
      "import jaxtrain\n"
      "at_import = loaded()\n"
      "version = jaxtrain.__version__\n"
      "jaxtrain.train_step\n"
      "print(json.dumps([at_import, version, loaded()]))\n")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  at_import, version, after_use = json.loads(out.stdout.splitlines()[-1])
  assert at_import == [], f"`import jaxtrain` imported {at_import} eagerly"
  assert version == jaxtrain.__version__
  assert "jax" in after_use  # the probe does see heavy imports: the empty list above is real


def test_every_exported_name_resolves():
  assert len(jaxtrain.__all__) == len(set(jaxtrain.__all__))
  missing = [name for name in jaxtrain.__all__ if getattr(jaxtrain, name, None) is None]
  assert not missing, f"jaxtrain.__all__ names that do not resolve: {missing}"
  assert set(jaxtrain.__all__) <= set(dir(jaxtrain))
  namespace: dict = {}
  exec("from jaxtrain import *", namespace)
  assert set(jaxtrain.__all__) <= set(namespace)
  with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
    jaxtrain.not_a_name  # noqa: B018


def _test_blocks(markdown: str) -> list[str]:
  blocks = re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)
  return [b for b in blocks if "def test_" in b and "jaxtrain" in b]


def readme_example() -> tuple[Path, str]:
  """The first unit-test example of the README, or else of the testing page."""
  for path in DOCS:
    if blocks := _test_blocks(path.read_text(encoding="utf-8")):
      return path, blocks[0]
  pytest.fail(f"no python test block in {[p.name for p in DOCS]}")


def test_readme_example_uses_only_the_public_api():
  path, code = readme_example()
  tree = ast.parse(code)
  aliases = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        assert a.name.split(".")[0] == "jax" or a.name == "jaxtrain", \
            f"{path.name} imports {a.name}"
        if a.name == "jaxtrain":
          aliases.add(a.asname or a.name)
    elif isinstance(node, ast.ImportFrom):
      assert node.module == "jaxtrain" or node.module.split(".")[0] == "jax", \
          f"{path.name} imports from {node.module}"
      if node.module == "jaxtrain":
        assert {a.name for a in node.names} <= set(jaxtrain.__all__)
  used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
          and isinstance(node.value, ast.Name) and node.value.id in aliases}
  assert aliases and used, f"{path.name}'s example does not use jaxtrain"
  assert used <= set(jaxtrain.__all__), f"not public: {sorted(used - set(jaxtrain.__all__))}"


@pytest.mark.slow
def test_readme_example_passes_as_written(tmp_path):
  path, code = readme_example()
  (tmp_path / "test_example.py").write_text(code, encoding="utf-8")
  # Its own pytest.ini: the example runs as in a user's project, without this repo's conftest.
  (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "test_example.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and re.search(r"\b1 passed\b", out.stdout), \
      f"the example from {path.name} failed:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}"
