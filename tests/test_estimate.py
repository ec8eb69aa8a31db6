"""The memory estimate and peak tables: hand-computed values, and a check against measured memory."""

import json
import os
import subprocess
import sys

import jax
import pytest

from jaxtrain.config.loading import override
from jaxtrain.core import attention
from jaxtrain.core import model as model_lib
from jaxtrain.measure import estimate
from jaxtrain.testing import model_config, tiny_config


def test_memory_estimate_by_hand():
  c = model_lib.ModelConfig(vocab_size=64, n_layers=2, n_heads=2, d_model=16, seq_len=12,
                            mlp="gelu", pos="learned", tie_embeddings=False)
  n = model_lib.param_count(c)
  m = estimate.memory_estimate(c, batch_size=4, grad_accum=2, n_devices=2)
  assert (m.params, m.grads, m.optimizer, m.accumulation) == (4 * n, 4 * n, 8 * n, 4 * n)
  B, T, L, D, F, H, V = 2, 12, 2, 16, 64, 2, 64  # two rows on each of the two devices
  assert m.activations == B * T * L * (16 * D + 4 * F + 3 * H * T) * 4
  assert m.logits == B * T * 2 * V * 4
  assert m.total == 20 * n + m.activations + m.logits
  half = estimate.memory_estimate(c, batch_size=4, grad_accum=1, n_devices=2, fsdp=2)
  assert half.params == 2 * n and half.accumulation == 0
  bf16 = estimate.memory_estimate(model_lib.ModelConfig(**{**c.__dict__, "dtype": "bfloat16"}), 4, 1, 2)
  assert bf16.activations == m.activations // 2 and bf16.logits == m.logits



def test_remat_and_chunked_loss_shrink_the_estimate():
  c = model_lib.ModelConfig(vocab_size=50304, n_layers=12, n_heads=12, d_model=768, seq_len=1024)
  with_ = lambda **kw: estimate.memory_estimate(model_lib.ModelConfig(**{**c.__dict__, **kw}), 16, 1)
  none, dots, full = (with_(remat=r) for r in ("none", "dots", "full"))
  assert none.activations > dots.activations > full.activations
  per_layer = none.activations // c.n_layers
  assert full.activations == 16 * 1024 * 12 * 768 * 4 + per_layer  # inputs + one layer recomputed
  assert dots.params == none.params and dots.logits == none.logits
  chunked = with_(loss_chunk=2048)
  assert chunked.logits == none.logits * 2048 // (16 * 1024) and chunked.activations == none.activations
  assert with_(loss_chunk=10**6).logits == none.logits  # a chunk larger than the batch: one chunk
  assert with_(fused_loss=True, dtype="bfloat16").logits == none.logits // 2  # bfloat16 logits


_PEAK = """
import json, sys
import jax
from jaxtrain.measure import estimate
from jaxtrain.core import programs
from jaxtrain.testing import random_batch, tiny_config

def status(field):
  for line in open("/proc/self/status"):
    if line.startswith(field):
      return int(line.split()[1]) * 1024

cfg = tiny_config(**json.loads(sys.argv[1]))
p = programs.build(cfg, 256, jax.devices()[:1])
train, batch = p.compile_train(), p.place(random_batch(cfg))
with open("/proc/self/clear_refs", "w") as f:
  f.write("5")  # the peak resident memory counts again from here: init and one step
before = status("VmRSS")
state, metrics = train(p.init(), batch)
jax.block_until_ready(metrics)
est = estimate.memory_estimate(p.model_cfg, cfg.train.batch_size, cfg.train.grad_accum).total
print(json.dumps({"measured": status("VmHWM") - before, "estimate": est}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="needs Linux's /proc/self/clear_refs, writable")
@pytest.mark.parametrize("overrides", [
    {"model.d_model": 256, "model.seq_len": 256, "train.batch_size": 32},
    {"model.d_model": 128, "model.seq_len": 512, "train.batch_size": 16, "model.mlp": "gelu",
     "model.pos": "learned"}])
def test_estimate_is_close_to_the_measured_peak_memory(overrides):
  """The memory a fresh process takes to init a state and run one step (a few hundred MB here,
  so that the step's own buffers dominate) against the estimate: never well below it, and not
  far above (the estimate errs on the safe side)."""
  out = subprocess.run([sys.executable, "-c", _PEAK, json.dumps(overrides)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-2000:]
  r = json.loads(out.stdout.splitlines()[-1])
  assert 0.9 < r["estimate"] / r["measured"] < 1.8, r


def test_report_warns_with_the_knobs_when_it_will_not_fit():
  cfg = tiny_config(**{"model.d_model": 4096, "model.n_heads": 32, "model.n_layers": 48,
                       "model.seq_len": 4096, "train.batch_size": 64})
  mc = model_config(cfg)
  line, warning = estimate.memory_report(mc, 64, 1, jax.devices(), fsdp=1)
  assert line.startswith("memory per device: ~") and "params" in line and "activations" in line
  assert warning and "train.batch_size" in warning and "model.seq_len" in warning
  assert "model.dtype=bfloat16" in warning
  _, fine = estimate.memory_report(model_config(tiny_config()), 8, 1, jax.devices(), 1)
  assert fine is None


def test_cpu_devices_share_the_hosts_ram():
  """Per device it fits, but four CPU devices in one process need four times that of one RAM."""
  have, _ = estimate.available_memory(jax.devices()[0])
  cfg = tiny_config(**{"model.d_model": 512, "model.n_heads": 8, "model.seq_len": 1024})
  per_row = estimate.memory_estimate(model_config(cfg), 1, 1).activations
  batch = 4 * max(1, int(2 * have / per_row) // 4)  # activations of ~half the RAM per device
  cfg = override(cfg, **{"train.batch_size": batch})
  mc, four = model_config(cfg), [jax.devices()[0]] * 4  # four CPU devices of this process
  per_device = estimate.memory_estimate(mc, batch, 1, 4).total
  assert per_device < have < 4 * per_device
  line, warning = estimate.memory_report(mc, batch, 1, four, fsdp=1)
  assert "x 4 CPU devices" in line
  assert warning and "(4 CPU devices)" in warning and "mesh.cpu_devices" in warning


def test_published_peaks():
  assert estimate.published_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
  assert estimate.published_peak("NVIDIA H100 PCIe", "bfloat16") == 756e12
  assert estimate.published_peak("NVIDIA A100-SXM4-40GB", "float32") == 156e12
  assert estimate.published_peak("NVIDIA GeForce RTX 4090", "bfloat16") == 165.2e12
  assert estimate.published_peak("cpu", "float32") is None
  assert estimate.published_peak("Tesla T4", "bfloat16") is None  # no bf16 tensor cores


def test_attention_choice():
  assert attention.resolve_attention("auto", "bfloat16", 64, 4, 32, "cpu")[0] == "xla"
  from jaxtrain.system.errors import ConfigError

  with pytest.raises(ConfigError, match="model.attention: cudnn needs an NVIDIA GPU"):
    attention.resolve_attention("cudnn", "bfloat16", 64, 4, 32, "cpu")


def test_a_deterministic_run_takes_xlas_attention(tiny, monkeypatch):
  from jaxtrain.core import programs
  from jaxtrain.system.errors import ConfigError

  # On a GPU, "auto" would try cuDNN: a deterministic run decides before any compile.
  assert attention.resolve_attention("auto", "bfloat16", 64, 4, 32, "gpu", True) == \
      ("xla", "deterministic (cuDNN's fused attention backward is not)")
  with pytest.raises(ConfigError, match="cudnn's fused attention is not deterministic"):
    attention.resolve_attention("cudnn", "bfloat16", 64, 4, 32, "gpu", True)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1 "
                                  "--xla_gpu_deterministic_ops=true")
  assert programs.wants_deterministic_gpu_ops()
  monkeypatch.setenv("XLA_FLAGS", "")
  assert not programs.wants_deterministic_gpu_ops()
  # The GPU option is for GPU steps only; a CPU step keeps its CPU options.
  tiny.train.deterministic = True
  built = programs.build(tiny, 256, jax.devices()[:1])
  assert "xla_gpu_deterministic_ops" not in built.compiler_options


def _fake_machine(root, cgroup: str, mounts: list[str], files: dict[str, str],
                  ram_gib: int = 64) -> None:
  """A made-up /proc and /sys under `root`: this process's cgroups, the mounts, the cgroup files."""
  (root / "proc/self").mkdir(parents=True)
  (root / "proc/self/cgroup").write_text(cgroup)
  (root / "proc/self/mountinfo").write_text("".join(m + "\n" for m in mounts))
  (root / "proc/meminfo").write_text(f"MemTotal: {ram_gib << 20} kB\nMemAvailable: "
                                     f"{(ram_gib - 4) << 20} kB\n")
  for path, text in files.items():
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


V1_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
V2_MOUNT = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"


def test_a_containers_cgroup_limit_is_the_memory_a_run_has(tmp_path):
  from jaxtrain.system import machine

  gib = 2**30
  # cgroup v2 (Docker, Kubernetes, systemd): the limit of the process's own group.
  v2 = tmp_path / "v2"
  _fake_machine(v2, "0::/job\n", [V2_MOUNT], {
      "sys/fs/cgroup/job/memory.max": f"{3 * gib}\n",
      "sys/fs/cgroup/job/memory.current": f"{gib}\n",
      "sys/fs/cgroup/job/memory.stat": f"anon 1\ninactive_file {gib // 2}\n"})
  assert machine.container_limit(v2) == machine.Limit(3 * gib, gib // 2, "cgroup v2 memory.max")
  total, available, what = machine.host_memory(v2)
  assert (total, available) == (3 * gib, 5 * gib // 2)  # page cache it can drop is not used
  assert what == "container memory limit (cgroup v2 memory.max)"

  # cgroup v1, the limit set on a group above the process's (a Slurm job's, its step below it).
  v1 = tmp_path / "v1"
  _fake_machine(v1, "4:memory:/slurm/job_7/step_0\n1:cpu:/\n", [V1_MOUNT], {
      "sys/fs/cgroup/memory/slurm/job_7/step_0/memory.limit_in_bytes": "9223372036854771712\n",
      "sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes": f"{2 * gib}\n",
      "sys/fs/cgroup/memory/slurm/job_7/memory.usage_in_bytes": f"{gib}\n"})
  assert machine.container_limit(v1) == machine.Limit(2 * gib, gib, "cgroup v1 memory.limit_in_bytes")

  # "max", or a number beyond the RAM: no limit; the RAM is what there is.
  none = tmp_path / "none"
  _fake_machine(none, "0::/\n", [V2_MOUNT], {"sys/fs/cgroup/memory.max": "max\n"})
  assert machine.container_limit(none) is None
  assert machine.host_memory(none) == (64 * gib, 60 * gib, "RAM")
  big = tmp_path / "big"
  _fake_machine(big, "0::/\n", [V2_MOUNT], {"sys/fs/cgroup/memory.max": f"{128 * gib}\n"})
  assert machine.container_limit(big) is None


def test_memory_warns_when_the_container_runs_low():
  from jaxtrain.measure import memory

  watch = memory.Watch(host=lambda: (3 * 2**30, 2**28, "container memory limit (cgroup v2 "
                                     "memory.max)"))
  _, _, warning = watch.read()
  assert "256.00 MiB of 3.00 GiB container memory limit (cgroup v2 memory.max) available" in warning
