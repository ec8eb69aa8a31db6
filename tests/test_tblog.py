"""TensorBoard event files, read back with tensorboard's own reader; memory in the train lines;
status.json."""

import json
import shutil

import pytest
from tensorboard.backend.event_processing import event_accumulator

from jaxtrain import train
from jaxtrain.measure import memory
from jaxtrain.system import paths
from jaxtrain.trackers import tensorboard_log, tfevents


def _accumulator(workdir, purge: bool = True) -> event_accumulator.EventAccumulator:
  acc = event_accumulator.EventAccumulator(str(workdir), size_guidance={"scalars": 0, "tensors": 0},
                                           purge_orphaned_data=purge)
  return acc.Reload()


def _metrics(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_event_files_hold_the_run_and_a_resume_continues_them(tiny, tmp_path):
  tiny.train.max_steps = 10
  tiny.train.log_every = 1
  tiny.train.eval_every = 5
  tiny.train.checkpoint_every = 5
  workdir = tmp_path / "run"
  first = train.run(tiny, show_progress=False)
  assert first.step == 10
  # As if the run had been killed after logging step 10 but before its checkpoint was written.
  shutil.rmtree(workdir / "checkpoints" / "10")
  status = json.loads((workdir / paths.STATUS_FILE).read_text())
  assert status["state"] == "finished" and status["step"] == 10 and status["params"] > 0

  second = train.run(tiny, show_progress=False)
  assert second.step == 10
  assert len(list(workdir.glob(tensorboard_log.EVENT_FILES))) == 1  # the first leg's file was folded in

  metrics = _metrics(workdir)
  # Without tensorboard's purging of orphaned steps: each step is in the file once.
  for acc in (_accumulator(workdir, purge=False), _accumulator(workdir)):
    tags = acc.Tags()
    for name in ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_sec",
                 "memory/peak_rss_mib", "val/loss", "val/ppl"):
      assert name in tags["scalars"], (name, tags["scalars"])
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 11))
    want = {r["step"]: r["loss"] for r in metrics if "loss" in r}
    assert [e.value for e in loss] == pytest.approx([want[s] for s in range(1, 11)], rel=1e-6)
    val = acc.Scalars("val/loss")
    assert [e.step for e in val] == [5, 10]
    assert val[-1].value == pytest.approx(second.val_loss, rel=1e-6)
    rss = acc.Scalars("memory/peak_rss_mib")
    assert all(10 < e.value < 1e6 for e in rss)  # MiB: a JAX process takes more than 10 MiB
  # The config as hparams (one set, from the latest leg), the samples as text.
  plugins = acc.PluginTagToContent("hparams")
  assert sum(tag == "_hparams_/session_start_info" for tag in plugins) == 1
  assert "optim.lr" in plugins["_hparams_/session_start_info"].decode("latin-1")
  text = acc.Tensors("samples/text_summary")
  assert text[-1].step == 10
  assert second.samples[0][:10] in text[-1].tensor_proto.string_val[0].decode()


def test_tags_name_their_section():
  assert tensorboard_log.tag("train", "loss") == "train/loss"
  assert tensorboard_log.tag("val", "val_bpb") == "val/bpb"
  assert tensorboard_log.tag("train", "mfu") == "perf/mfu"
  assert tensorboard_log.tag("train", "peak_rss_bytes") == "memory/peak_rss_mib"


def test_a_record_cut_short_by_a_kill_is_left_out(tmp_path):
  writer = tfevents.EventWriter(tmp_path)
  for step in range(3):
    writer.write(tfevents.event(step, tfevents.scalar("x", step)))
  writer.close()
  whole = tfevents.read_records(writer.path)
  assert [tfevents.parse(r)[:2] for r in whole] == [(0, True), (0, False), (1, False), (2, False)]
  writer.path.write_bytes(writer.path.read_bytes()[:-5])
  assert tfevents.read_records(writer.path) == whole[:-1]


def test_events_read_back_with_tensorboards_own_protos(tmp_path):
  """What the writer encodes by hand is what TensorBoard's protos decode, checksums included."""
  from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
  from tensorboard.compat.proto.event_pb2 import Event
  from tensorboard.plugins.hparams import plugin_data_pb2

  writer = tfevents.EventWriter(tmp_path)
  writer.write(tfevents.event(7, tfevents.scalar("train/loss", 2.5), wall_time=100.25))
  writer.write(tfevents.event(7, tfevents.text("samples", "caf\u00e9 \u2502 ok")))
  for summary in tfevents.hparams({"optim.lr": 0.01, "model.qk_norm": True, "data.path": "x.txt",
                                   "train.max_steps": 300}, ["val/loss"]):
    writer.write(tfevents.event(7, summary))
  writer.close()
  # tensorboard's reader checks each record's CRC-32C
  events = [Event.FromString(r) for r in RawEventFileLoader(str(writer.path)).Load()]
  assert events[0].file_version == "brain.Event:2"
  scalar, text, *hp = events[1:]
  assert (scalar.step, scalar.wall_time, scalar.summary.value[0].tag) == (7, 100.25, "train/loss")
  assert scalar.summary.value[0].simple_value == 2.5
  assert text.summary.value[0].tag == "samples/text_summary"
  assert text.summary.value[0].metadata.plugin_data.plugin_name == "text"
  assert text.summary.value[0].tensor.string_val[0].decode() == "caf\u00e9 \u2502 ok"
  assert [e.summary.value[0].tag for e in hp] == list(tfevents.HPARAMS_TAGS)
  data = [plugin_data_pb2.HParamsPluginData.FromString(e.summary.value[0].metadata.plugin_data
                                                       .content) for e in hp]
  assert [i.name for i in data[0].experiment.hparam_infos] == ["optim.lr", "model.qk_norm",
                                                               "data.path", "train.max_steps"]
  assert data[0].experiment.metric_infos[0].name.tag == "val/loss"
  values = data[1].session_start_info.hparams
  assert values["optim.lr"].number_value == 0.01 and values["model.qk_norm"].bool_value
  assert values["data.path"].string_value == "x.txt"
  assert values["train.max_steps"].number_value == 300
  assert data[2].session_end_info.status == 1  # STATUS_SUCCESS
  assert [tfevents.parse(r) for r in tfevents.read_records(writer.path)][1] == \
      (7, False, ["train/loss"])


def test_memory_warns_once_when_the_host_runs_low():
  plenty = memory.Watch(host=lambda: (16 * 2**30, 8 * 2**30))
  record, text, warning = plenty.read()
  assert record["peak_rss_bytes"] > 2**20 and text.startswith("rss ") and warning is None
  low = memory.Watch(host=lambda: (16 * 2**30, 1 * 2**30))
  _, _, warning = low.read()
  assert "1.00 GiB of 16.00 GiB RAM available" in warning
  assert "train.batch_size" in warning and "model.seq_len" in warning
  assert low.read()[2] is None  # said once
