"""Device mesh and the placement rule for every array of the train state and the batch.

Mesh axes: `data` (pure data parallel) and `fsdp` (data parallel whose params and optimizer
state are split across its devices). The batch's first axis is split over both. A state array
is split over `fsdp` along its largest axis that divides evenly, if it is big enough to be worth
it; everything else (scalars, norm scales, small or indivisible arrays) is replicated.
"""

import functools
from typing import Callable

import jax
import jax.flatten_util
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxtrain import aot, runtime, steps
from jaxtrain import model as model_lib

BATCH_AXES = ("data", "fsdp")
MIN_SHARD_SIZE = 2**10  # arrays with fewer elements are replicated: splitting them costs more
# Data-parallel steps of fewer FLOPs per CPU device all-reduce their gradients at once
# (`one_allreduce_step`). A/B (benchmarks/README.md): the small benchmark model (2e9 per
# device) 0.90-1.00x the step time; nano (7e9) and larger 1.00-1.10x, so they keep XLA's.
ONE_ALLREDUCE_FLOPS = 4e9


def mesh_shape(cfg: ml_collections.ConfigDict, n_devices: int) -> tuple[int, int]:
  data, fsdp = cfg.mesh.data, cfg.mesh.fsdp
  if data == -1:
    data = max(n_devices // fsdp, 1)
  if fsdp == -1:
    fsdp = max(n_devices // data, 1)
  return data, fsdp


def make_mesh(cfg: ml_collections.ConfigDict, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(cfg, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), ("data", "fsdp"))


def array_spec(shape: tuple[int, ...], fsdp: int) -> P:
  if fsdp == 1 or int(np.prod(shape, dtype=np.int64)) < MIN_SHARD_SIZE:
    return P()
  for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
    if shape[axis] % fsdp == 0:
      spec = [None] * len(shape)
      spec[axis] = "fsdp"
      return P(*spec)
  return P()


def state_shardings(state: steps.TrainState, mesh: Mesh) -> steps.TrainState:
  """A TrainState of NamedShardings (works on real or abstract states)."""
  fsdp = mesh.shape["fsdp"]
  return jax.tree.map(lambda x: NamedSharding(mesh, array_spec(x.shape, fsdp)), state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(batch: dict, mesh: Mesh) -> dict:
  """This process's rows of a micro-batch -> one global array split over the batch axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def train_step_for(mesh: Mesh):
  """`steps.train_step`, or `one_allreduce_step(mesh)` where `one_allreduce_applies`."""
  per_device = one_allreduce_step(mesh)

  def train_step(state: steps.TrainState, batch: dict):
    if one_allreduce_applies(mesh, state.model_cfg, batch["tokens"].shape):
      return per_device(state, batch)
    return steps.train_step(state, batch)

  return train_step


def one_allreduce_applies(mesh: Mesh, model_cfg: model_lib.ModelConfig,
                          tokens_shape: tuple[int, int]) -> bool:
  """Pure data parallel on CPU devices, no dropout, under ONE_ALLREDUCE_FLOPS per device."""
  n = mesh.shape["data"]
  if n == 1 or mesh.shape["fsdp"] != 1 or mesh.devices.flat[0].platform != "cpu":
    return False
  flops = model_lib.flops_per_step(model_cfg, tokens_shape[0]) / n
  return model_cfg.dropout == 0 and flops < ONE_ALLREDUCE_FLOPS


def one_allreduce_step(mesh: Mesh):
  """`steps.train_step` written per device, for pure data parallelism without dropout (each
  device would draw its own mask): its rows' gradients, one all-reduce of all of them as one
  flat buffer, then the same optimizer update on every device.

  Under `jax.jit` alone, XLA all-reduces each gradient as the backward pass produces it, and
  XLA:CPU's devices meet once per gradient (29 times a step for the small benchmark model).
  """
  n = mesh.shape["data"] * mesh.shape["fsdp"]

  def train_step(state: steps.TrainState, batch: dict):
    def local(params, loss_scale, tokens_BT1):
      # Varying per device from here: each device's gradients are its own until the psum.
      params = jax.tree.map(lambda p: jax.lax.pcast(p, BATCH_AXES, to="varying"), params)
      loss, grads = steps.gradients(state.replace(params=params, loss_scale=loss_scale),
                                    tokens_BT1, None)
      flat, unflatten = jax.flatten_util.ravel_pytree(grads)
      # Each device's loss is the mean over its rows: the mean of the means is the batch's.
      return jax.lax.psum(loss, BATCH_AXES) / n, unflatten(jax.lax.psum(flat, BATCH_AXES) / n)

    loss, grads = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(BATCH_AXES)),
                                out_specs=(P(), P()))(state.params, state.loss_scale,
                                                      batch["tokens"])
    rng, _ = jax.random.split(state.rng)  # as in train_step: its dropout key goes unused
    return steps.apply_gradients(state, rng, loss, grads)

  return train_step


def jit_steps(state: steps.TrainState, mesh: Mesh, cache_key: dict | None = None):
  """`train_step` and `eval_step`, jitted with explicit shardings; the state is donated.

  With a `cache_key` (what else determines the programs: the config), their lowering is cached
  on disk (`aot`), so that a restart skips tracing the model.
  """
  shardings = state_shardings(state, mesh)
  batch = {"tokens": batch_sharding(mesh)}
  rep = replicated(mesh)
  options = runtime.step_compiler_options()
  if cache_key is None:
    train = jax.jit(train_step_for(mesh), in_shardings=(shardings, batch),
                    out_shardings=(shardings, rep), donate_argnums=0, compiler_options=options)
    evaluate = jax.jit(steps.eval_step, in_shardings=(shardings, batch), out_shardings=rep,
                       compiler_options=options)
    return train, evaluate
  return _flat_steps(state, mesh, shardings, rep, cache_key, options)


def _flat_steps(state, mesh, shardings, rep, cache_key, options):
  """The same two steps as programs over flat lists of arrays, as `aot.cached_jit` needs."""
  array_shardings, tree = jax.tree.flatten(shardings.arrays())
  n = len(array_shardings)
  specs = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
           for x, s in zip(jax.tree.leaves(state.arrays()), array_shardings)]
  tokens = cache_key["batch_shape"]
  specs.append(jax.ShapeDtypeStruct(tuple(tokens), "int32", sharding=batch_sharding(mesh)))
  in_shardings = [*array_shardings, batch_sharding(mesh)]

  train_step = train_step_for(mesh)

  def train_flat(*leaves):
    new, metrics = train_step(state.with_arrays(jax.tree.unflatten(tree, leaves[:n])),
                              {"tokens": leaves[n]})
    return (*jax.tree.leaves(new.arrays()), *(metrics[k] for k in steps.TRAIN_METRICS))

  def eval_flat(*leaves):
    metrics = steps.eval_step(state.with_arrays(jax.tree.unflatten(tree, leaves[:n])),
                              {"tokens": leaves[n]})
    return tuple(metrics[k] for k in steps.EVAL_METRICS)

  train_call = aot.cached_jit("train_step", train_flat, specs, in_shardings,
                              [*array_shardings, *[rep] * len(steps.TRAIN_METRICS)], cache_key,
                              donate=n, compiler_options=options)
  # Evaluation comes later in a run: it is not compiled before the first train step.
  eval_call = functools.cache(lambda: aot.cached_jit("eval_step", eval_flat, specs, in_shardings,
                                                     [rep] * len(steps.EVAL_METRICS), cache_key,
                                                     compiler_options=options))

  def train(state_: steps.TrainState, batch: dict):
    out = train_call(*jax.tree.leaves(state_.arrays()), batch["tokens"])
    return (state_.with_arrays(jax.tree.unflatten(tree, out[:n])),
            dict(zip(steps.TRAIN_METRICS, out[n:])))

  def evaluate(state_: steps.TrainState, batch: dict):
    return dict(zip(steps.EVAL_METRICS,
                    eval_call()(*jax.tree.leaves(state_.arrays()), batch["tokens"])))

  return train, evaluate


def init_sharded(init_fn, abstract: steps.TrainState, mesh: Mesh,
                 cache_key: dict | None = None) -> steps.TrainState:
  """Runs `init_fn` so that every array is created directly with its final sharding."""
  return lower_init(init_fn, abstract, mesh, cache_key)()


def lower_init(init_fn, abstract: steps.TrainState, mesh: Mesh,
               cache_key: dict | None = None) -> Callable[[], steps.TrainState]:
  """Traces and lowers `init_sharded`'s program now; the function returned compiles and runs it
  (in any thread: a run compiles it beside the train step).

  Only the arrays come out of the jitted call; the static parts (graphdef, optimizer) are the
  abstract state's, so every state of a run shares them and the jitted steps compile once.
  """
  array_shardings, tree = jax.tree.flatten(state_shardings(abstract, mesh).arrays())
  if cache_key is None:
    lowered = jax.jit(lambda: init_fn().arrays(),
                      out_shardings=tree.unflatten(array_shardings)).lower()
    return lambda: abstract.with_arrays(lowered.compile()())
  lowered = aot.cached_lower("init_state", lambda: tuple(jax.tree.leaves(init_fn().arrays())),
                             [], [], array_shardings, cache_key)
  return lambda: abstract.with_arrays(jax.tree.unflatten(tree, lowered.compile()()))
