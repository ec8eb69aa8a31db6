"""Every notebook in notebooks/ runs top to bottom (in smoke mode), and is stored without outputs.

The kernel must be this interpreter: the "python3" kernelspec found on the machine may belong to
another Python, which would test some other install of jaxtrain. A kernelspec of our own, pointing
at sys.executable, is put first on JUPYTER_PATH. The kernel inherits os.environ, so conftest's
JAX_PLATFORMS and caches apply inside the notebooks too.
"""

import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import not_public
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL_NAME = "jaxtrain-pytest"
CELL_TIMEOUT_S = 600
NOTEBOOK_TIMEOUT_S = 900  # the whole notebook, every cell together
SKIP_DIRS = {"runs", "build", "dist", "node_modules", "__pycache__"}


@pytest.fixture
def kernel_env(tmp_path, monkeypatch) -> Path:
  """A kernelspec for sys.executable, first on JUPYTER_PATH, and the notebooks' smoke switch."""
  spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
  spec_dir.mkdir(parents=True)
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": f"pytest ({sys.executable})", "language": "python"}
  (spec_dir / "kernel.json").write_text(json.dumps(spec))
  monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
      [str(tmp_path / "jupyter"), *filter(None, [os.environ.get("JUPYTER_PATH")])]))
  monkeypatch.setenv("JAXTRAIN_NOTEBOOK_SMOKE", "1")
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # notebooks' temporary runs land where pytest prunes
  monkeypatch.delenv("MPLBACKEND", raising=False)  # plots go to the inline backend, as in Jupyter
  return tmp_path


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
  """Runs every cell in a fresh kernel; raises nbclient's error for the first cell that fails."""
  deadline = time.monotonic() + NOTEBOOK_TIMEOUT_S

  def cell_timeout(cell) -> int:
    # Per cell, but never past the notebook's own deadline.
    return max(1, int(min(CELL_TIMEOUT_S, deadline - time.monotonic())))

  client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout_func=cell_timeout,
                          startup_timeout=600, resources={"metadata": {"path": str(cwd)}})
  return client.execute()


def load_unexecuted(path: Path) -> nbformat.NotebookNode:
  return nbformat.read(path, as_version=4)


@pytest.mark.slow
def test_the_kernel_is_this_python_with_this_environment(kernel_env):
  probe = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
      "import os, sys\nprint(sys.executable)\nprint(os.environ['JAX_PLATFORMS'])\n"
      "print(os.environ['JAXTRAIN_CACHE'])\nprint(os.environ['JAXTRAIN_NOTEBOOK_SMOKE'])\n"
      "print(os.getcwd())")])
  out = execute(probe, ROOT / "notebooks")
  lines = "".join(o.text for o in out.cells[0].outputs if o.output_type == "stream").splitlines()
  assert lines == [sys.executable, os.environ["JAX_PLATFORMS"], os.environ["JAXTRAIN_CACHE"], "1",
                   str(ROOT / "notebooks")]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_env, record_property):
  nb = load_unexecuted(path)
  t0 = time.perf_counter()
  try:
    # The notebooks' own directory, as Jupyter and Colab start them; they find the repo from there.
    execute(nb, path.parent)
  except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
    error = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the kernel's traceback comes colored
    pytest.fail(f"{path.name} failed after {time.perf_counter() - t0:.1f}s:\n{error}",
                pytrace=False)
  seconds = time.perf_counter() - t0
  record_property("execution_s", round(seconds, 1))
  print(f"{path.name}: executed in {seconds:.1f}s")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_uses_only_jaxtrains_public_names(path: Path):
  code = "\n".join(c.source for c in load_unexecuted(path).cells if c.cell_type == "code")
  assert not not_public(code), f"{path.name} uses jaxtrain's insides: {not_public(code)}"


def _all_notebooks() -> list[Path]:
  found = []
  for dirpath, dirnames, filenames in os.walk(ROOT):
    # Skip hidden dirs (.git, .venv, .ipynb_checkpoints), virtualenvs and run outputs.
    dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS
                   and not d.endswith(".egg-info") and not Path(dirpath, d, "pyvenv.cfg").exists()]
    found += [Path(dirpath, f) for f in filenames if f.endswith(".ipynb")]
  return sorted(found)


ALL_NOTEBOOKS = _all_notebooks()


def test_notebooks_exist():
  assert NOTEBOOKS, "notebooks/ has no notebooks"
  assert set(NOTEBOOKS) <= set(ALL_NOTEBOOKS)


@pytest.mark.parametrize("path", ALL_NOTEBOOKS,
                         ids=[str(p.relative_to(ROOT)) for p in ALL_NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path):
  nb = load_unexecuted(path)
  nbformat.validate(nb)
  dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
           and (cell.get("outputs") or cell.get("execution_count") is not None)]
  assert not dirty, (f"{path.relative_to(ROOT)}: cells {dirty} have outputs or execution counts; "
                     "clear them (Jupyter: Clear All Outputs, then save)")


@pytest.mark.parametrize("name", ["quickstart.ipynb", "unit_testing_train_steps.ipynb"])
def test_the_install_cell_asks_for_a_restart_only_for_what_this_session_imported(name):
  """The install cell's check after `pip install`: a package the session had imported whose
  version pip changed is named (a restart needed); a changed package nobody imported, or an
  unchanged one, is not (Colab's in-range jax left alone means no restart)."""
  cell = next(c for c in load_unexecuted(ROOT / "notebooks" / name).cells
              if "JAXTRAIN_REPO" in c.source)
  defs = cell.source.split("\nif importlib.util.find_spec")[0]  # its imports and functions, not the install
  space: dict = {}
  exec(compile(defs, name, "exec"), space)
  numpy, jax_version = sys.modules["numpy"].__version__, space["versions"]()["jax"]
  before = {"numpy": "1.0", "jax": jax_version, "not-imported-here": "1.0"}
  after = {"numpy": numpy, "jax": jax_version, "not-imported-here": "2.0"}
  assert space["imported_and_changed"](before, after) == [f"numpy 1.0 -> {numpy}"]
  assert space["imported_and_changed"](after, after) == []
