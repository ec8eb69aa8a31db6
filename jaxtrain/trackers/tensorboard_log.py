"""TensorBoard event files in each run's workdir (trackers/tfevents.py; no TensorFlow or torch):
`tensorboard --logdir runs` shows every run under runs/ side by side. The records' numbers are
scalars (named by `tag`), the config hparams, the end-of-run samples text. A resumed run drops the
events past the step it restored, as metrics.jsonl's hook does, so its curves continue without a
second copy of any step.
"""

import os
import time
from pathlib import Path

from jaxtrain.config import loading
from jaxtrain.trackers import tfevents
from jaxtrain.trackers.hooks import Hook, RunResult, RunView

EVENT_FILES = f"{tfevents.FILE_PREFIX}*"
PERF = ("tokens_per_sec", "mfu")
SKIP = ("step", "elapsed_s")
HPARAMS_TAG = "_hparams_/"  # tensorboard's hparams plugin writes its summaries under this prefix


def tag(section: str, key: str) -> str:
  """The scalar's name: train/loss, perf/mfu, memory/peak_rss_mib, val/bpb, ...; a key that
  names its own section keeps it (grad_norm/attention: one chart per group under grad_norm)."""
  if "/" in key:
    return key
  if key.endswith("_bytes"):
    return f"memory/{key[:-len('_bytes')]}_mib"
  if key in PERF:
    return f"perf/{key}"
  return f"{section}/{key.removeprefix('val_')}"


def scalars(section: str, record: dict) -> dict[str, float]:
  """{tag: value} of a record's numbers, as TensorBoard (and W&B) show them: bytes as MiB."""
  return {tag(section, key): value / 2**20 if key.endswith("_bytes") else value
          for key, value in record.items()
          if key not in SKIP and isinstance(value, int | float) and not isinstance(value, bool)}


class TensorBoard(Hook):
  """Writes the run's event file (process 0's: standard.py attaches it there)."""

  def __init__(self):
    self.writer = None

  def on_start(self, run: RunView, step: int) -> None:
    workdir = Path(run.workdir)
    old = sorted(workdir.glob(EVENT_FILES))
    # Files are named by the second: a suffix keeps a quick second leg's file apart from the
    # first's, which is deleted below.
    self.writer = tfevents.EventWriter(workdir, f".{os.getpid()}.{time.time_ns()}")
    seen = set()
    for path in old:  # into the new file: what an earlier leg wrote up to `step`
      for record in tfevents.read_records(path):
        event_step, version, tags = tfevents.parse(record)
        if record in seen or event_step > step or version or any(
            t.startswith(HPARAMS_TAG) for t in tags):
          continue  # the hparams are written anew below: this leg's config may differ
        seen.add(record)
        self.writer.write(record)
    for summary in tfevents.hparams(loading.flatten(run.cfg.to_dict()), ["val/loss"]):
      self.writer.write(tfevents.event(step, summary))
    self.writer.flush()  # the kept events are safe in the new file before the old ones go
    for path in old:
      path.unlink(missing_ok=True)

  def _scalars(self, section: str, step: int, record: dict) -> None:
    wall_time = time.time()
    for name, value in scalars(section, record).items():
      self.writer.write(tfevents.event(step, tfevents.scalar(name, value), wall_time))

  def on_log(self, step: int, record: dict) -> None:
    self._scalars("train", step, record)

  def on_eval(self, step: int, record: dict) -> None:
    self._scalars("val", step, record)
    self.writer.flush()

  def on_end(self, result: RunResult | None) -> None:
    if self.writer is None:
      return
    if result is not None and result.samples:
      # Markdown would fold the samples' lines and read their code as markup: code blocks keep them.
      text = "\n\n".join(f"sample {i}:\n\n```\n{s}\n```" for i, s in enumerate(result.samples))
      self.writer.write(tfevents.event(result.step, tfevents.text("samples", text)))
    self.writer.close()
    self.writer = None
