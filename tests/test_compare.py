"""`python -m jaxtrain.compare` on hand-made runs: the table, its order, the marks, the plots."""

import json
import subprocess
import sys

import matplotlib.image
import pytest

from jaxtrain.config import defaults as config
from jaxtrain.system import paths
from jaxtrain.tools import compare, runs

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _make_run(path, lr: float, n_layers: int, val: list[float], max_steps: int = 40,
              status: dict | None = None):
  path.mkdir(parents=True)
  cfg = config.override(config.default_config(), **{
      "workdir": str(path), "optim.lr": lr, "model.n_layers": n_layers,
      "train.max_steps": max_steps})
  paths.write_json(path / paths.RUN_FILE, {"jaxtrain_version": "test"})
  paths.write_json(path / "config.json", cfg.to_dict())
  lines = []
  for i, v in enumerate(val, start=1):
    step = 10 * i
    lines.append({"step": step, "loss": v + 0.1, "lr": lr, "tokens_per_sec": 1000.0 * i,
                  "elapsed_s": 2.0 * step})
    lines.append({"step": step, "val_loss": v, "val_bpb": v / 0.693, "elapsed_s": 2.0 * step})
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines)
                                      + '{"step": 99, "loss"')  # a line a kill cut short
  if status is not None:
    paths.write_json(path / paths.STATUS_FILE, status)


@pytest.fixture
def sweep_root(tmp_path):
  root = tmp_path / "sweep"
  done = {"state": "finished", "step": 40, "params": 123456}
  _make_run(root / "lr=1e-3", 1e-3, 2, [3.0, 2.5, 2.2, 2.1], status=done)
  _make_run(root / "lr=3e-3", 3e-3, 2, [2.8, 2.2, 1.9, 1.8], status=done)
  _make_run(root / "lr=1e-2", 1e-2, 4, [2.9, 2.4], status={"state": "running", "step": 0})
  (root / "logs").mkdir()  # not a run: left out
  return root


def test_table_lists_differences_best_first_and_marks_unfinished(sweep_root, tmp_path):
  printed = []
  out = tmp_path / "cmp"
  infos = compare.compare([str(sweep_root)], out, printed.append)
  assert [i.path.name for i in infos] == ["lr=3e-3", "lr=1e-3", "lr=1e-2"]
  table = printed[0].splitlines()
  assert table[0].split() == ["run", "model.n_layers", "optim.lr", "params", "steps", "best",
                              "val", "final", "val", "val", "bpb", "tok/s", "time", "state"]
  best = table[2].split()
  assert best[:6] == ["lr=3e-3", "2", "0.003", "123.46k", "40/40", "1.8000"]
  assert best[-2:] == ["1m20s", "done"]  # elapsed_s of the last line; finished
  assert best[-3] == "2.50k"  # the median tokens/s
  unfinished = table[4].split()
  assert unfinished[0] == "lr=1e-2" and unfinished[-1] == "killed"  # "running", but no lock held
  assert unfinished[4] == "20/40"
  assert printed[1] == "best: lr=3e-3 (val loss 1.8000)"
  md = (out / "compare.md").read_text().splitlines()
  assert md[0].startswith("| run | model.n_layers | optim.lr |") and len(md) == 5
  for png in ("loss_vs_step.png", "loss_vs_time.png"):
    image = matplotlib.image.imread(out / png)
    assert image.shape[0] > 300 and image.shape[1] > 600


def test_globs_and_single_runs(sweep_root):
  printed = []
  infos = compare.compare([str(sweep_root / "lr=1e-*"), str(sweep_root / "lr=1e-3")],
                          print_fn=printed.append)
  assert sorted(i.path.name for i in infos) == ["lr=1e-2", "lr=1e-3"]  # no run twice


def test_a_finished_run_without_status_file_counts_by_its_steps(tmp_path):
  _make_run(tmp_path / "old", 1e-3, 2, [3.0, 2.0, 1.5, 1.4])
  _make_run(tmp_path / "short", 1e-3, 2, [3.0])
  assert runs.read(tmp_path / "old").state == "finished"
  assert runs.read(tmp_path / "short").state == "unfinished"


def test_cli_says_what_is_wrong_in_one_line(tmp_path):
  res = subprocess.run([sys.executable, "-m", "jaxtrain.compare", str(tmp_path / "nothing*")],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
  assert res.returncode == 2
  assert res.stderr.count("\n") == 1 and "no jaxtrain run at" in res.stderr
