"""Runs as they lie on disk, for the tools that look at many of them (compare, sweep): finding
them from paths and globs, reading their config, metrics and status."""

import dataclasses
import glob
import math
import statistics
from pathlib import Path

from jaxtrain.config import defaults, loading
from jaxtrain.system import lock, paths
from jaxtrain.system.errors import UserError


def _number(x) -> float | None:
  return x if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


@dataclasses.dataclass
class RunInfo:
  path: Path
  config: dict  # flat: {"optim.lr": 0.003, ...}
  train: list[dict]  # metrics.jsonl's train lines
  evals: list[dict]  # its evaluation lines
  status: dict  # status.json, {} for a run that has none

  @property
  def max_steps(self) -> int | None:
    return self.config.get("train.max_steps")

  @property
  def step(self) -> int:
    steps = [r["step"] for r in self.train + self.evals]
    return max(steps, default=self.status.get("step", 0))

  @property
  def state(self) -> str:
    """finished | stopped (by a signal; resumable) | failed | running | killed | unfinished."""
    s = self.status.get("state")
    if s == "running":  # left behind by a process that was killed, unless it still runs
      return "running" if lock.run_alive(self.path, self.status) else "killed"
    if s is None:  # a run older than status.json: finished if it reached its last step
      return "finished" if self.max_steps and self.step >= self.max_steps else "unfinished"
    return s

  @property
  def finished(self) -> bool:
    return self.state == "finished"

  def values(self, key: str) -> list[float]:
    """The key's finite values in step order, from evaluation lines or else train lines."""
    records = self.evals if any(key in r for r in self.evals) else self.train
    return [v for r in records if (v := _number(r.get(key))) is not None]

  def best(self, key: str = "val_loss") -> float | None:
    """The lowest value, or the highest of an accuracy (task/<name>/exact_match, mc_accuracy)."""
    return (max if defaults.higher_is_better(key) else min)(self.values(key), default=None)

  def final(self, key: str) -> float | None:
    values = self.values(key)
    return values[-1] if values else None

  def median_speed(self) -> float | None:
    speeds = self.values("tokens_per_sec")
    return statistics.median(speeds) if speeds else None

  def wall_s(self) -> float | None:
    """The wall time of the run's commands, start-up included (status.json's wall_s), else (a run
    from before it was kept) its training seconds (metrics.jsonl's elapsed_s)."""
    wall = _number(self.status.get("wall_s"))
    return wall if wall is not None else max(
        (v for r in self.train + self.evals if (v := _number(r.get("elapsed_s"))) is not None),
        default=None)


def read(path: Path) -> RunInfo:
  path = Path(path)
  cfg_path = path / "config.json"
  flat = loading.flatten(paths.read_json(cfg_path)) if cfg_path.exists() else {}
  status = paths.read_dict(path / paths.STATUS_FILE)
  records = paths.read_jsonl(path / "metrics.jsonl")
  return RunInfo(path, flat, [r for r in records if "loss" in r],
                 [r for r in records if "val_loss" in r], status)


def find(patterns: list[str]) -> list[Path]:
  """The run directories that paths or globs name: a run itself, or a directory whose
  subdirectories are runs (a sweep's root). In order, without repeats."""
  found: list[Path] = []
  for pattern in patterns:
    matches = sorted(glob.glob(str(Path(pattern).expanduser()))) or [pattern]
    hits = []
    for match in map(Path, matches):
      if paths.is_run(match):
        hits.append(match)
      elif match.is_dir():
        hits += sorted(p for p in match.iterdir() if p.is_dir() and paths.is_run(p))
    if not hits:
      raise UserError(f"no jaxtrain run at {pattern} (a run's directory holds {paths.RUN_FILE}); "
                      "pass run directories, globs of them, or a directory of runs")
    found += [p for p in hits if p not in found]
  return found
