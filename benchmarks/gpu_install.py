"""The GPU side by side's first part: jaxtrain installed as a user installs it, and the versions
every later part runs with.

`gpu_side_by_side.py --part=install` runs `pip install '.[cuda13-local]'` (`--extra`) with the
machine's own Python; pip resolves the dependencies and keeps what is installed where it meets
pyproject.toml's ranges. A machine with no network gets `--wheels=DIR` as well (pip then adds
`--no-index --find-links=DIR`): the wheels jaxtrain needs beyond what the machine holds, made
beforehand where there is a network:

  python benchmarks/gpu_install.py --download=.gpu/wheels

(cp312 wheels for x86-64 Linux: BEYOND_THE_IMAGE with their dependencies, and the build backend).
Where pip cannot install that way, the part says so, installs the carried wheels and jaxtrain with
`--no-deps` instead, and the report marks the run as not installed as a user installs it.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reports  # noqa: E402  (after the path above)
from gpu_runs import Setup, timed  # noqa: E402

# jaxtrain's dependencies that the lent H200's image lacks (it holds jax with its CUDA 13 plugin,
# flax, optax, orbax-checkpoint, numpy, pyarrow, tokenizers, tiktoken, safetensors, matplotlib).
BEYOND_THE_IMAGE = ("grain", "ml-collections", "cmeel-mimalloc")
IMAGE_HOLDS = ("numpy",)  # asked for by those too; too large to carry, and there already
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
# Whose versions a part records: the stack, the CUDA plugin, and what else the numbers ran on.
VERSIONED = ("jaxtrain", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy",
             "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt",
             "nvidia-cudnn-cu13", "nvidia-cublas", "torch", "triton")


def requirements(names: tuple[str, ...]) -> list[str]:
  """pyproject.toml's requirements of `names` (their ranges as jaxtrain states them), and its
  build backend's."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())
  name = lambda req: re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower()
  return [r.split(";")[0].strip() for r in project["project"]["dependencies"] if name(r) in names] \
      + project["build-system"]["requires"]


def download_command(dest: Path) -> list[str]:
  return [sys.executable, "-m", "pip", "download", f"--dest={dest}", "--only-binary=:all:",
          "--python-version=3.12", "--implementation=cp", "--abi=cp312",
          *[f"--platform={p}" for p in PLATFORMS], *requirements(BEYOND_THE_IMAGE)]


def download(dest: Path) -> list[Path]:
  """The wheels to carry, in `dest`: BEYOND_THE_IMAGE with their dependencies, less IMAGE_HOLDS."""
  dest.mkdir(parents=True, exist_ok=True)
  subprocess.run(download_command(dest), check=True)
  for wheel in dest.glob("*.whl"):
    if wheel.name.split("-")[0].lower().replace("_", "-") in IMAGE_HOLDS:
      wheel.unlink()
  return sorted(dest.glob("*.whl"))


def install_command(s: Setup) -> list[str]:
  """`pip install '.[extra]'` as a user runs it; from the carried wheels alone with --wheels. The
  smoke run only resolves jaxtrain itself (`--dry-run --no-deps`): it installs nothing."""
  cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
  if s.smoke:
    cmd += ["--dry-run", "--no-deps", "--no-build-isolation"]
  if s.wheels:
    cmd += ["--no-index", f"--find-links={s.wheels}"]
  return [*cmd, f".[{s.extra}]" if s.extra else "."]


def part_install(s: Setup) -> dict:
  cmd = install_command(s)
  wall, lines, status = timed(cmd, ROOT, s.out / "logs" / "install.log", check=False)
  record = {"command": cmd, "exit_status": status, "wall_s": wall, "as_a_user": status == 0,
            "tail": [line for _, line in lines[-15:]]}
  if status != 0 and s.wheels and not s.smoke:  # the parts still run, on what is there
    wheels = sorted(str(w) for w in Path(s.wheels).glob("*.whl"))
    fallback = [*cmd[:4], "--no-deps", "--no-index", *wheels, "."]
    _, lines, status = timed(fallback, ROOT, s.out / "logs" / "install_no_deps.log", check=False)
    record["fallback"] = {"command": fallback, "exit_status": status,
                          "tail": [line for _, line in lines[-15:]]}
  record["versions"] = versions()
  return record


_VERSIONS = """
import importlib.metadata as m, json, sys
found = {}
for name in sys.argv[1:]:
  try:
    found[name] = m.version(name)
  except m.PackageNotFoundError:
    pass
import jax
found["devices"] = [str(d) for d in jax.devices()]
found["environment"] = jax.print_environment_info(return_string=True)
print(json.dumps(found))
"""


def versions() -> dict:
  """What the parts run with, read by a fresh process (after an install): VERSIONED, jax's
  devices and environment report, the GPU, its driver and CUDA version, the CPU, Python."""
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  out = subprocess.run([sys.executable, "-c", _VERSIONS, *VERSIONED], capture_output=True,
                       text=True, env=env, cwd="/")  # not the checkout: the installed jaxtrain
  found = json.loads(out.stdout.splitlines()[-1]) if out.returncode == 0 else \
      {"error": out.stderr.strip().splitlines()[-1:]}
  smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True) if _has("nvidia-smi") else None
  query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if smi else None
  gpu, _, driver = query.stdout.strip().splitlines()[0].partition(", ") if query and query.stdout \
      else ("none (CPU)", "", "")
  cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi.stdout) if smi else None
  m = reports.machine_info()
  return {"gpu": gpu, "driver": driver, "cuda": cuda[1] if cuda else "", "cpu": reports.cpu_name(m),
          "python": m["python"], **found}


def _has(command: str) -> bool:
  return any((Path(d) / command).exists() for d in os.environ.get("PATH", "").split(os.pathsep))


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--download", type=Path, required=True, help="the folder the wheels go into")
  wheels = download(p.parse_args(argv).download)
  size = sum(w.stat().st_size for w in wheels)
  print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB: " + ", ".join(w.name for w in wheels))


if __name__ == "__main__":
  main()
