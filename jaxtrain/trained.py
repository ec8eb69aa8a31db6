"""A trained run's workdir, as sample and export read it: which checkpoint
`--step=latest|best|N` names, and the state and tokenizer there. Reads go through
`checkpoint.load_state`, like every other reader of checkpoints."""

from pathlib import Path

from jaxtrain import checkpoint, paths, runs, steps
from jaxtrain.errors import UserError


def check_run(workdir: str) -> Path:
  """The workdir of a jaxtrain run, or a one-line UserError."""
  path = Path(workdir).expanduser()
  if not path.is_dir():
    raise UserError(f"workdir {path} does not exist; pass --workdir=<the workdir of a run>, "
                    "e.g. runs/nano")
  if not (path / paths.RUN_FILE).exists():
    raise UserError(f"{path} is not a jaxtrain run (no {paths.RUN_FILE}); pass --workdir=<the "
                    "workdir of a run>, e.g. runs/nano")
  return path


def val_losses(workdir: Path) -> dict[int, float]:
  """{step: val loss} of every evaluation in metrics.jsonl (the later one where a step repeats)."""
  return {int(r["step"]): float(r["val_loss"]) for r in runs.read_jsonl(workdir / "metrics.jsonl")
          if isinstance(r, dict) and r.get("val_loss") is not None}


def best_step(workdir: Path) -> int:
  """The checkpointed step with the lowest validation loss (the run keeps that checkpoint)."""
  ckpts = checkpoint.Checkpoints(str(workdir), read_only=True)
  try:
    on_disk = set(ckpts.all_steps())
  finally:
    ckpts.close()
  evaluated = {s: v for s, v in val_losses(workdir).items() if s in on_disk}
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
  """(state on one device, tokenizer) of a run's checkpoint named by `step`."""
  path = check_run(workdir)
  if step not in ("latest", "best") and not str(step).isdigit():
    resolve_step(path, step)  # raises: a typo in --step is named before anything is read
  if not (path / "tokenizer.json").exists():
    raise UserError(f"{path} has no tokenizer.json; it is not a complete jaxtrain run")
  ckpts = checkpoint.Checkpoints(str(path), read_only=True)
  try:
    any_step = bool(ckpts.all_steps())
  finally:
    ckpts.close()
  if not any_step:
    raise UserError(f"no checkpoint in {path / 'checkpoints'} yet; train first, or wait for the "
                    "run's first checkpoint (train.checkpoint_every)")
  state = checkpoint.load_state(str(path), resolve_step(path, step))
  return state, checkpoint.load_tokenizer(str(path))
