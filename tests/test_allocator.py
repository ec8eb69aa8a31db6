"""The allocator `python -m jaxtrain` re-executes itself under: mimalloc preloaded for a CPU run,
glibc's huge pages otherwise; the user's own choices win. The platform it asks is start-up's one
rule (system/startup.py; tests/test_runtime.py runs a plugin-only platform)."""

import os
import subprocess
import sys

import pytest

from jaxtrain.system import allocator, startup

pytestmark = pytest.mark.skipif(sys.platform != "linux" or allocator.mimalloc_library() is None,
                                reason="mimalloc is a Linux-only dependency")

_CHECK = """
import jax, jax.numpy as jnp, numpy as np
maps = open("/proc/self/maps").read()
x = jnp.arange(4 * 2**20, dtype=jnp.float32).reshape(2048, 2048) / 2**20
y = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0))(x)  # big temporaries, allocated and freed
np.save(__import__("sys").argv[1], np.asarray(y))
print("mimalloc" in maps)
"""


CPU = ["-m", "jaxtrain", "--config=configs/nano.py", "--jax_platforms=cpu"]


@pytest.fixture
def clean_env(monkeypatch):
  """No allocator settings yet, and no platform named."""
  for name in [k for k in os.environ if k.startswith("MIMALLOC_")] + [
      "LD_PRELOAD", "GLIBC_TUNABLES", "JAXTRAIN_NO_REEXEC", "JAXTRAIN_MIMALLOC", "JAX_PLATFORMS"]:
    monkeypatch.delenv(name, raising=False)


def test_mimalloc_is_preloaded_once_with_memory_kept_for_reuse(clean_env, monkeypatch):
  env = startup.restart_environment(argv=CPU)
  assert env["LD_PRELOAD"] == allocator.mimalloc_library()
  assert env["MIMALLOC_PURGE_DELAY"] == "-1" and env["MIMALLOC_ALLOW_LARGE_OS_PAGES"] == "1"
  for name, value in env.items():  # once restarted under it, nothing is left to change
    monkeypatch.setenv(name, value)
  assert startup.restart_environment(argv=CPU) is None


def test_the_users_choices_win(clean_env, monkeypatch):
  monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "100")
  assert startup.restart_environment(argv=CPU)["MIMALLOC_PURGE_DELAY"] == "100"
  monkeypatch.setenv("LD_PRELOAD", "/opt/lib/libjemalloc.so.2")  # whatever they preload stays alone
  assert (startup.restart_environment(argv=CPU) or os.environ).get("LD_PRELOAD") == \
      "/opt/lib/libjemalloc.so.2"
  monkeypatch.delenv("LD_PRELOAD")
  monkeypatch.setenv("JAXTRAIN_MIMALLOC", "0")
  assert "LD_PRELOAD" not in (startup.restart_environment(argv=CPU) or {})
  monkeypatch.setenv("JAXTRAIN_NO_REEXEC", "1")
  assert startup.restart_environment(argv=CPU) is None


def test_only_the_cli_restarts_itself(monkeypatch):
  for argv, cli in ((["python", "-m", "jaxtrain", "--config=c.py"], True),
                    (["python", "-X", "importtime", "-mjaxtrain"], True),
                    (["python", "-m", "ipykernel_launcher", "-f", "k.json"], False),
                    (["python", "my_script.py"], False), (["python", "-c", "import x"], False),
                    (["/venv/bin/python3", "/venv/bin/jaxtrain", "--config=nano"], True),
                    (["python", "/venv/bin/jaxtrain-sample", "--workdir=w"], False)):
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert allocator.started_as_cli() == cli, argv


def test_accelerator_runs_keep_glibc(clean_env, monkeypatch, tmp_path):
  cpu = ["-m", "jaxtrain", "--config=configs/nano.py"]
  assert "LD_PRELOAD" in startup.restart_environment(argv=cpu + ["--jax_platforms=cpu"])
  for argv in (cpu + ["--jax_platforms=cuda"], cpu + ["--jax_platforms", "cuda"],
               cpu + ["-jax_platforms=tpu"]):
    assert "LD_PRELOAD" not in (startup.restart_environment(argv=argv) or {})
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  assert "LD_PRELOAD" not in (startup.restart_environment(argv=cpu) or {})
  assert "LD_PRELOAD" in startup.restart_environment(argv=cpu + ["--jax_platforms=cpu"])
  monkeypatch.delenv("JAX_PLATFORMS")
  if not startup.installed_plugins():  # nothing named, no accelerator plugin: the CPU it is
    assert "LD_PRELOAD" in startup.restart_environment(argv=cpu)
  (tmp_path / "libtpu").mkdir()  # a TPU host (its plugin importable), nothing named
  (tmp_path / "libtpu" / "__init__.py").write_text("")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert "LD_PRELOAD" not in (startup.restart_environment(argv=cpu) or {})


@pytest.mark.slow
def test_a_process_under_mimalloc_computes_the_same(clean_env, tmp_path):
  results = {}
  for name, env in (("glibc", dict(os.environ, JAXTRAIN_MIMALLOC="0")),
                    ("mimalloc", dict(os.environ))):
    env = dict(startup.restart_environment(env, argv=CPU) or env, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _CHECK, str(tmp_path / name) + ".npy"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(name == "mimalloc")
    results[name] = (tmp_path / f"{name}.npy").read_bytes()
  assert results["glibc"] == results["mimalloc"]
