"""The wheel also carries the run recipes of configs/, as jaxtrain/recipes/, so that an install
without the repository can name one: `jaxtrain --config=nano`. configs/ stays their one copy in the
repository (an editable install reads them there); everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
  def run(self) -> None:
    super().run()
    if self.editable_mode:
      return
    recipes = sorted(Path("configs").glob("*.py"))
    if not recipes:  # a wheel without them would fail its users at their first command
      raise SystemExit("error: configs/*.py not found: build from the repository or its sdist")
    target = Path(self.build_lib, "jaxtrain", "recipes")
    shutil.rmtree(target, ignore_errors=True)  # none left over from an earlier build
    self.mkpath(str(target))
    for path in recipes:
      self.copy_file(str(path), str(target / path.name))


setup(cmdclass={"build_py": BuildPy})
