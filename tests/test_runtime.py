"""How a process starts (system/startup.py: the platform, the CPU's XLA devices, the processes, the
allocator, XLA's flags) and which XLA options CPU steps compile with (core/cpu.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import run_cli
from test_cli import TINY

from jaxtrain.config import loading
from jaxtrain.core import cpu, programs
from jaxtrain.system import allocator, machine, measured, startup
from jaxtrain.testing import tiny_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NANO, SMALL = str(CONFIGS / "nano.py"), str(CONFIGS / "small.py")
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
LEAN = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


def count(cfg, cores: int) -> int:
  return startup.cpu_device_count(cfg, cores)[0]


def test_cores_become_devices_that_split_the_batch_evenly():
  nano = loading.load_config(NANO)  # batch 16
  assert startup.cpu_device_count(nano, cores=2) == (2, "auto: 2 cores, 16 rows of the batch")
  assert count(nano, cores=3) == 2  # 16 rows do not split 3 ways
  odd = tiny_config(**{"train.batch_size": 3})
  assert count(odd, cores=2) == 1
  assert startup.cpu_device_count(tiny_config(**{"mesh.cpu_devices": 4}), cores=2) == \
      (4, "mesh.cpu_devices=4")


def test_a_mesh_that_is_asked_for_sets_the_count_and_the_automatic_split_says_what_it_left_out():
  odd = {"train.batch_size": 15}
  # Auto: 15 rows do not split over 2 cores; one device, and a line that says so.
  assert count(tiny_config(**odd), cores=2) == 1
  assert startup.split_note(tiny_config(**odd), cores=2) == (
      "note: train.batch_size=15 does not split over the 2 CPU cores: training on 1 device "
      "(mesh.cpu_devices=0, auto, takes the most that split the batch); "
      "--config.train.batch_size=14 or 16 uses every core")
  assert startup.split_note(tiny_config(**{"train.batch_size": 16}), cores=2) is None
  assert startup.split_note(tiny_config(**{"train.batch_size": 3}), cores=16) is None  # a row each
  # Asked for: that many devices, whatever the batch (mesh.check_devices then refuses 15 rows).
  assert count(tiny_config(**odd, **{"mesh.data": 2}), cores=2) == 2
  assert count(tiny_config(**odd, **{"mesh.data": 2, "mesh.fsdp": 2}), cores=2) == 4
  assert startup.split_note(tiny_config(**odd, **{"mesh.data": 2}), cores=2) is None
  # One axis set, the other -1: a multiple of it.
  assert count(tiny_config(**{"train.batch_size": 16, "mesh.fsdp": 2}), cores=3) == 2


@pytest.mark.slow
def test_a_batch_that_does_not_split_over_the_mesh_asked_for_is_one_line_exit_2(corpus_file, tmp_path):
  args = ["--config=configs/nano.py", "--jax_platforms=cpu", *TINY,
          f"--config.data.path={corpus_file}", "--config.train.batch_size=15",
          "--config.train.max_steps=1", "--config.sample.num_samples=0"]
  proc = run_cli(*args, f"--config.workdir={tmp_path / 'a'}", "--config.mesh.data=2")
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert proc.stderr.strip().splitlines() == [
      "error: config.train.batch_size: 15 does not split evenly over 2 devices; pass a multiple "
      "of 2, e.g. --config.train.batch_size=14"]
  proc = run_cli(*args, f"--config.workdir={tmp_path / 'b'}")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  cores = machine.cores()
  assert ("note: train.batch_size=15 does not split over the " in proc.stdout) == (cores > 1)


def test_every_step_schedules_for_memory_big_ones_also_compile_without_ynn_fusions():
  small, nano = (cpu.step_flops(loading.load_config(c)) for c in (SMALL, NANO))
  assert small > cpu.LARGE_CPU_STEP_FLOPS > nano
  kind = cpu.CpuKind("a CPU with the default thresholds")
  assert cpu.cpu_step_options(small, kind=kind) == {**LEAN, **NO_YNN}
  assert cpu.cpu_step_options(nano, kind=kind) == LEAN
  # The user's own choice in XLA_FLAGS wins.
  assert cpu.cpu_step_options(small, "--xla_cpu_experimental_ynn_fusion_type=DOT", kind=kind) == LEAN
  assert cpu.cpu_step_options(nano, "--xla_cpu_scheduler_type=DEFAULT", kind=kind) == {}
  # Several devices, each with a small share: each runs its matmuls on one thread.
  one_thread = {"xla_cpu_multi_thread_eigen": False}
  assert cpu.cpu_step_options(nano, kind=kind, devices=2) == {**LEAN, **one_thread}
  assert cpu.cpu_step_options(small, kind=kind, devices=2) == {**LEAN, **NO_YNN}
  assert cpu.cpu_step_options(nano, "--xla_cpu_multi_thread_eigen=true", kind=kind, devices=2) == LEAN


@pytest.mark.slow
def test_build_chooses_the_options_and_they_reach_the_compiled_step(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  cfg = tiny_config()
  p = programs.build(cfg, 256, jax.devices()[:1])
  assert p.compiler_options == LEAN  # a tiny step: YNN fusions stay
  assert "ynn_fusion" in p.compile_train().as_text()
  lean = programs.build(cfg, 256, jax.devices()[:1], compiler_options={**LEAN, **NO_YNN})
  assert "ynn_fusion" not in lean.compile_train().as_text()


def test_gpu_steps_get_jaxtrains_xla_options_and_the_users_xla_flags_win():
  """On GPUs the steps get GPU_OPTIONS (said in the run's compute line, which prints the
  options); an option XLA_FLAGS names is left to it; CPUs never get them (the test above)."""
  gpu = lambda flags="", deterministic=False: programs.step_options("gpu", 1e12, "bfloat16",
                                                                    deterministic, flags)
  assert programs.GPU_OPTIONS and gpu() == programs.GPU_OPTIONS
  name = next(iter(programs.GPU_OPTIONS))
  assert name not in gpu(f"--xla_gpu_autotune_level=2 --{name}=false")
  assert name in gpu(f"--{name}_or_another_flag=1")  # a flag it prefixes is another flag
  assert gpu(deterministic=True) == {**programs.GPU_OPTIONS, "xla_gpu_deterministic_ops": True}
  assert not set(programs.step_options("cpu", 1e12, "bfloat16", True)) & {*gpu(deterministic=True)}
  assert programs.step_options("tpu", 1e12, "bfloat16", False) == {}


def test_jaxtrains_gpu_options_are_xla_options_of_this_jaxlib():
  """XLA parses a compile's options on every backend: a GPU option misspelled, or gone from this
  jaxlib, fails a CPU compile as it would a GPU one."""
  f = jax.jit(lambda x: x + 1).lower(1.0)
  f.compile(compiler_options=programs.step_options("gpu", 1e12, "bfloat16", True))
  with pytest.raises(Exception, match="xla_gpu_enable_command_bufer"):
    f.compile(compiler_options={"xla_gpu_enable_command_bufer": True})


def test_build_takes_the_large_step_options_for_a_large_config(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  monkeypatch.setattr(cpu, "cpu_kind", lambda: cpu.CpuKind("a CPU with the default thresholds"))
  small = loading.load_config(SMALL)
  small.mesh.cpu_devices = 1
  p = programs.build(small, 256, jax.devices()[:1])  # nothing compiles until first use
  assert p.compiler_options == {**LEAN, **NO_YNN} and not p.one_allreduce


def test_a_run_after_jax_started_keeps_its_devices_and_the_users_flags(monkeypatch):
  jax.devices()  # this process's backend has started
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nonexistent")
  before, have = jax.config.jax_num_cpu_devices, jax.local_device_count()
  nano = loading.load_config(NANO)
  first = startup.settle(nano, by="a test")
  assert jax.config.jax_num_cpu_devices == before
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/nonexistent"
  assert first.started == "cpu" and startup.decision() is first
  assert len(startup.devices()) <= have
  if have < count(nano, machine.cores()):  # said, with what avoids it
    note = first.notes[0]
    assert note.startswith(f"note: jax started before jaxtrain could split the CPU: {have} XLA CPU")
    assert note.endswith("`import jaxtrain` before anything uses jax (restart the kernel or "
                         "script) to train on them")
  assert startup.settle(nano, by="a test") == first  # a second run: the same answer


# A dry run from a script: jaxtrain imported before jax is used, or after.
_LIBRARY = """
import json, sys
if sys.argv[1] == "jax_first":
  import jax
  jax.numpy.zeros(1).block_until_ready()
import jaxtrain as jt
import jax
jax.numpy.zeros(1).block_until_ready()  # jax used before the run
from jaxtrain.loop import preview
preview.dry_run(jt.load_config("nano", **json.loads(sys.argv[2])))
"""


@pytest.mark.slow
def test_a_script_gets_the_command_lines_devices_or_says_what_it_lost(corpus_file, tmp_path,
                                                                      monkeypatch):
  for name in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES"):  # the subprocesses' own
    monkeypatch.delenv(name, raising=False)
  overrides = {"workdir": str(tmp_path / "run"), "data.path": str(corpus_file)}
  cfg = loading.load_config(NANO, **overrides)
  cores = len(os.sched_getaffinity(0))
  n = count(cfg, cores)
  cli = run_cli(f"--config={NANO}", *(f"--config.{k}={v}" for k, v in overrides.items()),
                "--dry_run")
  out = {mode: subprocess.run([sys.executable, "-c", _LIBRARY, mode, json.dumps(overrides)],
                              capture_output=True, text=True, timeout=300)
         for mode in ("jaxtrain_first", "jax_first")}
  for result in (cli, *out.values()):
    assert result.returncode == 0, result.stderr[-2000:]
  header = lambda r: next(x for x in r.stdout.splitlines() if x.startswith("jaxtrain "))  # noqa: E731
  assert f"| cpu x{n} (" in header(cli) and f"| cpu x{n} (" in header(out["jaxtrain_first"])
  lost = (f"note: jax started before jaxtrain could split the CPU: 1 XLA CPU device where "
          f"`python -m jaxtrain` makes {n} ({cores} cores here, data parallel); `import jaxtrain` "
          "before anything uses jax (restart the kernel or script) to train on them")
  assert "| cpu x1 (" in header(out["jax_first"])
  assert (lost in out["jax_first"].stdout.splitlines()) == (n > 1)
  assert "note: jax started" not in cli.stdout + out["jaxtrain_first"].stdout
  library = allocator.mimalloc_library()
  if library and sys.platform == "linux" and not os.environ.get("LD_PRELOAD"):
    assert "| mimalloc allocator" in header(cli) and "note: glibc" not in cli.stdout
    for result in out.values():  # one line: what is lost, and how to start Python to have it
      note = next(x for x in result.stdout.splitlines() if x.startswith("note: glibc"))
      assert f"start Python (jupyter lab, your script) as `LD_PRELOAD={library} " in note


# Two runs' start-ups in one fresh process: jaxtrain imported first (the CPU split as the core
# count), then a run of argv[1]'s config twice, then one that splits its batch over fewer devices.
_TWICE = """
import json, os, socket, sys
import jaxtrain as jt
from jaxtrain.system import startup
import jax
with socket.socket() as s:
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
# A "multi-process" run of one process: it joins (jax.distributed), as a cluster's process 0 does.
cfg = jt.load_config(sys.argv[1], **{"distributed.coordinator_address": f"127.0.0.1:{port}",
                                     "distributed.num_processes": 1, "distributed.process_id": 0,
                                     "distributed.timeout_s": 60})
said = []
for config in (cfg, cfg, jt.load_config(sys.argv[1], **{"train.batch_size": 3})):
  d = startup.settle(config)
  said.append([d.cpu_devices, d.devices_from, d.ours, list(d.xla_flags), d.started,
               len(startup.devices()), os.environ.get("XLA_FLAGS", "")])
print(json.dumps([said, jax.distributed.is_initialized(), len(jax.devices())]))
"""


def test_a_second_run_in_a_process_gets_the_same_start_and_flags_are_added_once():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  out = subprocess.run([sys.executable, "-c", _TWICE, NANO], capture_output=True, text=True,
                       timeout=120, env=env)
  assert out.returncode == 0, out.stderr[-2000:]
  (first, second, third), joined, devices = json.loads(out.stdout.splitlines()[-1])
  cores = machine.cores()
  n = count(loading.load_config(NANO), cores)
  assert first == second and joined  # the same answer; joined once
  flag = "--xla_cpu_collective_timeout_seconds=60"
  assert first[:6] == [n, f"auto: {cores} cores, 16 rows of the batch", n, [flag], "cpu", n]
  assert first[6] == flag  # in XLA_FLAGS once, however many runs
  assert devices == n  # `import jaxtrain` gave jax one per core; the run, before it started, n
  # Batch 3 over fewer devices: the first of those split before; jaxtrain's flag taken out.
  fewer = count(tiny_config(**{"train.batch_size": 3}), cores)
  assert third[0] == third[5] == fewer and third[3] == [] and third[6] == ""


# A plugin-only platform: an accelerator's plugin importable, no platform named.
_PLUGIN = """
import json, sys
import jaxtrain
from jaxtrain.system import startup
env = startup.restart_environment(argv=["-m", "jaxtrain", "--config=nano"]) or {}
print(json.dumps([startup.platform(), startup.decision() is None, "LD_PRELOAD" in env]))
"""


@pytest.mark.parametrize("plugin, platform", [("jax_rocm7_plugin", "gpu"), ("libtpu", "tpu")])
def test_an_installed_accelerator_plugin_is_the_one_platform_of_the_allocator_and_the_split(
    plugin, platform, tmp_path):
  """Where only an accelerator's plugin is installed and nothing names a platform, jax starts on
  it: the allocator is not the CPU's and `import jaxtrain` splits nothing, by one rule."""
  (tmp_path / plugin).mkdir()
  (tmp_path / plugin / "__init__.py").write_text("")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "LD_PRELOAD")}
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
  out = subprocess.run([sys.executable, "-c", _PLUGIN], capture_output=True, text=True,
                       timeout=120, env=env, cwd=Path(__file__).resolve().parents[1])
  assert out.returncode == 0, out.stderr[-2000:]
  assert json.loads(out.stdout.splitlines()[-1]) == [[platform, f"{plugin} is installed"], True,
                                                     False]


@pytest.mark.slow
def test_a_run_where_the_plugins_platform_has_no_device_says_it_trains_on_the_cpu(
    corpus_file, tmp_path):
  (tmp_path / "jax_rocm7_plugin").mkdir()
  (tmp_path / "jax_rocm7_plugin" / "__init__.py").write_text("")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "LD_PRELOAD")}
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
  proc = subprocess.run([sys.executable, "-m", "jaxtrain", f"--config={NANO}",
                         f"--config.data.path={corpus_file}", f"--config.workdir={tmp_path / 'r'}",
                         "--dry_run"], capture_output=True, text=True, timeout=300, env=env,
                        cwd=Path(__file__).resolve().parents[1])
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  header = next(x for x in lines if x.startswith("jaxtrain "))
  assert "| cpu x1 (" in header and "| mimalloc allocator" not in header
  assert ("note: jax found no gpu device and runs on the CPU unsplit (jax_rocm7_plugin is "
          "installed); --jax_platforms=cpu splits the CPU into devices as a CPU run does") in lines


def _cpuinfo(vendor: str, family: int, model: int, name: str = "Some CPU") -> str:
  return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
          f"model name\t: {name}\nflags\t\t: fpu avx2\n")


def test_the_cpu_kind_is_the_tables_row_for_its_vendor_family_and_model():
  assert machine.cpu_id(_cpuinfo("AuthenticAMD", 26, 2, "AMD EPYC")) == ("AuthenticAMD", 26, 2, "AMD EPYC")
  assert cpu.cpu_kind(_cpuinfo("AuthenticAMD", 26, 2)) is cpu.CPU_KINDS["AuthenticAMD", 26, 2]
  assert cpu.cpu_kind(_cpuinfo("AuthenticAMD", 25, 17)).name.startswith("AMD Zen 4")
  assert cpu.cpu_kind(_cpuinfo("GenuineIntel", 6, 207)).name.startswith("Intel")
  # Same family, another model: not Zen 5's row.
  assert cpu.cpu_kind(_cpuinfo("AuthenticAMD", 26, 17)) not in cpu.CPU_KINDS.values()


def test_an_unknown_cpu_gets_the_measured_defaults_and_the_probe_decides_bfloat16():
  unknown = cpu.cpu_kind(_cpuinfo("SomeVendor", 7, 1, "Chip X"))
  assert "unknown CPU (Chip X, family 7 model 1)" == unknown.name
  assert unknown.large_step_flops == cpu.LARGE_CPU_STEP_FLOPS and unknown.bf16_ynn is None
  assert cpu.cpu_kind("").name.startswith("unknown CPU")  # no /proc/cpuinfo (macOS)
  assert machine.cpu_id("") == ("", -1, -1, "")


def test_large_bfloat16_steps_keep_ynn_fusions_where_ynnpack_runs_bfloat16_faster():
  small, nano = (cpu.step_flops(loading.load_config(c)) for c in (SMALL, NANO))
  zen5, no = cpu.CPU_KINDS["AuthenticAMD", 26, 2], cpu.CpuKind("x", bf16_ynn=False)
  assert cpu.cpu_step_options(small, dtype="bfloat16", kind=zen5) == LEAN
  assert cpu.cpu_step_options(small, dtype="float32", kind=no) == {**LEAN, **NO_YNN}
  assert cpu.cpu_step_options(small, dtype="bfloat16", kind=no) == {**LEAN, **NO_YNN}
  assert cpu.cpu_step_options(nano, dtype="bfloat16", kind=no) == LEAN  # small steps keep YNN
  # A kind's own threshold decides what is large.
  assert cpu.cpu_step_options(nano, kind=cpu.CpuKind("x", no_ynn_flops=nano)) == {**LEAN, **NO_YNN}


def test_zen5_keeps_ynn_fusions_for_float32_steps_of_every_size():
  zen5 = cpu.CPU_KINDS["AuthenticAMD", 26, 2]
  for flops in (1e9, 1.5e11, 5.8e11, 1e14):
    assert cpu.cpu_step_options(flops, dtype="float32", kind=zen5) == LEAN
  # Its matmul split is the measured default's: single-threaded below 1e11 per device.
  assert zen5.large_step_flops == cpu.LARGE_CPU_STEP_FLOPS


def test_the_bf16_probe_measures_once_per_machine_and_jax_version(monkeypatch, tmp_path):
  monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path))
  monkeypatch.setattr(measured, "_here", {})  # nothing measured by this process yet
  first = cpu.bf16_ynn_probe(n=128, repeats=1)
  cached = json.loads((tmp_path / measured.FILE).read_text())
  (name, entry), = cached.items()
  vendor, family, model, _ = machine.cpu_id()
  assert name.startswith(f"bf16_ynn:{vendor}-{family}-{model}-") and f"-jax{jax.__version__}-" in name
  assert entry["value"] is first
  # Another process (nothing in memory) reads the file instead of measuring again, where the
  # figure was taken on quiet cores.
  entry.update(value=not first, load=0.0)
  (tmp_path / measured.FILE).write_text(json.dumps(cached))
  monkeypatch.setattr(measured, "_here", {})
  assert cpu.bf16_ynn_probe(n=128, repeats=1) is (not first)
  # An unknown kind asks the probe only for a large bfloat16 step.
  unknown = cpu.CpuKind("unknown")
  assert cpu.cpu_step_options(1e12, dtype="bfloat16", kind=unknown) == \
      (LEAN if cpu.bf16_ynn_probe() else {**LEAN, **NO_YNN})
