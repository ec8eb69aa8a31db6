"""benchmarks/cpu_matmul_routes.py and benchmarks/cpu_policy.py run end to end at tiny settings on
the CPU and record the machine, the load, and (cpu_policy) the CPU kind jaxtrain chose."""

import json

import pytest
from conftest import ROOT
from test_bench_cpu_vs_gpu import check_machine_and_load, run_benchmark

from jaxtrain.config import loading
from jaxtrain.core import cpu


@pytest.mark.slow
def test_cpu_matmul_routes_writes_a_row_per_route_with_its_library_and_load(tmp_path):
  run_benchmark("cpu_matmul_routes.py", "--shapes=3072x96x288", "--threads=1", "--frameworks=jax",
                "--rounds=1", "--round-s=0.01", f"--out={tmp_path}")
  report = json.loads((tmp_path / "cpu_matmul_routes.json").read_text())
  check_machine_and_load(report)
  routes = {r["route"]: r for r in report["rows"]}
  assert routes["jax float32: ynn off (Eigen)"]["library"] == "XLA dot (Eigen)"
  assert all(r["gflops"] > 0 and r["error"] < 1e-3 for r in report["rows"])
  assert "xla_cpu_use_xnnpack" in report["xla_cpu_flags"]
  assert (tmp_path / "cpu_matmul_routes.md").exists() and (tmp_path / "cpu_matmul_routes.png").exists()


@pytest.mark.slow
def test_cpu_policy_records_the_cpu_kind_and_each_variants_speed(tmp_path):
  run_benchmark("cpu_policy.py", "--cases=nano", "--rounds=1", "--round-s=0.05", "--runs=0",
                f"--out={tmp_path}", timeout=400)
  report = json.loads((tmp_path / "cpu_policy.json").read_text())
  check_machine_and_load(report)
  assert report["cpu_kind"]["name"] == cpu.cpu_kind().name
  variants = report["steps"]["nano"]["variants"]
  nano = cpu.step_flops(loading.load_config(str(ROOT / "configs" / "nano.py")))
  assert variants["f32 policy"]["options"] == \
      cpu.cpu_step_options(nano, devices=report["steps"]["nano"]["devices"])
  assert variants["f32 multi-threaded Eigen"]["options"]["xla_cpu_multi_thread_eigen"] is True
  assert all(v["tokens_per_s"] > 0 for v in variants.values())
