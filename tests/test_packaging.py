"""What an install gets: the wheel built from the repository holds every file of jaxtrain/ and the
recipes of configs/, a console script for every `python -m jaxtrain[.X]` command, and a fresh
virtual environment outside the checkout that installs the wheel, as a user does, trains with it;
the wheel and the sdist carry the LICENSE that pyproject.toml names."""

import ast
import configparser
import os
import runpy
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from jaxtrain import commands

ROOT = Path(__file__).resolve().parents[1]


def _files() -> list[str]:
  """The checkout's tracked files, and new ones (not ignored) of the package and the recipes: a
  fresh clone with your changes."""
  if shutil.which("git") is None or not (ROOT / ".git").exists():
    pytest.skip("not a git checkout: no list of the repository's files")

  def listed(*args: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, check=True)
    return {n for n in out.stdout.decode().split("\0") if n and (ROOT / n).is_file()}

  return sorted(listed() | listed("--others", "--exclude-standard", "--", "jaxtrain", "configs"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
  """The wheel, built (a few seconds) from a copy of the checkout's files, so nothing left in its
  build/ folder can slip in."""
  src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
  for name in _files():
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / name, src / name)
  proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                         "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (path,) = out.glob("jaxtrain-*.whl")
  return path


def _commands() -> dict[str, str]:
  """Each `python -m` command (a module of the package's top level that runs as __main__) and the
  console script that should run it: jaxtrain for jaxtrain/__main__.py, jaxtrain-X for X.py."""
  found = {}
  for path in sorted((ROOT / "jaxtrain").glob("*.py")):
    if 'if __name__ == "__main__":' in path.read_text():
      module = "jaxtrain" if path.stem == "__main__" else f"jaxtrain.{path.stem}"
      found[module.replace(".", "-")] = module
  return found


@pytest.mark.slow
def test_the_wheel_holds_every_file_of_the_package_and_the_recipes(wheel):
  names = zipfile.ZipFile(wheel).namelist()
  tree = {n for n in _files() if n.startswith("jaxtrain/")}
  recipes = {f"jaxtrain/recipes/{Path(n).name}" for n in _files()
             if n.startswith("configs/") and n.endswith(".py")}
  packaged = {n for n in names if n.startswith("jaxtrain/")}
  assert len(recipes) >= 5 and {"jaxtrain/__main__.py", "jaxtrain/core/model.py"} <= tree
  assert sorted((tree | recipes) - packaged) == [], "missing from the wheel"
  assert sorted(packaged - tree - recipes) == [], "in the wheel, but not in the tree"
  assert {n.split("/")[0] for n in names} == {"jaxtrain", wheel.name.split("-py3")[0] + ".dist-info"}


@pytest.mark.slow
def test_the_wheel_and_the_sdist_carry_the_license_that_pyproject_names(wheel, tmp_path):
  text = (ROOT / "LICENSE").read_text()
  assert "Apache License" in text and "Version 2.0, January 2004" in text and len(text) > 10_000
  assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
  with zipfile.ZipFile(wheel) as z:
    (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
    assert "License-Expression: Apache-2.0" in z.read(meta).decode()
    assert z.read(meta.replace("METADATA", "licenses/LICENSE")).decode() == text
  src = tmp_path / "src"  # a fresh clone with your changes, as the wheel is built from
  for name in _files():
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / name, src / name)
  code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
  proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=src, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with tarfile.open(tmp_path / proc.stdout.split()[-1]) as t:
    (member,) = [m for m in t.getnames() if m.count("/") == 1 and m.endswith("/LICENSE")]
    assert t.extractfile(member).read().decode() == text


@pytest.mark.slow
def test_every_command_has_its_console_script(wheel, monkeypatch):
  (entry_points,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("entry_points.txt")]
  parser = configparser.ConfigParser()
  parser.read_string(zipfile.ZipFile(wheel).read(entry_points).decode())
  scripts = dict(parser["console_scripts"])
  expected = _commands()
  assert sorted(scripts) == sorted(expected) and len(expected) >= 7, scripts
  for script, target in scripts.items():
    module_name, function = target.split(":")
    assert module_name == "jaxtrain.commands", target
    ran = []  # the module each runs as __main__ (what `python -m MODULE` runs)
    monkeypatch.setattr(runpy, "run_module", lambda module, ran=ran, **kwargs: ran.append(module))
    getattr(commands, function)()
    assert ran == [expected[script]], f"{script} runs {ran}, not {expected[script]}"


def test_every_command_knows_its_console_script_by_name():
  """system/invocation.py names each command as the user typed it (`jaxtrain-serve --help` says
  `usage: jaxtrain-serve`): its table holds every command of the package."""
  from jaxtrain.system import invocation

  assert invocation.SCRIPTS == {module: script for script, module in _commands().items()}


def test_no_module_imports_a_test_only_package_at_import_time():
  """The training install leaves out the [test] extra: torch, transformers, pytest and the like
  may only be imported inside functions of tests, never by a jaxtrain module when it loads."""
  test_only = {"torch", "transformers", "pytest", "hypothesis", "nbclient", "nbformat",
               "ipykernel", "tensorboard", "wandb", "ruff", "setuptools"}
  found = []
  # Written into exports as their modeling file (transformers loads it there); jaxtrain never
  # imports it.
  written_only = {ROOT / "jaxtrain" / "checkpoints" / "hf_modeling.py"}
  for path in sorted(set((ROOT / "jaxtrain").rglob("*.py")) - written_only):
    for node in ast.parse(path.read_text()).body:  # module level only
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module or ""] if isinstance(node, ast.ImportFrom) else []
      found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                if n.split(".")[0] in test_only]
  assert not found, found


def test_only_the_http_app_imports_the_serve_extra():
  """A training install leaves out the [serve] extra: FastAPI, uvicorn and starlette load only
  with jaxtrain/serving/app.py, which jaxtrain-serve imports after checking they are there."""
  extra = {"fastapi", "uvicorn", "starlette"}
  found = []
  for path in sorted((ROOT / "jaxtrain").rglob("*.py")):
    for node in ast.parse(path.read_text()).body:  # module level only
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module or ""] if isinstance(node, ast.ImportFrom) else []
      found += [f"{path.relative_to(ROOT)}" for n in names if n.split(".")[0] in extra]
  assert set(found) == {"jaxtrain/serving/app.py"}, found


def _user_env(venv: Path) -> dict:
  """The environment of a user whose only jaxtrain is the venv's: no PYTHONPATH, no other venv;
  the test caches (tokens, compiled programs) are kept."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
  bins = [p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT))]
  return dict(env, PATH=os.pathsep.join([str(venv / "bin"), *bins]), VIRTUAL_ENV=str(venv),
              PYTHONUNBUFFERED="1")


def _jax_stack(python: str, env: dict) -> dict[str, str]:
  listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], env=env,
                          capture_output=True, text=True, check=True).stdout.split()
  pins = dict(line.lower().split("==", 1) for line in listed if "==" in line)
  return {name: pins.get(name) for name in ("jax", "jaxlib", "flax", "numpy")}


@pytest.mark.slow
@pytest.mark.newest
def test_a_fresh_install_of_the_wheel_trains_outside_the_checkout(wheel, tmp_path, corpus_file):
  """A user's venv that already holds this environment's jax and flax, then `pip install
  jaxtrain-*.whl` (the other dependencies from pip's cache or the index, as a user gets them):
  the user's JAX stays as it was, and the commands run from another directory."""
  venv, home = tmp_path / "venv", tmp_path / "elsewhere"
  home.mkdir()
  took = {}
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  env = _user_env(venv)
  python = str(venv / "bin" / "python")
  ours = _jax_stack(sys.executable, os.environ)
  users = [f"{name}=={version}" for name, version in ours.items()]
  for what in (users, [str(wheel)]):
    install = subprocess.run([python, "-m", "pip", "install", "-q", *what], env=env, cwd=home,
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
  assert _jax_stack(python, env) == ours  # nothing of the user's JAX up- or downgraded
  took["venv and install"] = time.perf_counter() - start

  def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), env=env, cwd=home, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc

  where = run(python, "-c", "import jaxtrain, sys; print(jaxtrain.__file__); print(*sys.path)")
  module_file, path = where.stdout.splitlines()
  assert module_file.startswith(str(venv)), module_file
  assert str(ROOT) not in path and sys.prefix not in path, path  # not the checkout, nor its venv
  recipes = Path(module_file).parent / "recipes"
  for help_command in ([python, "-m", "jaxtrain", "--help"], ["jaxtrain", "--help"]):
    shown = run(*help_command).stdout
    assert f"Recipes, in {recipes}: " in " ".join(shown.split())
    # Each speaks of itself as it was started, and names a file the install has.
    assert shown.startswith(f"usage: {' '.join(help_command[:-1]).replace(python, 'python')} ")
    defaults = shown.split("Every field with its default: ")[1].split()[0]
    assert defaults.startswith(str(venv)) and Path(defaults).is_file(), defaults
  start = time.perf_counter()
  for script in sorted(_commands()):
    assert run(script, "--help").stdout.startswith(f"usage: {script} "), script
  took["each command's --help"] = time.perf_counter() - start

  start = time.perf_counter()
  tiny = ["--config.model.n_layers=1", "--config.model.d_model=32", "--config.model.n_heads=2",
          "--config.model.seq_len=32", "--config.train.batch_size=4", "--config.train.max_steps=5",
          "--config.train.eval_every=5", "--config.train.eval_steps=1", "--config.headless=True",
          "--config.train.checkpoint_every=5", "--config.sample.num_samples=1",
          "--config.sample.max_new_tokens=8", f"--config.data.path={corpus_file}"]
  trained = run("jaxtrain", "--config=nano", *tiny)
  assert "done: step 5" in trained.stdout and (home / "runs" / "nano" / "checkpoints" / "5").is_dir()
  sampled = run("jaxtrain-sample", "--workdir=runs/nano", "--prompt=The ", "--max_new_tokens=8")
  assert sampled.stdout.startswith("The ")
  took["train 5 steps and sample"] = time.perf_counter() - start
  print(", ".join(f"{k}: {v:.1f}s" for k, v in took.items()))
