"""Weights & Biases in offline mode (no network): the run's .wandb file holds the logged history,
config and samples, and a resumed run continues the same W&B run. W&B missing or failing is one
warning line, and the run trains on."""

import json
import sys
import types
from pathlib import Path

import pytest

from jaxtrain import train
from jaxtrain.trackers import wandb_log

wandb = pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[wandb]')")
from wandb.proto import wandb_internal_pb2  # noqa: E402

BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of checksummed chunks
HEADER = 7  # ":W&B", a 2-byte magic number, a version byte


def read_records(path: Path) -> list:
  """The protobuf records of a .wandb file, chunks joined (FULL=1, FIRST=2, MIDDLE=3, LAST=4)."""
  data, records, i, part = path.read_bytes(), [], HEADER, b""
  assert data[:4] == b":W&B"
  while i + 7 <= len(data):
    if BLOCK - i % BLOCK < 7:  # a block's tail too short for a chunk header is padding
      i += BLOCK - i % BLOCK
      continue
    n, kind = int.from_bytes(data[i + 4:i + 6], "little"), data[i + 6]
    chunk, i = data[i + 7:i + 7 + n], i + 7 + n
    if kind == 0:
      break
    part = chunk if kind in (1, 2) else part + chunk
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(part)
      records.append(record)
  return records


def _offline_runs(workdir: Path) -> list[dict]:
  """Each offline run directory's run id, config keys and history rows {key: value, _step}."""
  runs = []
  for d in sorted(workdir.glob("wandb/offline-run-*")):
    (log,) = d.glob("run-*.wandb")
    out = {"dir": d, "id": None, "config": {}, "history": []}
    for r in read_records(log):
      kind = r.WhichOneof("record_type")
      if kind == "run":
        out["id"] = r.run.run_id
      elif kind == "config":
        out["config"].update({u.key: json.loads(u.value_json) for u in r.config.update})
      elif kind == "history":
        out["history"].append({(u.key or "/".join(u.nested_key)): json.loads(u.value_json)
                               for u in r.history.item})
    runs.append(out)
  return runs


@pytest.fixture
def offline(monkeypatch, tmp_path):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  for var in ("WANDB_DIR", "WANDB_RUN_ID", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RESUME"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
  monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


@pytest.mark.slow
def test_offline_run_holds_the_history_and_a_resume_continues_it(tiny, tmp_path, offline):
  tiny.log.wandb = True
  tiny.train.max_steps, tiny.train.log_every, tiny.train.eval_every = 6, 2, 6
  tiny.train.checkpoint_every = 6
  first = train.run(tiny, show_progress=False)
  workdir = tmp_path / "run"
  run_id = json.loads((workdir / wandb_log.RUN_FILE).read_text())["id"]
  tiny.train.max_steps = 10
  tiny.train.eval_every = 10
  second = train.run(tiny, show_progress=False)
  assert (first.step, second.step) == (6, 10)

  runs = _offline_runs(workdir)
  assert len(runs) == 2 and [r["id"] for r in runs] == [run_id, run_id]
  metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  for leg, steps, result in zip(runs, ([2, 4, 6], [8, 10]), (first, second)):
    assert leg["config"]["model"]["d_model"] == tiny.model.d_model
    assert leg["config"]["log"]["wandb"] is True
    train_rows = [h for h in leg["history"] if "train/loss" in h]
    assert [h["_step"] for h in train_rows] == steps
    for h in train_rows:
      want = next(m for m in metrics if m["step"] == h["_step"] and "loss" in m)
      assert h["train/loss"] == pytest.approx(want["loss"], rel=1e-6)
      assert h["update_ratio/attention"] == pytest.approx(want["update_ratio/attention"], rel=1e-6)
      assert {"train/lr", "train/grad_norm", "grad_norm/embedding", "param_norm/mlp"} <= set(h)
    val = [h for h in leg["history"] if "val/loss" in h]
    assert [h["_step"] for h in val] == steps[-1:]
    (table,) = [h for h in leg["history"] if "samples/path" in h]  # the end-of-run samples
    assert table["_step"] == steps[-1]
    rows = json.loads((leg["dir"] / "files" / table["samples/path"]).read_text())["data"]
    assert [text for _, text in rows] == result.samples and result.samples
  assert runs[1]["history"][-1]["_step"] == 10


def _start(tmp_path, tiny) -> tuple[wandb_log.WandB, list[str]]:
  said = []
  hook = wandb_log.WandB(tiny.log.wandb_project, tiny.log.wandb_mode)
  hook.on_start(types.SimpleNamespace(workdir=tmp_path, cfg=tiny,
                                      out=types.SimpleNamespace(print=said.append)), 0)
  return hook, said


def test_absent_package_is_one_line(tiny, tmp_path, monkeypatch):
  tiny.log.wandb = True
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  hook, said = _start(tmp_path, tiny)
  assert hook.run is None
  assert said == ["warning: log.wandb=True but the wandb package is not installed (pip install "
                  "'jaxtrain[wandb]'); training goes on with TensorBoard only"]
  hook.on_log(1, {"loss": 1.0})
  hook.on_end(None)


def test_failed_login_is_one_line(tiny, tmp_path, monkeypatch):
  tiny.log.wandb, tiny.log.wandb_mode = True, "online"
  for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_PROJECT"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key to log in with
  monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
  monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # W&B prompts for a key on a terminal
  hook, said = _start(tmp_path, tiny)
  assert hook.run is None
  assert len(said) == 1 and said[0].startswith("warning: W&B did not start (")
  assert "login" in said[0]  # W&B's own reason: no API key
  assert said[0].endswith("; training goes on with TensorBoard only")
