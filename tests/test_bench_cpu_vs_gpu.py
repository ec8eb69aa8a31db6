"""benchmarks/cpu_vs_gpu.py and benchmarks/scaling.py run end to end at tiny settings on the CPU;
every benchmark writes to a dated directory by default."""

import datetime
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT


def run_benchmark(script: str, *args: str, timeout: float = 600) -> str:
  result = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
                          text=True, timeout=timeout)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout


def load_benchmark(script: str):
  spec = importlib.util.spec_from_file_location(script, ROOT / "benchmarks" / f"{script}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_default_output_directories_are_dated(monkeypatch):
  monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put benchmarks/ on it
  # The modules the scripts import: gone again afterwards.
  for name in ("common", "reports", "step_worker", "sides", "cpu_vs_gpu"):
    monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, name)
  results = ROOT / "benchmarks" / "results"
  today = datetime.date.today().isoformat()
  assert load_benchmark("cpu_vs_gpu").parse_args([]).out == str(results / f"{today}-cpu_vs_gpu")
  assert load_benchmark("scaling").parse_args([]).out == str(results / f"{today}-scaling")
  jax_vs_torch = load_benchmark("jax_vs_torch")
  assert jax_vs_torch.parse_args(["--shapes=large"]).out == \
      str(results / f"{today}-jax_vs_torch_large")
  assert jax_vs_torch.parse_args(["--label=x", "--out=/tmp/o"]).out == "/tmp/o"
  whole = load_benchmark("whole_command").parse_args(["--parts=one_step", "--configs=configs/nano.py"])
  assert whole.out is None and whole.parts == ["one_step"] and whole.runs == 3
  with pytest.raises(SystemExit):  # the Shakespeare configs need their text
    load_benchmark("whole_command").parse_args(["--parts=recipe"])


def check_machine_and_load(report: dict) -> None:
  m = report["machine"]
  assert m["cpu_model"] and m["cores_available"] >= 1 and m["versions"]["jax"]
  load = report["load"]
  assert len(load["loadavg_before"]) == 3 and len(load["loadavg_after"]) == 3
  assert {"busy_pct", "own_pct", "other_pct", "steal_pct"} <= set(load["sampler"]["all"])


@pytest.mark.slow
def test_cpu_vs_gpu_writes_a_cpu_row_with_speed_mfu_and_memory(tmp_path):
  stdout = run_benchmark("cpu_vs_gpu.py", "--configs=nano", "--platforms=cpu", "--steps=2",
                         "--warmup=1", "--batch-size=4", "--peak-size=512", "--peak-repeats=3",
                         f"--out={tmp_path}")
  assert "== nano on cpu" in stdout and "compiled in" in stdout

  report = json.loads((tmp_path / "cpu_vs_gpu.json").read_text())
  check_machine_and_load(report)
  cpu = report["platforms"]["cpu"]
  assert cpu["available"] and {"float32", "bfloat16"} <= set(cpu["matmul_peak"])
  assert all(p["gflops"] > 0 for p in cpu["matmul_peak"].values())
  [row] = report["results"]
  assert (row["platform"], row["config"], row["status"]) == ("cpu", "nano", "ok")
  assert (row["batch_size"], row["seq_len"]) == (4, 128) and len(row["step_times_s"]) == 2
  # Built by programs.build on the CPU devices jaxtrain splits the cores into, as a run is.
  assert row["n_devices"] == row["mesh"]["data"] * row["mesh"]["fsdp"] >= 1
  assert isinstance(row["compiler_options"], dict) and isinstance(row["one_allreduce"], bool)
  assert row["compile_s"] > 0 and row["tokens_per_s"] > 0
  # Against this run's own peak (a 512^3 matmul here, which nano's step can outrun on a busy
  # machine: no upper bound); no datasheet peak for CPUs.
  peak = cpu["matmul_peak"]["float32"]["gflops"] * 1e9
  assert row["mfu_measured"] == pytest.approx(row["flops_per_token"] * row["tokens_per_s"] / peak)
  assert row["mfu_measured"] > 0 and row["mfu_published"] is None
  memory = row["memory"]
  assert memory["host_peak_bytes"] > memory["host_before_bytes"] > 0
  assert memory["device_peak_bytes"] is None and row["estimate_bytes"] > 0
  assert report["speedups"] == [] and report["gpu"]["name"] is None

  md = (tmp_path / "cpu_vs_gpu.md").read_text()
  assert "| nano | cpu |" in md and "other processes" in md and "XLA options" in md
  assert f"- GPU: {report['gpu']['note']}" in md  # no GPU ran, and the report says why
  if importlib.util.find_spec("jax_cuda12_plugin") is None:
    assert "no GPU platform available on this machine" in md
  assert (tmp_path / "cpu_vs_gpu.png").stat().st_size > 0


TINY_CONFIG = """
from jaxtrain.config.defaults import default_config
from jaxtrain.config.loading import override


def get_config():
  return override(default_config(), **{"model.n_layers": 2, "model.d_model": 32,
                                       "model.seq_len": 32, "train.batch_size": 4})
"""


@pytest.mark.slow
def test_scaling_over_one_and_two_virtual_devices(tmp_path):
  config = tmp_path / "tiny.py"  # compiles three times faster than nano: three rows to compile
  config.write_text(TINY_CONFIG)
  run_benchmark("scaling.py", f"--configs={config}", "--platforms=cpu", "--devices=1,2",
                "--modes=dp,fsdp", "--steps=2", "--warmup=1", f"--out={tmp_path}")

  report = json.loads((tmp_path / "scaling.json").read_text())
  check_machine_and_load(report)
  rows = {(r["mode"], r["devices"]): r for r in report["results"]}
  assert set(rows) == {("single", 1), ("dp", 2), ("fsdp", 2)}
  assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in rows.values())
  assert rows[("single", 1)]["speedup_vs_1"] == 1.0
  assert rows[("dp", 2)]["mesh"] == {"data": 2, "fsdp": 1}
  assert rows[("fsdp", 2)]["mesh"] == {"data": 1, "fsdp": 2}
  # Same batches from the same init: sharding changes only the order of sums.
  assert all(r["loss_diff_vs_1"] < 1e-4 for r in rows.values())
  assert rows[("fsdp", 2)]["estimate_bytes"] < rows[("single", 1)]["estimate_bytes"]

  md = (tmp_path / "scaling.md").read_text()
  assert "| tiny | cpu | fsdp | 2 |" in md and "virtual devices" in md
  assert "- gpu: not run: no GPU" in md
  assert (tmp_path / "scaling.png").stat().st_size > 0
