"""benchmarks/gpu_side_by_side.py's smoke run (toy sizes on the CPU, jaxtrain's side: CI has no
nanoGPT checkout) writes every part and the report."""

import json
import os
import subprocess
import sys

import jax
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_side_by_side import FLAG_VARIANTS  # noqa: E402  (after the path above)


@pytest.mark.slow
def test_the_smoke_run_writes_every_part_and_the_report(corpus_file, tmp_path):
  out = tmp_path / "out"
  result = subprocess.run([sys.executable, "benchmarks/gpu_side_by_side.py", "--smoke",
                           f"--data={corpus_file}", f"--out={out}"], cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
                          text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  parts = {p: json.loads((out / f"{p}.json").read_text())
           for p in ("install", "tests", "throughput", "variants", "profile", "shakespeare")}
  install = parts["install"]  # resolves jaxtrain's own metadata, installs nothing
  assert install["exit_status"] == 0 and install["command"][-1] == ".[cuda13-local]"
  assert "--dry-run" in install["command"] and install["versions"]["jax"] == jax.__version__
  assert parts["tests"]["counts"].get("skipped", 0) >= 1  # no GPU here: every GPU test skips
  rows = parts["throughput"]["rows"]
  assert {(r["side"], r["tokens"]) for r in rows} == {("jaxtrain", "random"), ("jaxtrain", "text")}
  assert all(r["tokens_per_sec"] > 0 for r in rows)
  files = parts["throughput"]["token_files"]  # both kinds written, Zipf text vs uniform ids
  assert files["text"]["top10_share"] > 10 * files["random"]["top10_share"]
  shipped, fused, flag = parts["variants"]["rows"]  # the smoke run's: the first two variants
  assert fused["variant"] == "model.fused_loss=False" and flag["xla_flags"] == FLAG_VARIANTS[0]
  assert all(r["tokens_per_sec"] > 0 for r in (shipped, fused, flag))
  assert parts["profile"]["traces"]["jaxtrain"].endswith("perfetto_trace.json.gz")
  [run] = parts["shakespeare"]["runs"]
  assert run["best_val"] == min(v for _, _, v in run["evals"]) and run["to_best_s"] > 0
  md = (out / "side_by_side.md").read_text()
  assert "Smoke run" in md and "| jaxtrain | text |" in md and "best val" in md
  assert "## Install" in md and "| model.fused_loss=False | 4 |" in md
  assert (out / "throughput.png").stat().st_size > 0 and (out / "val_loss.png").stat().st_size > 0


def test_each_flag_variant_is_an_xla_option_of_this_jaxlib():
  """XLA parses a compile's options on every backend, so the CPU build checks the GPU flags'
  names and values (those of jax 0.11 on, the GPU extras' floor, where this jax is older)."""
  f = jax.jit(lambda x: x + 1).lower(1.0)
  for flag in FLAG_VARIANTS:
    name, value = flag.removeprefix("--").split("=")
    if "pdl" in name and tuple(map(int, jax.__version__.split(".")[:2])) < (0, 11):
      continue
    f.compile(compiler_options={name: {"true": True, "false": False}.get(value, value)})


def test_the_install_takes_pyprojects_ranges_and_the_carried_wheels_alone():
  import gpu_install
  from gpu_runs import Setup

  reqs = gpu_install.requirements(gpu_install.BEYOND_THE_IMAGE)
  assert [r.split(">")[0] for r in reqs[:3]] == ["grain", "ml-collections", "cmeel-mimalloc"]
  assert all(">=" in r and ";" not in r for r in reqs) and reqs[-1].startswith("setuptools")
  s = Setup(out=ROOT, data=ROOT, nanogpt=None, smoke=False, batch=16, steps=60, jaxtrain_flags=[],
            wheels=ROOT / ".gpu" / "wheels")
  assert gpu_install.install_command(s)[3:] == [
      "install", "--disable-pip-version-check", "--no-input", "--no-index",
      f"--find-links={ROOT / '.gpu' / 'wheels'}", ".[cuda13-local]"]


def test_kernel_time_is_summed_by_name_in_both_trace_formats(tmp_path):
  import traces

  jax_trace = {"traceEvents": [
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}},
      {"ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 300, "name": "scatter"},
      {"ph": "X", "pid": 1, "tid": 3, "ts": 300, "dur": 100, "name": "gemm"},
      {"ph": "X", "pid": 1, "tid": 3, "ts": 1000, "dur": 300, "name": "scatter"},
      {"ph": "X", "pid": 1, "tid": 4, "ts": 1300, "dur": 50, "name": "MemcpyH2D"},
      {"ph": "X", "pid": 7, "tid": 9, "ts": 0, "dur": 5000, "name": "python work"}]}
  torch_trace = [{"ph": "X", "cat": "kernel", "ts": 0, "dur": 80, "name": "gemm"},
                 {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 900, "name": "aten::mm"},
                 {"ph": "X", "cat": "gpu_memcpy", "ts": 90, "dur": 10, "name": "Memcpy HtoD"}]
  (tmp_path / "jax.json").write_text(json.dumps(jax_trace))
  (tmp_path / "torch.json").write_text(json.dumps(torch_trace))
  j = traces.kernel_table(tmp_path / "jax.json", steps=2)
  assert j["kernels"] == [("scatter", 0.3, 600 / 700), ("gemm", 0.05, 100 / 700)]
  assert j["kernel_ms_per_step"] == 0.35 and j["copy_ms_per_step"] == 0.025
  assert j["idle_ms_per_step"] == 0.3  # 600 us between the kernels, over 2 steps
  t = traces.kernel_table(tmp_path / "torch.json", steps=1)
  assert t["kernels"] == [("gemm", 0.08, 1.0)] and t["copy_ms_per_step"] == 0.01
  assert "| `scatter` | 0.30 | 85.7% |" in traces.markdown({"jaxtrain": j, "nanoGPT": t})
