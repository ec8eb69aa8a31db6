"""The JAX stack: the versions a run names in its first line are the installed ones, and a flax too
old for the installed jax is refused with the pip command that mends it (the pairs in the table
were each installed and run: docs/install.md#which-jax)."""

import importlib.metadata

import flax
import jax
import pytest
from conftest import run_cli

from jaxtrain.system import stack

pytestmark = pytest.mark.newest


@pytest.mark.parametrize("jax_version, flax_version, need", [
    ("0.10.2", "0.12.8", None), ("0.11.0", "0.12.8", None), ("0.11.1", "0.12.8", "0.12.9"),
    ("0.11.1", "0.12.9", None), ("0.11.2", "0.12.9", "0.12.10"), ("0.11.2", "0.12.10", None),
    ("0.12.0.1", "0.12.8", "0.12.10"), ("0.12.0.1", "0.12.12", None)])
def test_a_flax_too_old_for_the_jax_is_named_with_its_fix(jax_version, flax_version, need):
  problem = stack.mismatch({"jax": jax_version, "flax": flax_version})
  if need is None:
    assert problem is None
  else:
    assert problem == (f"flax {flax_version} does not work with jax {jax_version} (flax {need} or "
                       f"newer does): pip install 'flax>={need}'")


def test_the_installed_pair_passes_and_is_named_as_installed():
  found = stack.versions()
  assert found["jax"] == jax.__version__ == importlib.metadata.version("jax")
  assert found["flax"] == flax.__version__
  assert stack.mismatch(found) is None
  assert stack.line(found).startswith(f"jax {jax.__version__}")
  assert stack.line(found).endswith(f"flax {flax.__version__}")
  assert stack.line({"jax": "0.12.0.1", "jaxlib": "0.12.0", "flax": "0.12.12"}) == \
      "jax 0.12.0.1, jaxlib 0.12.0, flax 0.12.12"


@pytest.mark.slow
def test_a_run_names_the_versions_it_runs_on_in_its_header_line(tmp_path):
  """The header a run starts with (a dry run prints the resolved config before it)."""
  done = run_cli("--config=configs/nano.py", "--dry_run", f"--config.workdir={tmp_path / 'run'}")
  assert done.returncode == 0, done.stderr[-2000:]
  header = next(line for line in done.stdout.splitlines() if line.startswith("jaxtrain "))
  assert f"| jax {jax.__version__}, flax {flax.__version__} |" in header, header
