"""The two sides jax_vs_torch.py times, each built in a worker process of its own
(`common.Worker`): jaxtrain's train step (`JaxSide`) and the PyTorch reference of the same model
(`TorchSide`, benchmarks/torch_reference.py). nanoGPT's own side is torch_nanogpt.NanoGPTSide.

Each has `peak(n, repeats)`, `setup(shape, ...)` and `run(n)`; both train on
`common.token_batches(shape, SEED)`, so from the same parameters their losses agree.
"""

import os
import time

import common

SEED = 0


class JaxSide:
  """jaxtrain as a run of `shape` uses it: the CPU set up by jaxtrain's own rules
  (`startup.settle`: cores split into XLA devices) and the steps
  `programs.build` makes, the state donated. One worker per shape: those rules are process-wide
  and must be applied before jax starts its backend."""

  def __init__(self, threads: int, shape: common.Shape, cpu_devices: int):
    common.pin_cores(threads)
    os.environ["JAX_PLATFORMS"] = "cpu"
    from jaxtrain.system import runtime, startup

    cfg = common.gpt2_config(shape)
    cfg.mesh.cpu_devices = cpu_devices  # 0: jaxtrain's automatic choice
    startup.settle(cfg, by="benchmarks/sides.py")
    runtime.enable_compile_cache()

  def peak(self, n: int, repeats: int) -> dict:
    return common.measure_matmul_peak("float32", n, repeats)

  def setup(self, shape: common.Shape) -> dict:
    import jax

    from jaxtrain.core import model as model_lib
    from jaxtrain.core import programs

    p = programs.build(common.gpt2_config(shape), shape.vocab_size)
    self.state = p.init()
    self.step_fn = p.train_step  # compiles on its first call, in the warm-up
    self.batches = [p.place({"tokens": b}) for b in common.token_batches(shape, SEED)]
    self.i = 0
    init_loss = float(p.eval_step(self.state, self.batches[0])["loss"])
    return {"param_count": model_lib.param_count(p.model_cfg),
            "flops_per_token": model_lib.flops_per_token(p.model_cfg), "init_loss": init_loss,
            "params": jax.device_get(self.state.params), "cpu_devices": len(jax.devices()),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "step_compiler_options": p.compiler_options, "one_allreduce": p.one_allreduce}

  def run(self, n: int) -> dict:
    import jax

    # As jaxtrain's loop runs them: it queues the next step before it reads the previous one's
    # metrics, so the host never waits on the device between steps, and no more than two steps
    # are queued (XLA:CPU can deadlock in the cross-device all-reduce with dozens queued).
    # Timed as a block (the per-step figure is the block's mean).
    jax.block_until_ready(self.state)
    t0 = time.perf_counter()
    metrics = None
    for _ in range(n):
      batch = self.batches[self.i % len(self.batches)]
      self.i += 1
      previous = metrics
      self.state, metrics = self.step_fn(self.state, batch)
      if previous is not None:
        jax.block_until_ready(previous)
    jax.block_until_ready((self.state, metrics))
    per_step = (time.perf_counter() - t0) / n
    return {"times_s": [per_step] * n, "loss": float(metrics["loss"])}


class TorchSide:
  """benchmarks/torch_reference.py in eager mode, torch.set_num_threads(threads)."""

  def __init__(self, threads: int):
    common.pin_cores(threads)
    import torch

    torch.set_num_threads(threads)

  def peak(self, n: int, repeats: int) -> dict:
    return common.torch_matmul_peak("float32", n, repeats)

  def setup(self, shape: common.Shape, hyper: common.Hyper, jax_params: dict) -> dict:
    import torch
    import torch_reference as ref

    torch.manual_seed(SEED)
    self.model = ref.GPT(shape)
    self.hyper = hyper
    self.batches = [torch.from_numpy(b).long() for b in common.token_batches(shape, SEED)]
    self.i = 0
    with torch.no_grad():
      own_init_loss = ref.loss_fn(self.model, self.batches[0]).item()
      ref.load_jaxtrain_params(self.model, jax_params)
      init_loss = ref.loss_fn(self.model, self.batches[0]).item()
    self.opt = ref.make_optimizer(self.model, hyper)
    return {"param_count": ref.param_count(self.model), "own_init_loss": own_init_loss,
            "init_loss": init_loss, "num_threads": torch.get_num_threads()}

  def run(self, n: int) -> dict:
    import torch_reference as ref

    times = []
    for _ in range(n):
      batch = self.batches[self.i % len(self.batches)]
      t0 = time.perf_counter()
      loss = ref.train_step(self.model, self.opt, batch, self.i, self.hyper)
      times.append(time.perf_counter() - t0)
      self.i += 1
    return {"times_s": times, "loss": loss.item()}
