"""Programs loaded ahead on a restart (`preload`): the run takes them only where they are exactly
its own, and trains to the same bits as without them; anything broken falls back."""

import json
import subprocess
import sys

import jax
import pytest

from jaxtrain import aot, preload, train
from jaxtrain.testing import assert_trees_equal

from test_resume import _final_arrays


@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path / "cache"))
  yield tmp_path / "cache" / "aot"
  aot.PRELOADED.clear()  # whatever a test left untaken


def _config(tiny, tmp_path, name: str):
  cfg = tiny.copy_and_resolve_references()
  cfg.workdir = str(tmp_path / name)
  cfg.train.max_steps = 4
  cfg.train.eval_every = 4
  cfg.sample.num_samples = 0
  return cfg


def _start_and_wait(cfg) -> list[str]:
  """Starts `preload` for `cfg`; the names of the programs it loaded, once loaded."""
  preload.start(cfg)
  for loading in aot.PRELOADED.values():
    loading.future.result()  # raises if loading failed
  return sorted(f.split("-")[0] for f in aot.PRELOADED)


def test_a_restart_takes_the_loaded_programs_and_ends_on_the_same_bits(tiny, tmp_path, cache):
  first = _config(tiny, tmp_path, "first")
  r_first = train.run(first, show_progress=False)
  manifest = json.loads(next(cache.glob("manifest-*.json")).read_text())
  assert sorted(p["file"].split("-")[0] for p in manifest["programs"]) == ["init_state",
                                                                        "train_step"]

  again = _config(tiny, tmp_path, "again")  # another run directory: the same programs
  assert _start_and_wait(again) == ["init_state", "train_step"]
  r_again = train.run(again, show_progress=False)
  assert preload.taken() == 2  # both taken, neither fell back
  assert_trees_equal(_final_arrays(again)[0], _final_arrays(first)[0])
  assert (r_again.train_loss, r_again.val_loss) == (r_first.train_loss, r_first.val_loss)

  longer = again.copy_and_resolve_references()
  longer.train.max_steps = 6
  assert _start_and_wait(longer) == []  # another config (the schedule differs): no manifest
  # Resuming restores the state rather than running init: the train step alone is loaded.
  assert _start_and_wait(first) == ["train_step"]


def test_programs_not_exactly_the_runs_are_left_and_broken_files_fall_back(tiny, tmp_path, cache):
  first = _config(tiny, tmp_path, "first")
  train.run(first, show_progress=False)
  expected = _final_arrays(first)[0]
  manifest_path = next(cache.glob("manifest-*.json"))
  manifest = json.loads(manifest_path.read_text())

  # A manifest that describes the train step's call otherwise (say, an older jaxtrain's): its
  # program is loaded, but the run does not take it.
  changed = json.loads(json.dumps(manifest))
  step = next(p for p in changed["programs"] if p["file"].startswith("train_step"))
  step["donate"] = 0
  manifest_path.write_text(json.dumps(changed))
  other = _config(tiny, tmp_path, "other")
  assert _start_and_wait(other) == ["init_state", "train_step"]
  train.run(other, show_progress=False)
  assert preload.taken() == 1 and not aot.PRELOADED  # init only; the other one dropped
  assert_trees_equal(_final_arrays(other)[0], expected)

  # A manifest from a process with other devices: that program is not even loaded.
  moved = json.loads(json.dumps(manifest))
  for p in moved["programs"]:
    p["mesh"]["devices"] = [d + 1 for d in p["mesh"]["devices"]]
  manifest_path.write_text(json.dumps(moved))
  assert _start_and_wait(other) == []
  manifest_path.write_text(json.dumps(manifest))

  # A damaged program file: nothing is loaded ahead, and the run writes it anew.
  (cache / step["file"]).write_bytes(b"not a program")
  third = _config(tiny, tmp_path, "third")
  assert _start_and_wait(third) == ["init_state"]
  train.run(third, show_progress=False)
  assert preload.taken() == 1
  assert_trees_equal(_final_arrays(third)[0], expected)
  assert (cache / step["file"]).stat().st_size > 1000


def test_a_failed_load_falls_back_to_lowering_here(tiny, tmp_path, cache):
  import concurrent.futures

  first = _config(tiny, tmp_path, "first")
  train.run(first, show_progress=False)
  expected = _final_arrays(first)[0]
  second = _config(tiny, tmp_path, "second")
  assert _start_and_wait(second) == ["init_state", "train_step"]
  for loading in aot.PRELOADED.values():  # as if the thread had failed
    loading.future = concurrent.futures.Future()
    loading.future.set_exception(RuntimeError("out of memory"))
  train.run(second, show_progress=False)
  assert preload.taken() == 0  # both taken, both compiled here instead
  assert_trees_equal(_final_arrays(second)[0], expected)


def test_cpu_lapack_set_up_without_importing_scipy_linalg():
  code = """
import sys
import jax, jax.numpy as jnp
from jaxtrain import runtime
runtime.init_cpu_lapack()
assert "scipy.linalg" not in sys.modules, "scipy.linalg imported"
assert not [m for m in sys.modules if m.startswith("scipy.linalg")], "stand-in left behind"
print(float(jnp.linalg.inv(2 * jnp.eye(3))[0, 0]), float(jnp.linalg.svd(jnp.ones((2, 2)))[1][0]))
assert "scipy.linalg" not in sys.modules, "LAPACK was not set up"  # else jax imports it now
import scipy.linalg, scipy.linalg.cython_blas  # later imports are the usual ones
print(scipy.linalg.cython_blas.__name__, scipy.linalg.inv([[4.0]])[0, 0])
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["0.5", "2.0", "scipy.linalg.cython_blas", "0.25"]
  jax.block_until_ready(jax.numpy.ones(1))  # this process is untouched
