"""The FLOP counts the trainer prints and benchmarks/quality.py budgets by, against XLA's own cost
analysis of the compiled programs.

XLA counts every operation (norms, softmax, activations, the cross-entropy, AdamW's and the
momentum's elementwise updates); the counts take matmuls only, as MFU does. So XLA's figure sits
a little above the count, never below it: the bounds below are one-sided, with room for that
elementwise work (~3% of the train step at these widths; for Muon's update alone ~2% in the
program jax emits, and ~5% once XLA's CPU fusions have rewritten it), and tight enough that a
missing term fails (attention is ~7% of the model's count here, one Newton-Schulz iteration 20%
or more of Muon's, the other side of a tall kernel 6x).
"""

import importlib.util
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from jaxtrain.core import model as model_lib
from jaxtrain.core import optim, programs
from jaxtrain.testing import random_batch, tiny_config

SHAPE = {"model.d_model": 128, "model.seq_len": 64, "train.batch_size": 4, "model.n_heads": 4}


def load_benchmark(script: str):
  spec = importlib.util.spec_from_file_location(script, ROOT / "benchmarks" / f"{script}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def xla_flops(jitted, *args) -> float:
  cost = jitted.lower(*args).compile().cost_analysis()
  return (cost[0] if isinstance(cost, list) else cost)["flops"]


def train_step_flops(cfg) -> tuple[float, programs.Programs]:
  built = programs.build(cfg, 256, jax.devices()[:1])
  return xla_flops(built.train_step, built.init(), random_batch(cfg)), built


@pytest.mark.slow
def test_model_flops_per_token_match_the_compiled_train_step():
  cfg = tiny_config(**SHAPE, **{"optim.name": "adamw"})
  measured, built = train_step_flops(cfg)
  counted = model_lib.flops_per_token(built.model_cfg) * cfg.train.batch_size * cfg.model.seq_len
  assert optim.flops_per_step(built.optimizer, built.abstract.params) == 0  # AdamW: no matmuls
  assert counted <= measured <= 1.05 * counted, (counted, measured)


def _optimizer(**kw) -> optim.Optimizer:
  base = dict(lr=1e-3, min_lr_ratio=0.1, warmup_steps=0, decay_steps=0, weight_decay=0.0,
              clip_norm=0.0, b1=0.9, b2=0.95, eps=1e-8, max_steps=100, name="muon")
  return optim.Optimizer(**{**base, **kw})


@pytest.mark.parametrize("ns_steps", [5, 3])
def test_muon_orthogonalization_flops_match_its_compiled_update(ns_steps):
  # A wide and a tall kernel: optax orthogonalizes the tall one on its side, so both cost
  # 4 m^2 n + 2 m^3 per iteration with m = 64 (the other side would give 6x as much).
  params = {"up": jnp.ones((64, 192)), "down": jnp.ones((192, 64)), "norm": jnp.ones((64,))}
  opt = _optimizer(muon_ns_steps=ns_steps)
  tx = opt.transformation()
  measured = xla_flops(jax.jit(lambda g, s, p: tx.update(g, s, p)[0]), params, tx.init(params),
                       params)
  counted = optim.flops_per_step(opt, params)
  assert counted == 2 * ns_steps * (4 * 64**2 * 192 + 2 * 64**3)
  assert optim.newton_schulz_flops((3, 64, 192), ns_steps) == 3 * counted // 2  # batch axes
  # The iterations run as a loop (optim.scale_by_muon), whose body XLA's cost analysis counts once.
  one = counted // ns_steps
  assert one <= measured <= 1.08 * one, (one, measured)


@pytest.mark.slow
def test_muon_train_step_costs_the_model_plus_the_counted_orthogonalization():
  adamw, _ = train_step_flops(tiny_config(**SHAPE, **{"optim.name": "adamw"}))
  muon, built = train_step_flops(tiny_config(**SHAPE, **{"optim.name": "muon"}))
  counted = optim.flops_per_step(built.optimizer, built.abstract.params)
  # XLA's cost analysis counts the Newton-Schulz loop's body once: one iteration of the count.
  np.testing.assert_allclose(muon - adamw, counted / built.optimizer.muon_ns_steps, rtol=0.03)



# configs/shakespeare_char.py (2 layers, ReLU^2 MLP 4x wide, untied head, width-4 convolutions,
# Muon) made tiny.
TINY = ["--config=configs/shakespeare_char.py", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.seq_len=32", "--config.train.batch_size=4",
        "--config.train.eval_every=5", "--config.train.eval_steps=2",
        "--config.optim.warmup_steps=1", "--config.optim.muon_ns_steps=3"]


def test_quality_counts_nanogpt_and_each_run_by_hand(corpus_file, tmp_path, monkeypatch):
  monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ on it
  quality = load_benchmark("quality")
  # nanoGPT's 4 x 128 GPT-2 layout, vocab 65, T 64: 6 x (12 D^2 per layer + the tied head) +
  # 12 x layers x T x D per token, 12 x 64 tokens a step, AdamW (no matmuls).
  nanogpt = load_benchmark("nanogpt_recipe").nanogpt_flops()
  assert nanogpt["model_flops_per_token"] == 6 * (4 * 12 * 128**2 + 65 * 128) + 12 * 4 * 64 * 128
  assert nanogpt["flops_per_step"] == nanogpt["model_flops_per_token"] * 12 * 64
  counted = quality.run_flops(TINY, str(corpus_file))
  vocab = len(set(corpus_file.read_text())) + 1  # the char tokenizer: the text's, and end-of-text
  D, T, L = 32, 32, 2
  # Two width-4 convolutions per layer: 2 x 4 x D multiply-adds a token, forward; 3x in training.
  conv = 3 * 2 * 2 * 4 * D * L
  assert counted["model_flops_per_token"] == 6 * (L * 12 * D**2 + vocab * D) + 12 * L * T * D + conv
  # Muon, 3 iterations of 4 m^2 n + 2 m^3 (m = 32) on qkv [32, 96], out [32, 32] and the MLP's
  # up [32, 128] and down [128, 32], in each layer.
  per_iteration = sum(4 * D * D * n + 2 * D**3 for n in (96, 32, 128, 128))
  assert counted["optimizer_flops_per_step"] == L * 3 * per_iteration
  assert counted["flops_per_step"] == counted["model_flops_per_token"] * 4 * T + L * 3 * per_iteration
  assert quality.steps_for_flops(counted, 10.5 * counted["flops_per_step"], TINY) == 10
  # An auto run is counted from the config it resolved and saved (its workdir's config.json).
  auto = [*TINY, "--config.model.size=auto", "--config.train.time_budget=1m"]
  assert quality.run_flops(auto, str(corpus_file)) is None
  saved = quality._config(TINY, str(corpus_file)).to_dict()
  (tmp_path / "config.json").write_text(json.dumps(saved))
  assert quality.saved_flops(tmp_path) == counted
  # Auto may choose another shape per seed: each run's TFLOPs and MFU are its own.
  wider = quality.run_flops([*TINY, "--config.model.d_model=64"], str(corpus_file))
  runs = [{"steps": 10, "tokens_per_sec": 1e4, "flops": f} for f in (counted, wider)]
  assert [quality._tflops(r, counted) for r in runs] == [10 * f["flops_per_step"] / 1e12
                                                          for f in (counted, wider)]
  rates = sorted(f["flops_per_step"] / f["tokens_per_step"] * 1e4 for f in (counted, wider))
  assert quality._mfu(runs, counted, peak=sum(rates) / 2) == "100%"  # the median of the two


@pytest.mark.slow
def test_quality_trains_each_run_to_its_flop_budget(corpus_file, tmp_path, monkeypatch):
  monkeypatch.setattr(sys, "path", list(sys.path))
  per_step = load_benchmark("quality").run_flops(TINY, str(corpus_file))["flops_per_step"]
  run = "tiny=" + " ".join(a.removeprefix("--config=") for a in TINY)
  subprocess.run([sys.executable, "benchmarks/quality.py", f"--data={corpus_file}", "--run", run,
                  f"--budget_flops={12.5 * per_step}", f"--out={tmp_path}"], cwd=ROOT,
                 check=True, capture_output=True, timeout=300)
  report = json.loads((tmp_path / "quality.json").read_text())
  (result,) = report["runs"]["tiny"]["results"]
  assert result["steps"] == 12 and report["flops"]["tiny"]["flops_per_step"] == per_step
  assert result["model"] == "2x32 char"
  assert [s for _, s, _ in result["evals"]] == [5, 10, 12]
  md = (tmp_path / "quality.md").read_text()
  assert "train TFLOPs" in md and f"{12 * per_step / 1e12:.2f}" in md
  peak, tokens_per_sec = report["matmul_peak_flops"], result["tokens_per_sec"]
  assert 1e8 < peak < 1e14 and f"{peak / 1e9:.1f} GFLOP/s" in md
  tokens_per_step = report["flops"]["tiny"]["tokens_per_step"]
  assert f"| {per_step / tokens_per_step * tokens_per_sec / peak:.0%} |" in md  # the MFU column
  assert (tmp_path / "quality.png").stat().st_size > 0
