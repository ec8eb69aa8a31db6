"""TensorBoard event files in each run's workdir (tensorboardX's writer; no TensorFlow):
`tensorboard --logdir runs` shows every run under runs/ side by side.

Scalars: the train lines' numbers (train/loss, train/lr, train/grad_norm), speed (perf/...),
memory (memory/..._mib), the per-group statistics (grad_norm/<group>, param_norm/<group>,
update_ratio/<group>) and every number of an evaluation (val/loss, val/ppl, val/bpb, ...); the
config as hparams; the end-of-run samples as text. A resumed run drops the events past the step
it restored, as metrics.jsonl's hook does, so its curves continue without a second copy of any step.
"""

import math
import os
import struct
import time
from pathlib import Path

import jax

from jaxtrain.config import loading
from jaxtrain.trackers.hooks import Hook, RunResult, RunView

EVENT_FILES = "events.out.tfevents.*"
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
  if "/" in key:  # named in full already: val/<source>/loss
    return key
  return f"{section}/{key.removeprefix('val_')}"


def scalars(section: str, record: dict) -> dict[str, float]:
  """{tag: value} of a record's numbers, as TensorBoard (and W&B) show them: bytes as MiB."""
  return {tag(section, key): value / 2**20 if key.endswith("_bytes") else value
          for key, value in record.items()
          if key not in SKIP and isinstance(value, int | float) and not isinstance(value, bool)}


def read_records(path: Path) -> list[bytes]:
  """The records of a TFRecord file (8-byte length, 4-byte checksum, data, 4-byte checksum); a
  last record that a kill cut short is left out."""
  data, records, i = path.read_bytes(), [], 0
  while i + 12 <= len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    if i + 12 + n + 4 > len(data):
      break
    records.append(data[i + 12:i + 12 + n])
    i += 12 + n + 4
  return records


def _hparams(cfg) -> dict:
  """The config as flat hparams; anything that is not a number, text or bool as text."""
  return {k: v if isinstance(v, bool | int | float | str) else str(v)
          for k, v in loading.flatten(cfg.to_dict()).items()}


class TensorBoard(Hook):
  """Writes the run's event file (process 0 only)."""

  def __init__(self, flush_secs: int = 10):
    self.flush_secs = flush_secs
    self.writer = None

  def prepare(self) -> None:
    if jax.process_index() == 0:  # seconds where torch is installed: tensorboardX imports it
      import tensorboardX.proto.event_pb2  # noqa: F401

  def on_start(self, run: RunView, step: int) -> None:
    if jax.process_index() != 0:
      return
    from tensorboardX import SummaryWriter, summary
    from tensorboardX.proto.event_pb2 import Event

    workdir = Path(run.workdir)
    old = sorted(workdir.glob(EVENT_FILES))
    # tensorboardX names files by the second: a suffix keeps a quick second leg's file apart
    # from the first's, which is deleted below.
    self.writer = SummaryWriter(logdir=str(workdir), flush_secs=self.flush_secs,
                                filename_suffix=f".{os.getpid()}.{time.time_ns()}")
    file_writer = self.writer.file_writer
    seen = set()
    for path in old:  # into the new file: what an earlier leg wrote up to `step`
      for record in read_records(path):
        event = Event.FromString(record)
        if record in seen or event.step > step or event.HasField("file_version") or any(
            v.tag.startswith(HPARAMS_TAG) for v in event.summary.value):
          continue  # the hparams are written anew below: this leg's config may differ
        seen.add(record)
        file_writer.add_event(event, event.step, event.wall_time)
    exp, ssi, sei = summary.hparams(_hparams(run.cfg), {"val/loss": math.nan})
    for s in (exp, ssi, sei):
      file_writer.add_summary(s, step)
    self.writer.flush()  # the kept events are safe in the new file before the old ones go
    for path in old:
      path.unlink(missing_ok=True)

  def _scalars(self, section: str, step: int, record: dict) -> None:
    if self.writer is None:
      return
    for name, value in scalars(section, record).items():
      self.writer.add_scalar(name, value, step)

  def on_log(self, step: int, record: dict) -> None:
    self._scalars("train", step, record)

  def on_eval(self, step: int, record: dict) -> None:
    self._scalars("val", step, record)
    if self.writer is not None:
      self.writer.flush()

  def on_end(self, result: RunResult | None) -> None:
    if self.writer is None:
      return
    if result is not None and result.samples:
      # Markdown would fold the samples' lines and read their code as markup: code blocks keep them.
      text = "\n\n".join(f"sample {i}:\n\n```\n{s}\n```" for i, s in enumerate(result.samples))
      self.writer.add_text("samples", text, result.step)
    self.writer.close()
    self.writer = None
