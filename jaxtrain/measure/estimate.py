"""What a run will cost before it starts: memory against what the machine has, and FLOP peaks.

The memory estimate counts, in bytes: float32 params; gradients and AdamW's two moments (Muon keeps
one for the matrices it trains, so there it errs high), plus the accumulation buffer with
grad_accum > 1, of the trained params (all, or LoRA's adapters); and what one micro-batch keeps
for the backward pass: per layer and token 16*D + 4*F values (norms, q/k/v, attention output,
residuals, MLP) plus 3*H*T for dense attention (scores, probabilities and their gradient; none
with cuDNN's flash attention), and 2*V float32 values for the logits and their gradient (of the
compute dtype with `model.fused_loss`). With `model.remat` a layer keeps less (its matmul outputs,
6*D + 2*F, or only its input, D) and one layer at a time holds the full amount while it is
recomputed; with `model.loss_chunk` only one chunk's logits exist. It errs on the safe side: the
tests check it against the peak memory a process measurably takes for init and one step.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp

from jaxtrain.core import model as model_lib
from jaxtrain.system import fmt, machine, measured

# Dense (no sparsity) tensor-core peaks in TFLOP/s from the vendors' datasheets; "float32" is
# TF32 on Ampere and later, which is what XLA uses for float32 matmuls at default precision.
GPU_PEAK_TFLOPS = {
    "H200": {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7},
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0},
    "H100": {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0},
    "L40S": {"bfloat16": 362.1, "float16": 362.1, "float32": 183.0},
    "A10": {"bfloat16": 125.0, "float16": 125.0, "float32": 62.5},
    "L4": {"bfloat16": 121.0, "float16": 121.0, "float32": 60.0},
    "RTX 4090": {"bfloat16": 165.2, "float16": 165.2, "float32": 82.6},
    "RTX 3090": {"bfloat16": 71.0, "float16": 71.0, "float32": 35.6},
    "V100": {"bfloat16": 0.0, "float16": 125.0, "float32": 15.7},
    "T4": {"bfloat16": 0.0, "float16": 65.0, "float32": 8.1},
}


def published_peak(device_kind: str, dtype: str) -> float | None:
  """FLOP/s for a GPU whose name contains a known model (longest name wins), else None."""
  for name in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
    if name.replace(" ", "").lower() in device_kind.replace(" ", "").lower():
      peak = GPU_PEAK_TFLOPS[name].get(dtype, 0.0)
      return peak * 1e12 if peak else None
  return None


@dataclasses.dataclass
class Memory:
  params: int
  grads: int
  optimizer: int
  accumulation: int
  activations: int
  logits: int

  @property
  def total(self) -> int:
    return sum(dataclasses.astuple(self))


def memory_estimate(mc: model_lib.ModelConfig, batch_size: int, grad_accum: int,
                    n_devices: int = 1, fsdp: int = 1, n_params: int | None = None,
                    n_trained: int | None = None) -> Memory:
  """Bytes per device for one train step (see the module docstring for what is counted).
  `n_trained`: the params that have gradients and optimizer state (default: all)."""
  n = n_params or model_lib.param_count(mc)
  trained = n if n_trained is None else n_trained
  act_bytes = jnp.dtype(mc.dtype).itemsize
  B = max(batch_size // n_devices, 1)  # rows on each device
  T, D, H, L, V, F = mc.seq_len, mc.d_model, mc.n_heads, mc.n_layers, mc.vocab_size, mc.mlp_hidden
  scores = 0 if mc.attention == "cudnn" else 3 * H * T  # flash attention keeps no T x T scores
  per_token_layer = 16 * D + 4 * F + scores
  kept = {"none": per_token_layer, "dots": 6 * D + 2 * F, "full": D}[mc.remat]
  recomputed = 0 if mc.remat == "none" else per_token_layer  # the one layer being recomputed
  logit_rows = min(mc.loss_chunk, B * T) if mc.loss_chunk else B * T
  state = lambda count: count * 4 // fsdp  # float32, split over the fsdp axis
  return Memory(
      params=state(n), grads=state(trained), optimizer=state(2 * trained),
      accumulation=state(trained) if grad_accum > 1 else 0,
      activations=B * T * (L * kept + recomputed) * act_bytes,
      logits=logit_rows * 2 * V * (act_bytes if mc.fused_loss else 4),
  )


def available_memory(device: jax.Device) -> tuple[int | None, str]:
  """(bytes, what) the device can hold: the accelerator's memory, or what this process may take
  of the host's RAM (less where its container's cgroup sets a lower memory limit)."""
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
      return stats["bytes_limit"], f"{device.device_kind} memory"
  host = machine.host_memory()
  if host is not None:
    total, available, what = host
    if what == "RAM":  # MemAvailable counts reclaimable page cache: free pages alone undercount
      return available, "available RAM"
    return available, f"free of the {fmt.nbytes(total)} {what}"
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free RAM"
  except (ValueError, OSError):
    return None, "RAM"


def memory_report(mc: model_lib.ModelConfig, batch_size: int, grad_accum: int, devices: list,
                  fsdp: int, n_params: int | None = None,
                  n_trained: int | None = None) -> tuple[str, str | None]:
  """(one line of the estimate, a warning naming the knobs if it will not fit, else None)."""
  m = memory_estimate(mc, batch_size, grad_accum, len(devices), fsdp, n_params, n_trained)
  have, what = available_memory(devices[0])
  # CPU devices of one process all live in its host's RAM; an accelerator has its own memory
  sharing = sum(d.process_index == devices[0].process_index for d in devices) \
      if devices[0].platform == "cpu" else 1
  need = m.total * sharing
  line = (f"memory per device: ~{fmt.nbytes(m.total)} = params {fmt.nbytes(m.params)} + grads "
          f"{fmt.nbytes(m.grads)} + optimizer {fmt.nbytes(m.optimizer)}"
          + (f" + accumulation {fmt.nbytes(m.accumulation)}" if m.accumulation else "")
          + f" + activations {fmt.nbytes(m.activations)} + logits {fmt.nbytes(m.logits)}"
          + (f"; x {sharing} CPU devices = ~{fmt.nbytes(need)}" if sharing > 1 else "")
          + (f"; {fmt.nbytes(have)} {what}" if have else ""))
  warning = None
  if have and need > have:
    knobs = ["lower train.batch_size (raise train.grad_accum to keep the tokens per step)",
             "lower model.seq_len"]
    if mc.dtype == "float32":
      knobs.append("use model.dtype=bfloat16 for smaller activations")
    if len(devices) > 1:
      knobs.append("split the state over devices with mesh.fsdp")
    if sharing > 1:
      knobs.append("use fewer CPU devices (mesh.cpu_devices)")
    needs = f"~{fmt.nbytes(need)}" + (f" ({sharing} CPU devices)" if sharing > 1 else " per device")
    killed = " and be killed (exit status 137)" if "limit" in what else ""
    warning = (f"this run needs {needs}, more than the {fmt.nbytes(have)} {what}: it will "
               f"probably run out of memory{killed}. To fit: {'; '.join(knobs)}")
  return line, warning


def time_matmul(dtype: str = "float32", n: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of an n x n matmul on the default device: 2*n^3 over the median of `repeats` timed
  products, after two untimed ones (compile, first touch of the buffers, thread-pool start)."""
  a = jnp.ones((n, n), jnp.dtype(dtype))
  matmul = jax.jit(lambda x: x @ x)
  return 2 * n**3 / machine.seconds(lambda: matmul(a).block_until_ready(), repeats, untimed=2)


def matmul_peak(dtype: str = "float32", n: int | None = None, repeats: int = 5,
                at_least: float = 0.0) -> measured.Measured:
  """This device's matmul FLOP/s by `time_matmul`, measured again after a week (what the key does
  not see, firmware or cooling, drifts) or where below `at_least` (FLOP/s this device was just
  seen to reach: the cached peak was taken on a busy machine)."""
  device = jax.devices()[0]
  n = n or (2048 if device.platform == "cpu" else 8192)
  return measured.measured("peak", [device.platform, device.device_kind, f"{len(jax.devices())}dev",
                                    dtype, n], lambda _: time_matmul(dtype, n, repeats),
                           max_age_s=7 * 24 * 3600, enough=lambda flops: flops >= at_least)


def peak_flops(devices: list, dtype: str, achieved: float = 0.0) -> tuple[float, str]:
  """(FLOP/s of `devices` together, what that is) for MFU: the datasheet peak of a known GPU,
  else a measured matmul peak (measured again if below `achieved`, FLOP/s the devices together
  just ran at), times the number of GPUs or hosts."""
  device = devices[0]
  # CPU devices of one host share its cores (one measured peak per host); an accelerator has its own
  units = len({d.process_index for d in devices}) if device.platform == "cpu" else len(devices)
  peak = published_peak(device.device_kind, dtype) if device.platform == "gpu" else None
  source = f"{device.device_kind} datasheet {dtype}"
  if not peak:
    found = matmul_peak(dtype, at_least=achieved / units)
    peak, source = found.value, f"{dtype} matmul measured on this {device.platform} {found.said()}"
  return peak * units, f"{fmt.count(peak)}FLOP/s x {units}, {source}"
