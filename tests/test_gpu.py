"""Tests that need an NVIDIA GPU (pytest marker `gpu`); anywhere else they are skipped, saying so.

On a GPU machine: `JAXTRAIN_TEST_GPU=1 python -m pytest -m gpu tests/test_gpu.py -s`
(JAXTRAIN_TEST_GPU=1 keeps tests/conftest.py from forcing JAX onto the CPU; -s shows the
measured numbers each test prints).
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import with_root_on_path
from flax import nnx

from jaxtrain.core import model as model_lib
from jaxtrain.core import steps

ROOT = Path(__file__).resolve().parents[1]
ON_GPU = jax.devices()[0].platform == "gpu"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not ON_GPU, reason=f"needs an NVIDIA GPU (JAX's default device is {jax.devices()[0].platform}); "
    "on a GPU machine run JAXTRAIN_TEST_GPU=1 python -m pytest -m gpu tests/test_gpu.py")]

# A whole run of 12 steps and one of 6 steps resumed to 12, then how far their params are apart.
_RESUME = """
import json, sys
import jax, numpy as np
from jaxtrain import train
from jaxtrain.checkpoints.load import load_state
from jaxtrain.testing import tiny_config

over, root = json.loads(sys.argv[1]), sys.argv[2]
def cfg(name, steps):
  return tiny_config(**{**over, "workdir": f"{root}/{name}", "train.max_steps": steps,
                        "headless": True, "sample.num_samples": 0, "train.checkpoint_every": 4,
                        "train.eval_every": 100, "train.log_every": 1, "optim.decay_steps": 12,
                        "train.grad_accum": 2})
train.run(cfg("whole", 12), show_progress=False)
train.run(cfg("legs", 6), show_progress=False)
train.run(cfg("legs", 12), show_progress=False)
a, b = (jax.device_get(load_state(f"{root}/{n}").arrays()) for n in ("whole", "legs"))
diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
losses = [r["loss"] for r in map(json.loads, open(f"{root}/whole/metrics.jsonl")) if "loss" in r]
print(json.dumps({"max_diff": diff, "losses": losses, "loss_scale": float(a["loss_scale"])}))
"""


def _resume(corpus_file, tmp_path, dtype: str, xla_flags: str = "", over: dict | None = None) -> dict:
  env = with_root_on_path(dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                                                    f"{xla_flags}".strip()))
  over = {"data.path": str(corpus_file), "model.dtype": dtype, **(over or {})}
  out = subprocess.run([sys.executable, "-c", _RESUME, json.dumps(over), str(tmp_path)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  r = json.loads(out.stdout.splitlines()[-1])
  print(dtype, xla_flags or "(default flags)", r)
  return r


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_steps_train_and_resume(corpus_file, tmp_path, dtype):
  r = _resume(corpus_file, tmp_path, dtype)
  assert all(np.isfinite(r["losses"])) and r["losses"][-1] < r["losses"][0] - 0.3
  if dtype == "float16":  # dynamic loss scaling is on, and no overflow drove it down to 1
    assert r["loss_scale"] > 1.0
  assert r["max_diff"] < 1e-2  # atomics may reorder float sums; the next test pins them


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_deterministic_gpu_ops_give_a_bit_exact_resume(corpus_file, tmp_path, dtype):
  r = _resume(corpus_file, tmp_path, dtype, over={"train.deterministic": True})
  assert r["max_diff"] == 0.0


def test_deterministic_xla_flag_gives_a_bit_exact_resume(corpus_file, tmp_path):
  r = _resume(corpus_file, tmp_path, "bfloat16", "--xla_gpu_deterministic_ops=true")
  assert r["max_diff"] == 0.0


# Init and one train step of a model with vocab 50304 in bf16, in a fresh process: the device's
# peak bytes in use against the estimate.
_PEAK = """
import json, sys
import jax
from jaxtrain.core import programs
from jaxtrain.measure import estimate
from jaxtrain.testing import random_batch, tiny_config

cfg = tiny_config(**json.loads(sys.argv[1]))
p = programs.build(cfg, cfg.model.vocab_size, jax.devices()[:1])
train = p.compile_train()
batch = p.place(random_batch(cfg, vocab_size=cfg.model.vocab_size))
state, metrics = train(p.init(), batch)
jax.block_until_ready(metrics)
measured = jax.devices()[0].memory_stats()["peak_bytes_in_use"]
est = estimate.memory_estimate(p.model_cfg, cfg.train.batch_size, cfg.train.grad_accum).total
print(json.dumps({"measured": measured, "estimate": est}))
"""


def _peak(**overrides) -> dict:
  base = {"model.n_layers": 8, "model.n_heads": 8, "model.d_model": 512, "model.seq_len": 1024,
          "model.vocab_size": 50304, "model.dtype": "bfloat16", "train.batch_size": 8}
  env = with_root_on_path(dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
  out = subprocess.run([sys.executable, "-c", _PEAK, json.dumps({**base, **overrides})], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  r = json.loads(out.stdout.splitlines()[-1])
  print(overrides or "(no remat)", {k: f"{v / 2**30:.2f} GiB" for k, v in r.items()})
  return r


def test_memory_estimate_against_the_measured_peak():
  """The estimate errs on the safe side and stays within 3x; remat, the chunked loss and the fused
  loss lower the measured peak, as the estimate says they do."""
  runs = {"none": _peak(), "full": _peak(**{"model.remat": "full"}),
          "chunk": _peak(**{"model.loss_chunk": 1024}), "fused": _peak(**{"model.fused_loss": True})}
  for name, r in runs.items():
    assert 0.9 * r["measured"] <= r["estimate"] <= 3 * r["measured"], (name, r)
  for name in ("full", "chunk", "fused"):
    assert runs[name]["measured"] < runs["none"]["measured"], name


def _loss_and_grads(c: model_lib.ModelConfig):
  graphdef, params = nnx.split(model_lib.GPT(c, nnx.Rngs(0)), nnx.Param)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (4, c.seq_len + 1), 0, c.vocab_size)
  return jax.jit(jax.value_and_grad(steps.loss_fn), static_argnums=1)(
      nnx.to_pure_dict(params), graphdef, tokens)


@pytest.mark.parametrize("kv_heads", [0, 2])
def test_cudnn_attention_matches_xla_attention(kv_heads):
  c = model_lib.ModelConfig(vocab_size=512, n_layers=2, n_heads=8, d_model=512, seq_len=256,
                            dtype="bfloat16", n_kv_heads=kv_heads, attention="xla")
  xla_loss, xla_grads = _loss_and_grads(c)
  cudnn_loss, cudnn_grads = _loss_and_grads(model_lib.ModelConfig(**{**c.__dict__, "attention": "cudnn"}))
  np.testing.assert_allclose(float(cudnn_loss), float(xla_loss), rtol=1e-2)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(cudnn_grads), jax.tree.leaves(xla_grads)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    rel = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)
    assert rel < 5e-2, (jax.tree_util.keystr(path), rel)
  assert float(jnp.abs(xla_loss - jnp.log(512.0))) < 0.5  # a fresh model: about uniform


def _median_s(f, *args, n: int = 10) -> float:
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def test_the_gpu_step_is_scatter_free_and_its_embedding_gradient_fast_for_any_ids():
  """The GPU's train step has no scatter left (programs.scatter_free); at GPT-2's shape (16 x 1024
  tokens, vocab 50304, width 768, bfloat16) the scan's gradient takes about as long whatever the
  ids, and less than the scatter's when every token is one id (the scatter's worst case)."""
  from jaxtrain.core import ops, programs
  from jaxtrain.testing import tiny_config
  built = programs.build(tiny_config(**{"model.dtype": "bfloat16"}), 256, jax.devices()[:1])
  assert built.model_cfg.scatter_free
  # An HLO scatter instruction, not the word: the test's own name is in the ops' metadata.
  assert not re.search(r"\bscatter\(", built.compile_train().as_text())
  n, vocab, width = 16 * 1024, 50304, 768
  g = jax.random.normal(jax.random.PRNGKey(0), (n, width), jnp.bfloat16)
  table = jnp.zeros((vocab, width))
  ids = {"equal": jnp.full((n,), 7, jnp.int32),
         "uniform": jax.random.randint(jax.random.PRNGKey(1), (n,), 0, vocab)}
  seconds = {}
  for grad in ops.EMBED_GRADS:
    lookup = lambda t, i, grad=grad: ops.embed(t, i, jnp.bfloat16, grad)
    f = jax.jit(lambda i, g, lookup=lookup: jax.vjp(lambda t: lookup(t, i), table)[1](g)[0])
    for kind, i in ids.items():
      seconds[grad, kind] = _median_s(f, i, g)
  print({f"{grad}/{kind}": f"{s * 1e3:.2f} ms" for (grad, kind), s in seconds.items()})
  assert seconds["scan", "equal"] < seconds["scatter", "equal"]
  assert max(seconds["scan", k] for k in ids) < 3 * min(seconds["scan", k] for k in ids)


def test_the_fused_cross_entropy_at_gpt2s_head_is_the_whole_one_in_less_memory():
  """GPT-2's head (16 x 1024 tokens, width 768, vocab 50304, bfloat16): the fused loss and its
  gradients agree with the whole (scatter-free) loss's to bfloat16's precision, and its compiled
  gradient holds at least a bfloat16 copy of the logits (1.65 GB) less; both times printed."""
  from jaxtrain.core import loss, ops
  n, width, vocab = 16 * 1024, 768, 50304
  x = jax.random.normal(jax.random.PRNGKey(0), (1, n, width), jnp.bfloat16)
  w = (0.05 * jax.random.normal(jax.random.PRNGKey(1), (width, vocab))).astype(jnp.bfloat16)
  targets = jax.random.randint(jax.random.PRNGKey(2), (1, n), 0, vocab)
  losses = {"whole": lambda x, w: loss.token_losses(ops.dense_f32(x, w), targets, True).mean(),
            "fused": lambda x, w: loss.fused_token_losses(x, w, targets)[0].mean()}
  runs = {}
  for name, f in losses.items():
    compiled = jax.jit(jax.value_and_grad(f, (0, 1))).lower(x, w).compile()
    runs[name] = (compiled.memory_analysis().temp_size_in_bytes, compiled(x, w), _median_s(compiled, x, w))
  print({k: f"{temp / 2**30:.2f} GiB temporary, {s * 1e3:.2f} ms" for k, (temp, _, s) in runs.items()})
  (whole_temp, (whole_loss, whole_grads), _), (fused_temp, (fused_loss, fused_grads), _) = runs.values()
  np.testing.assert_allclose(float(fused_loss), float(whole_loss), rtol=1e-3)
  for a, b in zip(fused_grads, whole_grads):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.linalg.norm(a - b) < 0.03 * np.linalg.norm(b)
  assert fused_temp <= whole_temp - n * vocab * 2, (fused_temp, whole_temp)


def test_gpu_steps_compile_with_jaxtrains_xla_options():
  """The GPU's train step gets core.programs.GPU_OPTIONS (less any XLA_FLAGS names) and compiles
  with them, fused loss on, as configs/gpt2_124m.py runs."""
  from jaxtrain.core import programs
  from jaxtrain.testing import tiny_config
  cfg = tiny_config(**{"model.dtype": "bfloat16", "model.fused_loss": True})
  built = programs.build(cfg, 256, jax.devices()[:1])
  expected = programs.step_options("gpu", 0, "bfloat16", False, os.environ.get("XLA_FLAGS", ""))
  assert expected.items() <= built.compiler_options.items()
  assert not re.search(r"\bscatter\(", built.compile_train().as_text())
