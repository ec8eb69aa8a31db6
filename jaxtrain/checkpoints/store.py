"""Checkpoints through orbax: the state's arrays, the grain iterator and the run's metadata.

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never leaves a checkpoint that `latest_step` would pick. Kept: the `keep` latest steps
plus the one with the best validation loss. Each array's checksum is saved in the step's
metadata: damage found later (a flipped bit, a lost or cut-short file) shows on restore (recover.py).
`survey` computes the checksums and whether the params are finite, for a save and for a
restore's check alike: one compiled program (`compile_survey` compiles it ahead, loop/warmup.py),
or, for a small state in one process on the CPU, numpy on the arrays in place, with the same
digests and no compile (a short run's end and a restore's check then wait for none).
"""

import contextlib
import json
import operator
import time
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from jaxtrain.core import steps


class Damaged(Exception):
  """A checkpoint that cannot be read whole: files missing, cut short or corrupted."""


@contextlib.contextmanager
def naming(what: str):
  """A JSON file that does not parse is damage: named, since the parser does not say which."""
  try:
    yield
  except json.JSONDecodeError as e:
    raise Damaged(f"{what} is not valid JSON: {e}") from None


def complete_steps(workdir: str | Path) -> list[int]:
  """Steps whose checkpoint is whole in `workdir` as far as a listing tells (nothing is opened or
  written): orbax gives a step's directory its number only once everything in it is written (a
  failed save stays a temporary directory), and a damaged one set aside has a name that is not a
  number."""
  directory = Path(workdir).absolute() / "checkpoints"
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and (p / "state").is_dir() and (p / "meta").is_dir())


class Checkpoints:

  def __init__(self, workdir: str, keep: int = 1, read_only: bool = False):
    self.directory = Path(workdir).absolute() / "checkpoints"
    policy = checkpoint_managers.AnyPreservationPolicy([
        checkpoint_managers.LatestN(n=keep),
        # reverse=True sorts by descending loss, and BestN keeps the tail: the lowest loss.
        checkpoint_managers.BestN(get_metric_fn=operator.itemgetter("val_loss"), reverse=True, n=1,
                                  keep_checkpoints_without_metrics=False),
    ])
    # cleanup_tmp_directories: the next start removes what a save cut short by a kill left.
    options = ocp.CheckpointManagerOptions(
        preservation_policy=None if read_only else policy, create=not read_only,
        read_only=read_only, enable_async_checkpointing=True,
        cleanup_tmp_directories=not read_only)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         handler_registry=_handlers())
    # Reads go through a checkpointer of this process alone: the manager's restore ends in a
    # barrier of all processes, which a process that failed to read would never reach.
    alone = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                               active_processes={jax.process_index()})
    self._reader = ocp.Checkpointer(
        ocp.CompositeCheckpointHandler(
            composite_options=ocp.CompositeOptions(multiprocessing_options=alone)),
        multiprocessing_options=alone)
    self._closed = False

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, state: steps.TrainState, iterator: grain.DatasetIterator | None = None,
           meta: dict | None = None, val_loss: float | None = None,
           sums: dict[str, int] | None = None) -> None:
    """Starts an async save of `state` at its step; returns once the arrays are copied. `sums`:
    its arrays' checksums where `survey` gave them already."""
    # The checksums travel in the metadata: any tool that reads orbax checkpoints reads these.
    meta = {**(meta or {}), "checksums": survey(state.arrays())[1] if sums is None else sums}
    items = {"state": ocp.args.PyTreeSave(state.arrays()), "meta": ocp.args.JsonSave(meta)}
    if iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(iterator)
    metrics = None if val_loss is None else {"val_loss": float(val_loss)}
    self.manager.save(int(state.step), args=ocp.args.Composite(**items), metrics=metrics, force=True)

  def read_meta(self, step: int) -> dict:
    """The `meta` that step `step` was saved with."""
    return {k: v for k, v in self._read_meta(step).items() if k != "checksums"}

  def _read_meta(self, step: int) -> dict:
    with naming("meta/metadata"):
      return self._reader.restore(self.directory / str(step),
                                  args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def read(self, step: int, state: steps.TrainState, shardings: steps.TrainState | None = None,
           iterator: grain.DatasetIterator | None = None) -> tuple[steps.TrainState, dict | None]:
    """(the state, the checksums its arrays were saved with: None in checkpoints older than
    them) read into `state`'s structure and `shardings` (default: one device); an `iterator`
    is repositioned in place. Reads this process's part only, with no collectives: a damaged
    checkpoint raises here, on each process that finds it. `verify` the state before use."""
    if shardings is None:
      # jax's constructor, not the SingleDeviceSharding class (deprecated from jax 0.12.1 on)
      one = jax.sharding.make_single_device_sharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: one, state)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          state.arrays(), shardings.arrays())
    if iterator is not None:
      iterator.set_state(self._iterator_state(step))
    with naming("a metadata file of its arrays"):
      restored = self._reader.restore(self.directory / str(step),
                                      args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return state.with_arrays(restored.state), self._read_meta(step).get("checksums")

  def _iterator_state(self, step: int) -> dict:
    data_dir = self.directory / str(step) / "data"
    n = jax.process_count()
    mine = data_dir / f"process_{jax.process_index()}-of-{n}.json"
    if not mine.exists():
      # Saved by another number of processes: every process's iterator stands at the same
      # micro-batch index (each reads its own rows of the same global batch), so any file will
      # do. Saved by as many processes as now, this process's own file is missing.
      saved = sorted(data_dir.glob("process_*-of-*.json"))
      if not saved or any(p.name.endswith(f"-of-{n}.json") for p in saved):
        raise Damaged(f"no data iterator state {mine.name} in {data_dir}")
      mine = saved[0]
    with naming(f"data/{mine.name}"):
      return json.loads(mine.read_text())

  def verify(self, state: steps.TrainState, saved: dict | None) -> str | None:
    """What is wrong with `state`'s arrays, or None if they match the checksums they were
    saved with. A collective: every process calls it, and all get the same answer."""
    if saved is None:
      return None
    now = survey(state.arrays())[1]
    wrong = [name for name in sorted(set(saved) | set(now)) if saved.get(name) != now.get(name)]
    if not wrong:
      return None
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    return f"array data differs from what was saved: checksum of {', '.join(wrong[:3])}{more}"

  def set_aside(self, step: int) -> Path | None:
    """Renames step `step`'s directory to `<step>.damaged-<time>`: orbax takes only numbers for
    steps, so neither restores nor retention nor the clean-up of temporary directories touch
    it, and its files stay for a look. None if it is gone already. Reload the manager after."""
    target = self.directory / f"{step}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while target.exists():
      n += 1
      target = target.with_name(f"{target.name.split('~')[0]}~{n}")
    try:
      (self.directory / str(step)).rename(target)
    except FileNotFoundError:
      return None
    return target

  def close(self) -> None:
    """Waits for pending saves; raises what a failed background write raised."""
    if not self._closed:
      self._closed = True
      try:
        self.manager.wait_until_finished()
      finally:
        self.manager.close()
        self._reader.close()


def _digest(x: jax.Array) -> jax.Array:
  """A uint32 digest of an array's bits, each mixed with its position: a sum of integers, so
  the same whatever the sharding."""
  if x.dtype == jnp.bool_ or x.dtype.itemsize == 1:
    bits = x.astype(jnp.uint32)
  elif x.dtype.itemsize == 2:
    bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  else:  # 8-byte types become pairs of uint32
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
  index, stride = jnp.zeros(bits.shape, jnp.uint32), 1
  for axis in reversed(range(bits.ndim)):
    index += jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(stride % 2**32)
    stride *= bits.shape[axis]
  h = bits ^ (index * jnp.uint32(0x9E3779B9))
  h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)  # murmur3's finalizer: every bit counts
  h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
  return jnp.sum(h ^ (h >> 16), dtype=jnp.uint32)


def host_digest(x: np.ndarray, chunk: int = 1 << 22) -> int:
  """`_digest` of an array in this process's memory, by numpy: the same value, no compile."""
  x = np.ascontiguousarray(x)
  if x.dtype == np.bool_ or x.dtype.itemsize == 1:
    bits = x.astype(np.uint32)
  elif x.dtype.itemsize == 2:
    bits = x.view(np.uint16).astype(np.uint32)
  else:  # an 8-byte value's two words in the order bitcast_convert_type gives them
    bits = x.view(np.uint32)
  bits, total = bits.reshape(-1), 0
  for start in range(0, bits.size, chunk):  # bounded temporaries for a large array
    index = np.arange(start, min(start + chunk, bits.size), dtype=np.uint64).astype(np.uint32)
    h = bits[start:start + chunk] ^ (index * np.uint32(0x9E3779B9))
    h = (h ^ (h >> 16)) * np.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * np.uint32(0xC2B2AE35)
    total = (total + int(np.sum(h ^ (h >> 16), dtype=np.uint32))) % 2**32
  return total


@jax.jit
def _survey(arrays: dict) -> tuple[jax.Array, dict]:
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(arrays["params"])]))
  return finite, jax.tree.map(_digest, arrays)


# A state of at most this many values, in one process on the CPU, is surveyed by numpy: ~0.2 s
# of a 2-core Xeon's time at the most, where the program's compile takes 0.5-2 s.
HOST_SURVEY_VALUES = 1 << 24


def on_host(arrays: dict) -> bool:
  """Whether `survey` reads `arrays` (or their shapes and shardings) with numpy, in place."""
  leaves = jax.tree.leaves(arrays)
  return jax.process_count() == 1 and sum(x.size for x in leaves) <= HOST_SURVEY_VALUES and \
      all(d.platform == "cpu" for x in leaves for d in x.sharding.device_set)


def survey(arrays: dict) -> tuple[bool, dict[str, int]]:
  """(whether every param is finite, {array path: digest}) of a state's arrays: numpy where
  `on_host`, else one program (a collective when they span processes)."""
  arrays = jax.tree.map(jnp.asarray, arrays)  # a Python number among them: as the program sees it
  if on_host(arrays):
    finite = all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(arrays["params"]))
    digests = jax.tree.map(lambda x: host_digest(np.asarray(x)), arrays)
  else:
    finite, digests = jax.device_get(_survey(arrays))
  return bool(finite), {jax.tree_util.keystr(path, simple=True, separator="/"): int(d)
                        for path, d in jax.tree_util.tree_flatten_with_path(digests)[0]}


def compile_survey(abstract: steps.TrainState, shardings: steps.TrainState) -> None:
  """`survey` compiled for states placed as `shardings` places them (none for a state that
  `survey` reads on the host): a save or a restore's check then finds it in jax's cache."""
  placed = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract.arrays(), shardings.arrays())
  if not on_host(placed):
    _survey.lower(placed).compile()


def _handlers() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """orbax's handlers, except that an array replicated over devices is written by one of them
  unless each replica's part would hold 16 MiB or more. orbax otherwise splits every replicated
  array among its replicas (its default unless JAX_PLATFORMS names a GPU), which compiles a slice
  for each array shape and device (benchmarks/results/), for parts one host's memory holds anyway."""
  # (no per-array metadata files: orbax keeps them for typed PRNG keys; a state's rng is raw data)
  arrays = ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=16 << 20,
                                          array_metadata_store=None)
  types = ocp.type_handlers.create_type_handler_registry(
      *[(t, arrays if t is jax.Array else ocp.type_handlers.get_type_handler(t))
        for t in ocp.type_handlers.supported_types()])
  tree = ocp.PyTreeCheckpointHandler(type_handler_registry=types)
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  for args in (ocp.args.PyTreeSave, ocp.args.PyTreeRestore):
    registry.add("state", args, tree)
  return registry
