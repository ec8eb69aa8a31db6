"""Device mesh and the placement rule for every array of the train state and the batch.

Mesh axes: `data` (pure data parallel) and `fsdp` (data parallel whose params and optimizer
state are split across its devices). The batch's first axis is split over both. A state array
is split over `fsdp` along its largest axis that divides evenly, if it is big enough to be worth
it; everything else (scalars, norm scales, small or indivisible arrays) is replicated.
"""

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxtrain import steps

BATCH_AXES = ("data", "fsdp")
MIN_SHARD_SIZE = 2**10  # arrays with fewer elements are replicated: splitting them costs more


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


def jit_steps(state: steps.TrainState, mesh: Mesh):
  """`train_step` and `eval_step`, jitted with explicit shardings; the state is donated."""
  shardings = state_shardings(state, mesh)
  batch = {"tokens": batch_sharding(mesh)}
  rep = replicated(mesh)
  train = jax.jit(steps.train_step, in_shardings=(shardings, batch),
                  out_shardings=(shardings, rep), donate_argnums=0)
  evaluate = jax.jit(steps.eval_step, in_shardings=(shardings, batch), out_shardings=rep)
  return train, evaluate


def init_sharded(init_fn, abstract: steps.TrainState, mesh: Mesh) -> steps.TrainState:
  """Runs `init_fn` so that every array is created directly with its final sharding.

  Only the arrays come out of the jitted call; the static parts (graphdef, optimizer) are the
  abstract state's, so every state of a run shares them and the jitted steps compile once.
  """
  arrays = jax.jit(lambda: init_fn().arrays(),
                   out_shardings=state_shardings(abstract, mesh).arrays())()
  return abstract.with_arrays(arrays)
