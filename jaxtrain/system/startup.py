"""How this process starts, decided in one place and recorded: the platform jax runs on, how many
processes the run has, how many XLA devices the CPU becomes, the allocator and the XLA flags
jaxtrain adds, each with what chose it (`Decision`; `decision()` is the process's record). Every
entry point asks here: `python -m jaxtrain` (`reexec`, as the package is imported, then its
run's `settle`), `import jaxtrain` (`early`), a run from a notebook or a script (`settle`), the speed
probe's own process and the benchmarks (`settle`).

jax fixes the CPU's device count, and XLA reads XLA_FLAGS, when the backend starts: `settle`
applies its decision before (jax.config, XLA_FLAGS, jax.distributed), or, where the backend
started already, takes its devices from those there are (`devices`). A flag it added that a
later decision drops is taken out of XLA_FLAGS again; a count or flag the user gave wins. The
same config settled twice in one process gets the same decision.

Free of heavy imports (jax is imported only where it is used): `import jaxtrain` and the command
line's restart read it before jax is imported.
"""

from __future__ import annotations  # ml_collections, a config's type, is not imported here

import collections
import dataclasses
import importlib.machinery
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from jaxtrain.system import allocator, invocation, machine

if TYPE_CHECKING:
  import ml_collections

# Each accelerator plugin's platform: where one is installed and nothing names a platform, jax
# starts on it (and falls back to the CPU when it finds no device).
PLUGINS = {"jax_cuda12_plugin": "gpu", "jax_cuda13_plugin": "gpu", "jax_rocm60_plugin": "gpu",
           "jax_rocm7_plugin": "gpu", "libtpu": "tpu"}
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
# A CPU collective waits this long for another process before it fails (gloo's own wait is far
# longer): a dead peer's connection does not always break (XLA:CPU's collectives over several
# devices of each process wait for it silently), and the survivor must stop with its own line
# before jax's heartbeat (runtime.HEARTBEAT_GRACE_S later) ends it with pages of C++.
COLLECTIVE_TIMEOUT = "--xla_cpu_collective_timeout_seconds"


@dataclasses.dataclass(frozen=True)
class Decision:
  """How this process runs, and what chose each part."""

  by: str  # who asked: "import jaxtrain", "a run", "the speed probe", a benchmark's name
  platform: str  # where jax is to run: "cpu", "gpu", "tpu" (`platform`)
  platform_from: str
  processes: int  # the run's processes (`planned_processes`)
  processes_from: str
  cpu_devices: int = 0  # on a CPU, the XLA devices a run of this process trains on (0: all)
  devices_from: str = ""
  ours: int = 0  # the device count jaxtrain gave jax (0: none; a count there is else the user's)
  xla_flags: tuple[str, ...] = ()  # what jaxtrain added to XLA_FLAGS
  allocator: str = ""  # the allocator under XLA's buffers (a CPU run's first line says it)
  started: str = ""  # the platform jax started on ("": not started by `settle`)
  notes: tuple[str, ...] = ()  # what a run says of its start, each line naming what avoids it


_RECORD: list[Decision] = []  # this process's decisions, the newest last


def decision() -> Decision | None:
  """The newest decision of this process (None: none made)."""
  return _RECORD[-1] if _RECORD else None


def _record(d: Decision) -> Decision:
  _RECORD.append(d)
  return d


# ---- the platform ----------------------------------------------------------------------------


def installed_plugins() -> list[str]:
  """The accelerator plugins (PLUGINS) importable here."""
  return [name for name in PLUGINS if importlib.util.find_spec(name) is not None]


def cuda_installed() -> bool:
  return any(name.startswith("jax_cuda") for name in installed_plugins())


def _flag(argv: list[str], name: str) -> str | None:
  """The value of `--name=v` or `--name v` in argv (the last one), or None."""
  value = None
  for i, arg in enumerate(argv):
    key, eq, v = arg.lstrip("-").partition("=")
    if key == name and arg.startswith("-"):
      value = v if eq else (argv[i + 1] if i + 1 < len(argv) else "")
  return value


def platform(environ: dict | None = None, argv: list[str] | None = None) -> tuple[str, str]:
  """(the platform a run will use, what says so), known before jax starts: --jax_platforms in
  `argv`, else jax.config's (in this process, where jax is imported), else JAX_PLATFORMS, else
  an installed accelerator plugin's, else the CPU. `environ`, `argv`: another process's."""
  here = environ is None
  environ = os.environ if here else environ
  argv = (sys.argv if here else []) if argv is None else argv
  given = [(_flag(argv, "jax_platforms"), "--jax_platforms")]
  if here and (jax := sys.modules.get("jax")) is not None:
    given.append((jax.config.jax_platforms, "jax_platforms (jax.config)"))
  given.append((environ.get("JAX_PLATFORMS"), "JAX_PLATFORMS"))
  for value, name in given:
    if value:
      return value.split(",")[0], f"{name}={value}"
  plugins = installed_plugins()
  if plugins:
    return PLUGINS[plugins[0]], f"{plugins[0]} is installed"
  return "cpu", "no accelerator plugin installed"


# ---- processes -------------------------------------------------------------------------------


def planned_processes(distributed: ml_collections.ConfigDict) -> tuple[int, str]:
  """(how many processes the run will have once they join, what says so), known before jax
  starts: `distributed.num_processes`, else Slurm's task count under srun, else 1. What is split
  per process (the CPU's devices, the batch's rows) is decided from it before the join."""
  if distributed.num_processes:
    return distributed.num_processes, f"distributed.num_processes={distributed.num_processes}"
  if "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    return int(os.environ["SLURM_NTASKS"]), f"Slurm's {os.environ['SLURM_NTASKS']} tasks (srun)"
  return 1, "one process"


def joins(distributed: ml_collections.ConfigDict) -> bool:
  """Whether a run of `distributed` joins other processes (jax.distributed)."""
  return bool(distributed.coordinator_address) or planned_processes(distributed)[0] > 1


# ---- the CPU's devices -----------------------------------------------------------------------


def cpu_device_count(cfg: ml_collections.ConfigDict, cores: int | None = None) -> tuple[int, str]:
  """(how many XLA devices to split this host's CPU cores into, why).

  One XLA CPU device keeps about one core busy outside its large matmuls; several devices run
  side by side (data parallel). A count the config asks for (`mesh.cpu_devices`, or `mesh.data`
  x `mesh.fsdp` where neither is -1) is kept. Auto: the most devices, up to the core count, that
  split this process's share of the batch evenly (and a set `mesh.data` or `mesh.fsdp` too).
  """
  if cfg.mesh.cpu_devices:
    return cfg.mesh.cpu_devices, f"mesh.cpu_devices={cfg.mesh.cpu_devices}"
  processes = planned_processes(cfg.distributed)[0]
  data, fsdp = cfg.mesh.data, cfg.mesh.fsdp
  if data > 0 and fsdp > 0:  # the whole mesh is given: that many devices over the processes
    return max(data * fsdp // processes, 1), f"mesh.data={data} x mesh.fsdp={fsdp}"
  multiple = max(data, fsdp, 1)  # the axis that is set; the other (-1) takes the devices left
  cores = cores or machine.cores()
  rows = cfg.train.batch_size // processes
  fitting = [d for d in range(multiple, min(cores, rows) + 1, multiple) if rows % d == 0]
  return max(fitting, default=multiple), (f"auto: {cores} cores, {rows} rows of the batch"
                                          f"{' a process' * (processes > 1)}")


def split_note(cfg: ml_collections.ConfigDict, cores: int | None = None) -> str | None:
  """The line that says the automatic split leaves cores out because the batch does not split
  over them (None where it uses them all, or where the count was asked for)."""
  cores = cores or machine.cores()
  processes = planned_processes(cfg.distributed)[0]
  rows = cfg.train.batch_size // processes
  n = cpu_device_count(cfg, cores)[0]
  if cfg.mesh.cpu_devices or max(cfg.mesh.data, cfg.mesh.fsdp) > 1 or n >= min(cores, rows):
    return None  # asked for, or a set mesh axis that the count must be a multiple of
  b = cfg.train.batch_size
  whole = cores * processes  # a batch that splits over every core of every process
  sizes = sorted({x for x in (b - b % whole, b - b % whole + whole) if x > 0})
  return (f"note: train.batch_size={b} does not split over the {cores} CPU cores"
          f"{' of each process' if processes > 1 else ''}: training on {n} device"
          f"{'s' if n > 1 else ''} (mesh.cpu_devices=0, auto, takes the most that split the batch); "
          f"--config.train.batch_size={' or '.join(map(str, sizes))} uses every core")


def _users_count(ours: int) -> str | None:
  """What gives a CPU device count that is the user's, not jaxtrain's (`ours`), or None."""
  if DEVICE_COUNT_FLAG in os.environ.get("XLA_FLAGS", ""):
    return f"XLA_FLAGS {DEVICE_COUNT_FLAG}"
  jax = sys.modules.get("jax")
  if jax is None:
    return "JAX_NUM_CPU_DEVICES" if os.environ.get("JAX_NUM_CPU_DEVICES") else None
  count = jax.config.jax_num_cpu_devices
  return None if count in (-1, ours) else f"jax_num_cpu_devices={count}"


def _give_jax(n: int) -> bool:
  """Sets jax's CPU device count to `n`; False where its backend started with another count."""
  import jax

  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:  # the backend started: its count stays
    return False
  return True


def _split(cfg: ml_collections.ConfigDict, ours: int) -> dict:
  """The CPU's part of a decision for a run of `cfg` (`ours`: the count jaxtrain gave jax so far)."""
  theirs = _users_count(ours)
  if theirs:
    return {"cpu_devices": 0, "devices_from": f"yours: {theirs}", "ours": 0}
  n, why = cpu_device_count(cfg)
  note = split_note(cfg)
  if _give_jax(n):
    return {"cpu_devices": n, "devices_from": why, "ours": n, "notes": (note,) if note else ()}
  import jax

  have = jax.local_device_count()
  if have >= n and ours:  # jaxtrain's split (`import jaxtrain`, an earlier run): n of them
    return {"cpu_devices": n, "devices_from": f"{why}; {n} of the {have} devices split before",
            "ours": ours, "notes": (note,) if note else ()}
  devices = f"{have} XLA CPU device{'s' * (have > 1)}"
  if ours:  # jaxtrain's own split, made for another run of this process
    lost = (f"note: an earlier run in this process split the CPU into {devices} where this run "
            f"makes {n} ({why}); start a new Python process to train on them")
  else:
    lost = (f"note: jax started before jaxtrain could split the CPU: {devices} where `python -m "
            f"jaxtrain` makes {n} ({machine.cores()} cores here, data parallel); `import "
            "jaxtrain` before anything uses jax (restart the kernel or script) to train on them")
  return {"cpu_devices": 0, "devices_from": f"started before this run: its {have}", "ours": ours,
          "notes": (lost,) if have < n else ()}


def devices() -> list:
  """The devices a run trains on (after `settle`): all of them, but of a CPU that jaxtrain split
  into more than the run's split (`import jaxtrain`, an earlier run), each process's first
  `cpu_devices` (of a multi-process run, `jax.devices()` lists every process's)."""
  import jax

  every, d = jax.devices(), decision()
  if d is None or not d.cpu_devices or every[0].platform != "cpu":
    return every
  taken, kept = collections.Counter(), []
  for device in every:
    if taken[device.process_index] < d.cpu_devices:
      taken[device.process_index] += 1
      kept.append(device)
  return kept


# ---- XLA flags -------------------------------------------------------------------------------


def _set_flags(wanted: tuple[str, ...], added: tuple[str, ...]) -> tuple[str, ...]:
  """XLA_FLAGS with the flags jaxtrain `added` before taken out and `wanted` put in, but none
  whose name the user's own flags give; returns what it put in."""
  users = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in added]
  named = {f.split("=")[0] for f in users}
  put = tuple(f for f in wanted if f.split("=")[0] not in named)
  if users or put:
    os.environ["XLA_FLAGS"] = " ".join([*users, *put])
  else:
    os.environ.pop("XLA_FLAGS", None)
  return put


def _flags_for(distributed: ml_collections.ConfigDict) -> tuple[str, ...]:
  return (f"{COLLECTIVE_TIMEOUT}={distributed.timeout_s}",) if joins(distributed) else ()


def describe(d: Decision) -> str:
  """The decision in one line, each part with what chose it (`--dry_run` prints it)."""
  devices = (f"{d.cpu_devices} XLA CPU device{'s' * (d.cpu_devices > 1)} ({d.devices_from})"
             if d.cpu_devices else f"its devices ({d.devices_from or 'not a CPU run'})")
  return (f"start-up ({d.by}): {d.started or d.platform} ({d.platform_from}); {d.processes} "
          f"process{'es' * (d.processes > 1)} ({d.processes_from}); {devices}; "
          + (f"{d.allocator} allocator; " if d.allocator else "")
          + f"XLA flags added: {' '.join(d.xla_flags) or 'none'}")


# ---- the entry points ------------------------------------------------------------------------


def _command() -> bool:
  """Whether this process is one of jaxtrain's commands (`python -m jaxtrain...`, `jaxtrain...`)."""
  ran = invocation.started() or ""
  return ran.startswith("-m jaxtrain") or invocation.script() in invocation.SCRIPTS.values()


def settle(cfg: ml_collections.ConfigDict, by: str | None = None) -> Decision:
  """Decides how a run of `cfg` starts, applies it (the CPU's devices, XLA's flags, the join of
  the run's processes), starts jax's backend and records it all (`by`: who asked; default the
  command line's run, or a notebook's or script's). Call it before anything else starts jax:
  what it cannot change any more, it takes as it is and says."""
  by = by or (f"`{invocation.command()}`" if _command() else "a run from a notebook or script")
  before = decision()
  name, name_from = platform()
  processes, processes_from = planned_processes(cfg.distributed)
  split = _split(cfg, before.ours if before else 0) if name == "cpu" else {}
  flags = _set_flags(_flags_for(cfg.distributed), before.xla_flags if before else ())
  import jax  # here, and jax's plumbing: `import jaxtrain` imports neither

  from jaxtrain.system import runtime

  if joins(cfg.distributed) and not jax.distributed.is_initialized():  # once a process
    runtime.init_distributed(cfg.distributed)
  started = runtime.check_platform(cuda_installed())
  notes = list(split.get("notes", ()))
  if started == "cpu":
    notes.append(allocator.lost_note())
  if started == "cpu" and name != "cpu":
    notes.append(f"note: jax found no {name} device and runs on the CPU unsplit ({name_from}); "
                 "--jax_platforms=cpu splits the CPU into devices as a CPU run does")
  return _record(Decision(
      by=by, platform=name, platform_from=name_from, processes=processes,
      processes_from=processes_from, xla_flags=flags, started=started,
      allocator=allocator.in_use() if started == "cpu" else "",
      notes=tuple(n for n in notes if n), **{k: v for k, v in split.items() if k != "notes"}))


class _WhenJaxLoads:
  """A finder on sys.meta_path that gives jax the CPU device count `n` as jax is imported (jax
  fixes it when its backend starts; `import jaxtrain` stays cheap by not importing jax itself)."""

  def __init__(self, n: int):
    self.n = n

  def find_spec(self, name: str, path=None, target=None):
    if name != "jax":
      return None
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
      return spec
    load = spec.loader.exec_module

    def exec_module(module) -> None:
      load(module)
      if self in sys.meta_path:
        sys.meta_path.remove(self)
      if not _users_count(self.n):
        module.config.update("jax_num_cpu_devices", self.n)

    spec.loader.exec_module = exec_module
    return spec


def early() -> Decision | None:
  """`import jaxtrain` in a notebook or a script, as the CPU's platform: as many XLA CPU devices
  as cores, given to jax before its backend starts, so that a run's split (`settle`) is there
  even where jax is used before it. Nothing in jaxtrain's own commands (their run settles), nor
  where the user gave a count, nor where jax was imported first."""
  if _command():
    return None
  name, name_from = platform()
  cores = machine.cores()
  if "jax" in sys.modules or name != "cpu" or cores < 2 or _users_count(0):
    return None  # a script that imported jax first chose its devices itself
  sys.meta_path.insert(0, _WhenJaxLoads(cores))
  return _record(Decision(by="import jaxtrain", platform=name, platform_from=name_from,
                          processes=1, processes_from="not known before a run",
                          cpu_devices=cores, devices_from="import jaxtrain: one per core",
                          ours=cores))


def restart_environment(environ: dict | None = None, argv: list[str] | None = None) -> dict | None:
  """The environment `python -m jaxtrain` (`argv`, `environ`: default this process's) restarts
  itself under, or None: the allocator measured on CPUs (mimalloc), for a run on the CPU."""
  environ = dict(os.environ if environ is None else environ)
  on_cpu = platform(environ, sys.argv if argv is None else argv)[0] == "cpu"
  return allocator.environment(environ, on_cpu)


def reexec() -> None:
  """First of all in `python -m jaxtrain` (and the `jaxtrain` script), as the package is imported:
  the process restarted under `restart_environment()`; elsewhere nothing."""
  allocator.reexec(restart_environment() if allocator.started_as_cli() else None)
