"""From a config to the programs a run executes: the one way jaxtrain builds its steps.

`build(cfg, vocab_size)` makes the device mesh, the optimizer, the state's layout and the jitted
init, train and eval programs with their shardings. The training loop, `load_state`, the test
helpers, the notebooks and every benchmark call it, so what is measured is what users run.
"""

import dataclasses
import functools
import os
import re
from collections.abc import Callable

import jax
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxtrain.config import defaults
from jaxtrain.core import attention, components, cpu, lora, mesh, optim, steps
from jaxtrain.core import model as model_lib

# Data-parallel CPU steps under this many FLOPs per device all-reduce their gradients at once
# (`mesh.one_allreduce_step`); larger ones keep XLA's per-gradient all-reduces.
ONE_ALLREDUCE_FLOPS = 4e9


@dataclasses.dataclass(frozen=True)
class Programs:
  """Everything a run compiles, for one config on one set of devices."""

  mesh: Mesh
  model_cfg: model_lib.ModelConfig  # attention and scatter_free resolved for the platform
  attention_why: str  # why that attention: configured, or what "auto" found
  optimizer: optim.Optimizer  # settings; every state built from this config shares them
  abstract: steps.TrainState  # shapes and dtypes; its static parts are every state's
  shardings: steps.TrainState  # a NamedSharding for every array of the state
  batch_shape: tuple[int, int]  # one global micro-batch of tokens: (batch_size, seq_len + 1)
  weighted: bool  # batches carry "weights" (prompt/completion or chat data: a loss mask)
  compiler_options: dict  # XLA options of the train and eval steps
  one_allreduce: bool  # the train step all-reduces its gradients as one buffer
  init_arrays: Callable[[], dict]  # jitted: a fresh state's arrays, each with its sharding
  train_step: Callable  # jitted (state, batch) -> (state, metrics); the state is donated
  eval_step: Callable  # jitted (state, batch) -> metrics

  def init(self) -> steps.TrainState:
    """A fresh state, every array created directly where its sharding puts it."""
    return self.abstract.with_arrays(self.init_arrays())

  def place(self, batch: dict) -> dict:
    """This process's rows of a micro-batch -> global arrays split over the batch axes."""
    sharding = mesh.batch_sharding(self.mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}

  def batch_spec(self) -> dict:
    (B, T1), sharding = self.batch_shape, mesh.batch_sharding(self.mesh)
    spec = {"tokens": jax.ShapeDtypeStruct((B, T1), "int32", sharding=sharding)}
    if self.weighted:
      spec["weights"] = jax.ShapeDtypeStruct((B, T1 - 1), "float32", sharding=sharding)
    return spec

  def lower_init(self) -> jax.stages.Lowered:
    return self.init_arrays.lower()

  def lower_train(self) -> jax.stages.Lowered:
    return self.train_step.lower(self.abstract, self.batch_spec())

  def compile_train(self) -> jax.stages.Compiled:
    """The train step compiled now (a `Compiled` takes the same arguments)."""
    return self.lower_train().compile()


# XLA options jaxtrain gives GPU train and eval steps; one that XLA_FLAGS names is left to
# XLA_FLAGS. Each stays while the GPU side by side (benchmarks/gpu_side_by_side.py) shows it pays.
GPU_OPTIONS = {
    # A trace (train.profile_steps) runs the steps' command buffers (CUDA graphs) as untraced
    # steps do, instead of launching kernel by kernel: what it shows is what a run does.
    "xla_enable_command_buffers_during_profiling": True,
}


def step_options(platform: str, flops: float, dtype: str, deterministic: bool,
                 xla_flags: str = "", devices: int = 1) -> dict:
  """XLA compile options of the train and eval steps on `platform` (over `devices`): the CPU
  policy's (`cpu.cpu_step_options`), GPU_OPTIONS and XLA's deterministic ops where asked for;
  none that the user's `xla_flags` (XLA_FLAGS) name."""
  if platform == "cpu":
    return cpu.cpu_step_options(flops, xla_flags, dtype, devices=devices)
  if platform != "gpu":
    return {}
  options = {k: v for k, v in GPU_OPTIONS.items() if not re.search(rf"--{k}\b", xla_flags)}
  return {**options, "xla_gpu_deterministic_ops": True} if deterministic else options


def wants_deterministic_gpu_ops() -> bool:
  """Whether XLA_FLAGS ask for XLA's deterministic GPU ops (as `train.deterministic` does)."""
  return "--xla_gpu_deterministic_ops=true" in os.environ.get("XLA_FLAGS", "").lower()


def scatter_free(platform: str) -> bool:
  """Whether train steps on `platform` avoid scatters (`ModelConfig.scatter_free`): not on CPUs,
  where the scatter was fastest; on GPUs a scatter-add queues the tokens of a frequent id."""
  return platform != "cpu"


def build(cfg: ml_collections.ConfigDict, vocab_size: int, devices: list | None = None,
          compiler_options: dict | None = None, eot_id: int = -1) -> Programs:
  """The programs for `cfg` on `devices` (default: all). Nothing is compiled until first use.
  `compiler_options`: default `step_options`'s; `eot_id`: where documents end."""
  cfg = components.prepare(cfg)  # the user's code named in `extend` loaded
  devices = jax.devices() if devices is None else devices
  m = cfg.model
  mesh.check_devices(cfg.mesh, cfg.train.batch_size, devices, m.dtype)
  device_mesh = mesh.make_mesh(cfg.mesh, devices)
  deterministic = cfg.train.deterministic or wants_deterministic_gpu_ops()
  impl, why = attention.resolve_attention(m.attention, m.dtype, m.seq_len, m.n_heads,
                                          m.d_model // m.n_heads, devices[0].platform,
                                          deterministic)
  # Prompt/completion and chat records are documents that must not see each other in a window.
  weighted = bool(cfg.data.prompt_field and cfg.data.completion_field or cfg.data.messages_field)
  doc_mask = m.doc_mask or (weighted and eot_id >= 0)
  if doc_mask and not 0 <= eot_id < vocab_size:
    raise ValueError(f"model.doc_mask needs the tokenizer's end-of-text id, got eot_id={eot_id}")
  model_cfg = dataclasses.replace(model_lib.ModelConfig.from_config(m, vocab_size, cfg.ext),
                                  attention=impl,
                                  eot_id=eot_id, doc_mask=doc_mask,
                                  scatter_free=scatter_free(devices[0].platform))
  loss_scaling = defaults.dynamic_loss_scaling(cfg.optim.loss_scaling, m.dtype)
  optimizer = optim.make_optimizer(cfg.optim, max_steps=cfg.train.max_steps,
                                   grad_accum=cfg.train.grad_accum,
                                   skip_nonfinite=cfg.train.skip_nonfinite,
                                   loss_scaling=loss_scaling, ext=cfg.ext)

  adapters = lora.from_config(cfg.finetune)

  def fresh() -> steps.TrainState:
    # Params split over devices are drawn in their own shapes: each device draws its part.
    return steps.init_state(model_cfg, optimizer, seed=cfg.seed,
                            exact_shapes=device_mesh.shape["fsdp"] != 1, lora=adapters)

  abstract = jax.eval_shape(fresh)
  shardings = mesh.state_shardings(abstract, device_mesh)
  on_cpu = devices[0].platform == "cpu"
  step_flops = model_lib.flops_per_step(model_cfg, cfg.train.batch_size)
  if compiler_options is None:
    compiler_options = step_options(devices[0].platform, step_flops, m.dtype, deterministic,
                                    os.environ.get("XLA_FLAGS", ""), len(devices))
  # (a weighted loss is a mean over the whole batch's weights, not the mean of devices' means)
  one_allreduce = (on_cpu and not weighted and device_mesh.shape["data"] > 1
                   and device_mesh.shape["fsdp"] == 1 and model_cfg.dropout == 0
                   and step_flops / len(devices) < ONE_ALLREDUCE_FLOPS)
  stats = cfg.log.group_stats
  train_fn = mesh.one_allreduce_step(device_mesh, stats) if one_allreduce else \
      functools.partial(steps.train_step, stats=stats)
  batch = mesh.batch_sharding(device_mesh)  # every entry of a batch (tokens, weights)
  rep = NamedSharding(device_mesh, PartitionSpec())
  return Programs(
      mesh=device_mesh, model_cfg=model_cfg, attention_why=why, optimizer=optimizer,
      abstract=abstract, shardings=shardings,
      batch_shape=(cfg.train.batch_size, m.seq_len + 1), weighted=weighted,
      compiler_options=compiler_options,
      one_allreduce=one_allreduce,
      init_arrays=jax.jit(lambda: fresh().arrays(), out_shardings=shardings.arrays()),
      train_step=jax.jit(train_fn, in_shardings=(shardings, batch), out_shardings=(shardings, rep),
                         donate_argnums=0, compiler_options=compiler_options),
      eval_step=jax.jit(steps.eval_step, in_shardings=(shardings, batch), out_shardings=rep,
                        compiler_options=compiler_options),
  )
