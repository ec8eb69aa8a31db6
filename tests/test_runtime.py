"""Process setup on CPU: how many XLA devices, and which XLA options the steps compile with."""

from pathlib import Path

import pytest

from jaxtrain import config, runtime, sharding, steps
from jaxtrain.testing import model_config, random_batch, tiny_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NANO, SMALL = str(CONFIGS / "nano.py"), str(CONFIGS / "small.py")
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
LEAN = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


@pytest.fixture
def step_options():
  yield
  runtime.use_cpu_step_options(tiny_config())  # back to the default for later tests


def test_cores_become_devices_that_split_the_batch_evenly():
  nano = config.load_config(NANO)  # batch 16
  assert runtime.cpu_device_count(nano, cores=2) == 2
  assert runtime.cpu_device_count(nano, cores=3) == 2  # 16 rows do not split 3 ways
  odd = tiny_config(**{"train.batch_size": 3})
  assert runtime.cpu_device_count(odd, cores=2) == 1
  assert runtime.cpu_device_count(tiny_config(**{"mesh.cpu_devices": 4}), cores=2) == 4


def test_every_step_schedules_for_memory_big_ones_also_compile_without_ynn_fusions(
    step_options, monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  runtime.use_cpu_step_options(config.load_config(SMALL))  # ~1.2e12 FLOPs a step
  assert runtime.step_compiler_options() == {**LEAN, **NO_YNN}
  runtime.use_cpu_step_options(config.load_config(NANO))  # ~1.5e10: gains nothing, keeps YNN
  assert runtime.step_compiler_options() == LEAN
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT")
  runtime.use_cpu_step_options(config.load_config(SMALL))
  assert runtime.step_compiler_options() == LEAN  # the user's own choice wins
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_DEFAULT")
  runtime.use_cpu_step_options(config.load_config(NANO))
  assert runtime.step_compiler_options() == {}


def test_the_option_reaches_the_compiled_step(step_options, monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  cfg = tiny_config()
  mc = model_config(cfg)
  mesh = sharding.make_mesh(cfg)
  abstract = steps.abstract_state(cfg, mc)
  batch = sharding.global_batch(random_batch(cfg), mesh)

  def compiled_text() -> str:
    train, _ = sharding.jit_steps(abstract, mesh)
    return train.lower(abstract, batch).compile().as_text()

  assert "ynn_fusion" in compiled_text()
  runtime.use_cpu_step_options(config.load_config(SMALL))
  assert "ynn_fusion" not in compiled_text()


def test_steps_compiled_before_any_config_was_seen_get_the_small_step_options(step_options,
                                                                             monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  monkeypatch.setattr(runtime, "_STEP_OPTIONS", None)  # as in a fresh process (notebooks, tests)
  assert runtime.step_compiler_options() == LEAN
