"""Device mesh and the placement rule for every array of the train state and the batch.

Mesh axes: `data` (pure data parallel) and `fsdp` (data parallel whose params and optimizer
state are split across its devices). The batch's first axis is split over both. A state array
is split over `fsdp` along its largest axis that divides evenly, if it is big enough to be worth
it; everything else (scalars, norm scales, small or indivisible arrays) is replicated.
"""

import jax
import jax.flatten_util
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtrain.core import steps
from jaxtrain.system.errors import ConfigError

BATCH_AXES = ("data", "fsdp")
MIN_SHARD_SIZE = 2**10  # arrays with fewer elements are replicated: splitting them costs more


def mesh_shape(mesh: ml_collections.ConfigDict, n_devices: int) -> tuple[int, int]:
  """(data, fsdp) axis sizes from the `mesh` section, -1 taking the devices left."""
  data, fsdp = mesh.data, mesh.fsdp
  if data == -1:
    data = max(n_devices // fsdp, 1)
  if fsdp == -1:
    fsdp = max(n_devices // data, 1)
  return data, fsdp


def check_devices(mesh: ml_collections.ConfigDict, batch_size: int, devices: list,
                  dtype: str) -> None:
  """What the config asks of the devices: a mesh that uses them all, a batch that splits
  evenly over them and their processes, a dtype the platform computes in."""
  n_devices = len(devices)
  n_processes = len({d.process_index for d in devices})
  if devices[0].platform == "cpu" and dtype == "float16":
    raise ConfigError("model.dtype", "float16 is not supported on CPU (XLA has no float16 matmul "
                      "with float32 accumulation there)",
                      "pass --config.model.dtype=bfloat16 on CPU; float16 is for GPUs")
  data, fsdp = mesh_shape(mesh, n_devices)
  if data * fsdp != n_devices:
    raise ConfigError("mesh.data", f"mesh.data={mesh.data} x mesh.fsdp={mesh.fsdp} does not use "
                      f"the {n_devices} devices",
                      f"make mesh.data * mesh.fsdp = {n_devices} (or set one of them to -1)")
  b = batch_size
  if b % n_devices:
    raise ConfigError("train.batch_size", f"{b} does not split evenly over {n_devices} devices",
                      f"pass a multiple of {n_devices}, e.g. "
                      f"--config.train.batch_size={max(n_devices, b - b % n_devices)}")
  if b % n_processes:
    raise ConfigError("train.batch_size", f"{b} does not split evenly over {n_processes} "
                      "processes", f"pass a multiple of {n_processes}")


def make_mesh(mesh: ml_collections.ConfigDict, devices: list | None = None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh, len(devices))
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


def one_allreduce_step(mesh: Mesh, stats: str = "none"):
  """`steps.train_step` written per device, for pure data parallelism without dropout (each
  device would draw its own mask): its rows' gradients, one all-reduce of all of them as one
  flat buffer (under `jax.jit` alone, XLA:CPU's devices meet once per gradient), then the same
  optimizer update on every device."""
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
    return steps.apply_gradients(state, rng, loss, grads, stats)

  return train_step
