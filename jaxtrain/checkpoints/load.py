"""Reading a trained run's workdir outside the training loop (sample, export, eval, init_from,
notebooks): the state of a checkpoint on one device, its tokenizer, which checkpoint
`--step=latest|best|N` names, and a field of its saved config. No data is needed."""

import contextlib
import logging
import numbers
import sys
from pathlib import Path

import jax

from jaxtrain.checkpoints import recover
from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.config import extensions, loading
from jaxtrain.core import programs as programs_lib
from jaxtrain.core import steps
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import invocation, lock, paths
from jaxtrain.system.errors import ConfigError, UserError


def _not_read_only_notice(record: logging.LogRecord) -> bool:
  """orbax warns that a read-only checkpoint manager is read-only: here that is the point."""
  return not record.getMessage().startswith(("Given directory is read only",
                                             "CheckpointManagerOptions.read_only=True"))


def read_only(workdir) -> Checkpoints:
  """The run's checkpoints, opened to read (orbax's notices of that silenced)."""
  absl_logger = logging.getLogger("absl")
  absl_logger.addFilter(_not_read_only_notice)
  try:
    return Checkpoints(str(workdir), read_only=True)
  finally:
    absl_logger.removeFilter(_not_read_only_notice)


def data_field(workdir: str, name: str, given: str, fallback: str) -> str:
  """`given` (a command's flag), else the run's data.<name> (its config.json), else `fallback`."""
  if given:
    return given
  try:
    saved = paths.read_json(Path(workdir) / "config.json")
  except (OSError, ValueError):
    saved = {}
  return (saved.get("data") or {}).get(name) or fallback


def model_section(workdir: str, step: int) -> dict:
  """The model.* fields that checkpoint `step` of a run was saved with, as saved (a field this
  jaxtrain does not know included), on today's defaults of those it knows."""
  with contextlib.closing(read_only(workdir)) as ckpts:
    saved = (ckpts.read_meta(step).get("config") or {}).get("model") or {}
  return {**loading.default_config().model.to_dict(), **saved}


def _steps_on_disk(workdir) -> list[int]:
  with contextlib.closing(read_only(workdir)) as ckpts:
    return ckpts.all_steps()


def best_step(workdir: Path) -> int:
  """The checkpointed step with the lowest validation loss (the run keeps that checkpoint), as
  metrics.jsonl has it (the later evaluation where a step repeats)."""
  on_disk = set(_steps_on_disk(workdir))
  evaluated = {int(r["step"]): float(r["val_loss"]) for r in paths.read_jsonl(workdir / "metrics.jsonl")
               if r.get("val_loss") is not None and int(r["step"]) in on_disk}
  if not evaluated:
    raise UserError(f"no checkpoint of {workdir} has a validation loss (steps on disk: "
                    f"{sorted(on_disk) or 'none'}); pass --step=latest or a step number")
  return min(evaluated, key=lambda s: (evaluated[s], s))  # a tie: the first to reach it


def resolve_step(workdir: Path, step: str) -> int | None:
  """`--step`'s value as a step number; None for the newest intact checkpoint."""
  step = str(step).strip()
  if step == "latest":
    return None
  if step == "best":
    return best_step(workdir)
  if step.isdigit():
    return int(step)
  raise UserError(f"--step={step} is not latest, best or a step number; pass e.g. --step=best")


def load(workdir: str, step: str = "latest") -> tuple[steps.TrainState, object]:
  """(state on one device, tokenizer) of a run's checkpoint named by `step`; a workdir that is no
  jaxtrain run, or has no checkpoint yet, is a one-line UserError."""
  path = Path(workdir).expanduser()
  if not path.is_dir():
    raise UserError(f"workdir {path} does not exist; pass --workdir=<the workdir of a run>, "
                    "e.g. runs/nano")
  if not (path / paths.RUN_FILE).exists():
    raise UserError(f"{path} is not a jaxtrain run (no {paths.RUN_FILE}); pass --workdir=<the "
                    "workdir of a run>, e.g. runs/nano")
  if step not in ("latest", "best") and not str(step).isdigit():
    resolve_step(path, step)  # raises: a typo in --step is named before anything is read
  if not (path / "tokenizer.json").exists():
    raise UserError(f"{path} has no tokenizer.json; it is not a complete jaxtrain run")
  if not _steps_on_disk(path):
    raise UserError(f"no checkpoint in {path / 'checkpoints'} yet; train first, or wait for the "
                    "run's first checkpoint (train.checkpoint_every)")
  state = load_state(str(path), resolve_step(path, step))
  return state, load_tokenizer(str(path))


def load_tokenizer(workdir: str):
  """The tokenizer a run in `workdir` trained with: `.encode(text)`, `.decode(ids)`."""
  return tokenizer_lib.load(str(Path(workdir) / "tokenizer.json"))


def load_state(workdir: str, step: int | str | None = None) -> steps.TrainState:
  """The train state saved in a run's workdir, on one device: its newest checkpoint that reads
  whole (None or "latest"; a damaged one is skipped with a warning on stderr and left where it is:
  reading a run changes none of its files, and only its training sets a damaged checkpoint aside),
  the one with the lowest validation loss ("best"), or step `step`, as --step names them."""
  if isinstance(step, str):
    step = resolve_step(Path(workdir).expanduser(), step)
  elif step is not None:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
      raise UserError(f"step={step!r} names no checkpoint: pass None, \"latest\", \"best\" or a "
                      "step number")
    step = int(step)
  with contextlib.closing(read_only(workdir)) as ckpts:
    def read(s: int):
      programs = _programs(workdir, ckpts.read_meta(s))
      return *ckpts.read(s, programs.abstract, programs.shardings), None

    if step is None:
      if ckpts.latest_step() is None:
        raise UserError(f"no checkpoint in {ckpts.directory}; train first ({invocation.command()})")
      live = lock.is_held(Path(workdir) / lock.WORKDIR_LOCK)
      return recover.newest_intact(ckpts, read, lambda line: print(line, file=sys.stderr),
                                   using="loading", fresh="nothing to load", collective=False,
                                   move=False, held=live)[1]
    if step not in ckpts.all_steps():
      raise UserError(f"no checkpoint of step {step} in {ckpts.directory} (it has steps "
                      f"{ckpts.all_steps()})")
    return recover.read_one(ckpts, step, read)


def changed_code(workdir: str, saved: dict) -> str | None:
  """A warning line where the extension code found now is not what the run ran (`saved`: its
  config): the state is read, but its model may then compute something else. None where it is."""
  then = saved.get(extensions.SOURCES_KEY) or {}
  now = extensions.record(extensions.load(saved.get("extend", ""), then)) if then else {}
  code = extensions.changed(then, now)
  if not code:
    return None
  return (f"warning: {workdir} is read with extension code other than the run ran: "
          f"{', '.join(code)}; its model may compute something else than it trained (what the run "
          f"ran is in {Path(workdir).expanduser() / 'extend'}/)")


def _programs(workdir: str, meta: dict) -> programs_lib.Programs:
  try:
    cfg = loading.from_saved(meta["config"])
  except ConfigError as e:  # its hint, --config.extend, is no flag of the commands that read a run
    gone = [s["path"] for s in (meta["config"].get(extensions.SOURCES_KEY) or {}).values()
            if not Path(s["path"]).is_file()]
    if e.field != "extend" or not gone:
      raise
    raise UserError(f"{workdir} was trained with the extension {', '.join(gone)}, which is not "
                    f"there now; put it back (the code the run ran is in "
                    f"{Path(workdir).expanduser() / 'extend'}/)") from None
  line = changed_code(workdir, meta["config"])
  if line:
    print(line, file=sys.stderr)
  cfg.mesh.data, cfg.mesh.fsdp = 1, 1  # one device, whatever the run trained on
  if jax.devices()[0].platform == "cpu" and cfg.model.dtype == "float16":
    cfg.model.dtype = "float32"  # compute dtype only (params are float32): CPUs lack float16
  tok = load_tokenizer(workdir)
  return programs_lib.build(cfg, cfg.model.vocab_size or tok.vocab_size, devices=jax.devices()[:1],
                            eot_id=tok.eot_id)
