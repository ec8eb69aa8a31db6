"""benchmarks/jax_vs_torch.py runs end to end at a tiny shape and writes its report.

PyTorch is optional: without it, only the jaxtrain side is checked.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.slow
def test_tiny_benchmark_writes_json_markdown_and_chart(tmp_path):
  args = ["--shapes=tiny", "--steps=2", "--warmup=1", "--rounds=1", f"--out={tmp_path}",
          "--peak-size=256", "--peak-repeats=2"] + ([] if HAS_TORCH else ["--no-torch"])
  result = subprocess.run([sys.executable, "benchmarks/jax_vs_torch.py", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  assert "round 1/1 jax" in result.stdout

  report = json.loads((tmp_path / "jax_vs_torch.json").read_text())
  assert report["timestamp"] and report["machine"]["cores_available"] >= 1
  assert len(report["load"]["loadavg_before"]) == 3
  [res] = report["results"]
  assert res["shape"]["name"] == "tiny" and res["tokens_per_step"] == 4 * 16
  expected = {"jax", "torch"} if HAS_TORCH else {"jax"}
  assert set(res["frameworks"]) == expected
  for fw in res["frameworks"].values():
    assert len(fw["step_times_s"]) == 2 and fw["tokens_per_s"] > 0 and 0 < fw["mfu"] < 1
  jax_side = res["frameworks"]["jax"]  # what programs.build chose for this shape
  assert isinstance(jax_side["step_compiler_options"], dict)
  assert isinstance(jax_side["one_allreduce"], bool) and jax_side["cpu_devices"] >= 1
  if HAS_TORCH:
    assert res["frameworks"]["torch"]["param_count"] == res["param_count"]
    losses = [fw["rounds"][-1]["loss"] for fw in res["frameworks"].values()]
    assert abs(losses[0] - losses[1]) < 1e-3  # same params, same batches

  md = (tmp_path / "jax_vs_torch.md").read_text()
  assert "| tiny | jax |" in md and ("| tiny | torch |" in md) == HAS_TORCH
  assert (tmp_path / "jax_vs_torch.png").stat().st_size > 0
